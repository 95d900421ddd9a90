"""Deleting a topic on one broker (docs/operations.md, "Deleting a topic"): `TopicDeletion.delete`.

In order: the topic's definition goes, so nothing is sent to it or read from it any more; the
store appends its deletion record (broker/store/deletion.py), which ends its queues where they end
for every reader here, on the group's replicas and after any restart; then the consumer state that
names its old messages goes: the groups' pop entries below the queues' new floors and cursors at
or below them (found off the event loop, dropped a chunk per loop turn), committed offsets, lite
topics, half messages and pending timers stored before the record, the dedup memory; and the
topic's ConsumeQueue range is compacted. A topic of the same name is created only once all of it
is done (`finished`). Tiering's part is the broker's (`LocalBroker._deleted`, `delete_topic`).

A record the store could not write leaves the topic as it was (its definition is put back); one
written but not acknowledged by the in-sync replicas is finished here and the error raised.
"""

from __future__ import annotations

import asyncio
import logging

from broker.client.api import TopicSpec
from broker.consumer import PopEngine
from broker.dedup import Deduplicator
from broker.lite.service import LiteService, is_lite
from broker.metadata import Metadata
from broker.popstate import PopState
from broker.store.durability import Durability
from broker.store.store import MessageStore
from broker.timer.service import TimerService
from broker.transaction.service import TransactionService
from common.errors import SluiceError
from common.logs import kv

log = logging.getLogger("sluice.broker")

# Pop entries of a deleted topic forgotten per WriteBatch (and event-loop turn).
DROP_CHUNK = 512


class TopicDeletion:
    def __init__(
        self, *, store: MessageStore, metadata: Metadata, engine: PopEngine, pop_state: PopState, lite: LiteService,
        transactions: TransactionService, timers: TimerService, dedup: Deduplicator, durability: Durability,
    ) -> None:  # fmt: skip
        self._store = store
        self._metadata = metadata
        self._engine = engine
        self._pop_state = pop_state
        self._lite = lite
        self._transactions = transactions
        self._timers = timers
        self._dedup = dedup
        self._durability = durability
        self._under_way: dict[str, asyncio.Event] = {}  # topics being deleted -> set once done

    def under_way(self, name: str) -> bool:
        return name in self._under_way

    async def finished(self, name: str) -> None:
        """Wait for a deletion of `name` under way: a topic of that name is a new one only after it."""
        done = self._under_way.get(name)
        if done is not None:
            await done.wait()

    async def delete(self, name: str) -> None:
        """Delete the topic (TopicNotFound if there is none); returns once everything above is done."""
        spec = self._metadata.topic(name)
        done = self._under_way[name] = asyncio.Event()
        try:
            await self._delete(name, spec)
        finally:
            del self._under_way[name]
            done.set()

    async def _delete(self, name: str, spec: TopicSpec) -> None:
        store = self._store
        before = store.deleted_at(name)
        self._metadata.delete_topic(name)
        self._engine.delivered.pop(name, None)
        self._engine.levels.forget(None, name)
        unacknowledged: SluiceError | None = None
        try:
            position = (await store.delete_topic(name)).physical_offset
        except SluiceError as exc:
            position = store.deleted_at(name)
            if position == before:  # the record was not written: the topic is as it was
                self._metadata.put_topic(spec)
                raise
            unacknowledged = exc  # written and applied here, not (yet) held by the in-sync replicas
        loop = asyncio.get_running_loop()
        pop_state = self._pop_state
        groups = {*self._metadata.groups, *pop_state.groups_with_inflight()}
        if is_lite(spec):
            self._lite.drop_topic(name)
        floors = store.incarnation_floors(name)
        old = await loop.run_in_executor(None, pop_state.entries_below, name, groups, floors)
        in_flight = 0
        for at in range(0, len(old), DROP_CHUNK):  # pops and acks of other topics run in between
            in_flight += pop_state.drop_entries(name, old[at : at + DROP_CHUNK])
            await asyncio.sleep(0)
        pop_state.drop_cursors(name, groups, floors)
        await loop.run_in_executor(None, store.drop_offsets, name)
        half_messages = self._transactions.drop_topic(name, position)
        self._dedup.forget(name)
        timers = await self._timers.drop_topic(name, position)
        await loop.run_in_executor(None, store.compact_queues, name)
        log.info("topic deleted", extra=kv(topic=name, position=position, in_flight=in_flight, timers=timers,
                                           half_messages=half_messages))  # fmt: skip
        if unacknowledged is not None:
            raise unacknowledged
        if self._durability.replicated:
            await self._durability.wait_state()  # the in-sync replicas hold every state change above
