"""The read paths of one broker that do not go through a consumer group's pop state: pull, offset
queries, lookups by id and key, and a message's trace. Each reads the local store first and falls
through to tiered storage (when configured) below the local copy of a queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from broker.client.api import (
    READ_ROWS_MAX_BYTES,
    READ_ROWS_MAX_MESSAGES,
    OffsetPolicy,
    PullResult,
    QueueRows,
    StoredMessage,
    TraceEvent,
    TraceKind,
)
from broker.config import PopConfig
from broker.filter import MessageFilter
from broker.longpoll import LongPollHub, topic_key
from broker.store.store import MessageStore, ReadStatus
from broker.tiering.runtime import BrokerTiering
from broker.trace import TraceRecorder
from common.model import DLQ_PREFIX
from common.record import MessageRecord


class Reader:
    def __init__(
        self, store: MessageStore, hub: LongPollHub, tiering: BrokerTiering | None, trace: TraceRecorder,
        pop: PopConfig, store_host: str = "",
    ) -> None:  # fmt: skip
        """`store_host`: this broker's address, read as the store host of a record that names none."""
        self._store = store
        self._host = store_host
        self._hub = hub
        self._tiering = tiering
        self._trace = trace
        self._pop = pop

    def _floor(self, topic: str, queue_id: int, local_low: int) -> int:
        tiering = self._tiering
        return local_low if tiering is None else tiering.floor(topic, queue_id, local_low)

    async def pull(
        self, topic: str, queue_id: int, offset: int, max_messages: int, filt: MessageFilter, long_poll_ms: int
    ) -> PullResult:
        """Messages of one queue from `offset` that match `filt`, waiting up to `long_poll_ms` for one."""
        deadline = time.monotonic() + min(long_poll_ms, self._pop.max_long_poll_ms) / 1000.0
        n = min(max_messages, self._pop.max_batch_messages)
        while True:
            snapshot = self._hub.snapshot((topic_key(topic),))
            res = self._store.read(topic, queue_id, offset, max_messages=n, tag_hashes=filt.tag_hashes)
            if res.status is ReadStatus.OFFSET_TOO_SMALL:
                cold = await self._pull_cold(topic, queue_id, offset, n, res.min_offset, res.max_offset)
                if cold is not None:
                    kept = [m for m in cold.messages if filt.matches(m.tag, m.properties)]
                    return PullResult(kept, cold.next_offset, cold.min_offset, cold.max_offset)
            msgs = [self._stored(r) for r in res.messages if filt.matches(r.tag, r.properties)]
            next_offset = res.next_offset
            if res.status is ReadStatus.OFFSET_OVERFLOW:
                next_offset = res.max_offset
            remaining = deadline - time.monotonic()
            if msgs or res.status in (ReadStatus.OFFSET_TOO_SMALL, ReadStatus.OFFSET_OVERFLOW) or remaining <= 0:
                return PullResult(msgs, next_offset, res.min_offset, res.max_offset)
            if res.status is ReadStatus.NO_MATCH:
                offset = next_offset
                continue
            await self._hub.wait(snapshot, remaining)

    async def _pull_cold(
        self, topic: str, queue_id: int, offset: int, n: int, local_low: int, high: int
    ) -> PullResult | None:
        """Messages below the local copy read from the bucket (unfiltered), or None if it holds none there."""
        tiering = self._tiering
        if tiering is None or not tiering.covers(topic, queue_id, offset, local_low):
            return None
        recs = await tiering.read(topic, queue_id, offset, n)
        if not recs:
            return None
        msgs = [self._stored(r) for r in recs]
        return PullResult(msgs, recs[-1].queue_offset + 1, tiering.floor(topic, queue_id, local_low), high)

    def _stored(self, rec: MessageRecord) -> StoredMessage:
        return StoredMessage(rec, 1, store_host=self._host)

    async def read_rows(
        self, topic: str, queue_id: int, offset: int, end_offset: int, max_messages: int, max_bytes: int
    ) -> QueueRows:
        """[offset, end_offset) of a queue as tiered-archive rows, from local disk or the bucket, stopping
        at the budget (at least one row) or where the offsets stop being consecutive (a retention gap:
        the caller sees `min_offset` past its offset on its next call)."""
        n = min(max_messages, READ_ROWS_MAX_MESSAGES)
        budget = min(max_bytes, READ_ROWS_MAX_BYTES)
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(
            None, lambda: self._store.read(topic, queue_id, offset, max_messages=n, max_bytes=budget)
        )
        floor = self._floor(topic, queue_id, res.min_offset)
        records: Sequence[MessageRecord] = res.messages
        tiering = self._tiering
        cold = res.status is ReadStatus.OFFSET_TOO_SMALL and tiering is not None
        if cold and tiering is not None and tiering.covers(topic, queue_id, offset, res.min_offset, exact=True):
            records = await tiering.read(topic, queue_id, offset, n)
        run = _consecutive(records, offset, end_offset, budget)
        if not run:
            return QueueRows(b"", 0, offset, floor, res.max_offset)
        rows = await loop.run_in_executor(None, _ipc_rows, run)
        return QueueRows(rows, len(run), offset + len(run), floor, res.max_offset)

    async def query_offset(self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0) -> int:
        low, high = self._store.queue_bounds(topic, queue_id)
        if policy is OffsetPolicy.BEGINNING:
            return self._floor(topic, queue_id, low)
        if policy is OffsetPolicy.END:
            return high
        local = self._store.offset_for_timestamp(topic, queue_id, timestamp_ms)
        tiering = self._tiering
        if local == low and tiering is not None and tiering.covers(topic, queue_id, 0, low):
            cold = await tiering.offset_for_timestamp(topic, queue_id, timestamp_ms)
            if cold is not None:
                return min(cold, low)
        return local

    async def get_message(self, topic: str, message_id: str) -> list[StoredMessage]:
        found = self._store.find_by_id(message_id, topic)
        tiering = self._tiering
        if not found and tiering is not None:
            found = await tiering.find_by_id(topic, message_id)
        return [self._stored(r) for r in found]

    async def find_messages_by_key(self, topic: str, key: str, limit: int = 64) -> list[StoredMessage]:
        limit = min(max(limit, 1), 1000)
        found = self._store.find_by_key(topic, key, limit)
        tiering = self._tiering
        if len(found) < limit and tiering is not None:
            seen = {(r.queue_id, r.queue_offset) for r in found}
            cold = await tiering.find_by_key(topic, key, limit)
            found += [r for r in cold if (r.queue_id, r.queue_offset) not in seen][: limit - len(found)]
            found.sort(key=lambda r: (r.queue_id, r.queue_offset))
        return [self._stored(r) for r in found]

    async def message_trace(self, message_id: str) -> list[TraceEvent]:
        trace, store = self._trace, self._store
        return await asyncio.get_running_loop().run_in_executor(None, _lookup_trace, trace, store, message_id)


def _lookup_trace(trace: TraceRecorder, store: MessageStore, message_id: str) -> list[TraceEvent]:
    """The trace of a message: where the store holds it (message-id index) and the events at each copy."""
    events: list[TraceEvent] = []
    for rec in store.find_by_id(message_id):
        found = trace.position_events(rec.topic, rec.queue_id, rec.queue_offset, message_id, rec.physical_offset)
        if not rec.topic.startswith(DLQ_PREFIX) and not any(e.kind is TraceKind.SENT for e in found):
            # Stored while tracing was off (or its event expired): the store still knows when and from where.
            detail = {"host": rec.born_host, "source": "store"}
            found.append(TraceEvent(TraceKind.SENT, rec.store_timestamp_ms, rec.topic, rec.queue_id, rec.queue_offset,
                                    message_id=message_id, detail=detail))  # fmt: skip
        events.extend(found)
    return sorted(events, key=lambda e: e.time_ms)


def _consecutive(records: Sequence[MessageRecord], offset: int, end: int, budget: int) -> list[MessageRecord]:
    """The records at offset, offset + 1, ... below `end`, within about `budget` bytes (at least one)."""
    run: list[MessageRecord] = []
    used = 0
    for r in records:
        if r.queue_offset != offset + len(run) or r.queue_offset >= end or (run and used + r.size > budget):
            break
        run.append(r)
        used += r.size
    return run


def _ipc_rows(records: list[MessageRecord]) -> bytes:
    """Records as an Arrow IPC stream of tiered-segment rows (the same conversion the uploader uses).
    pyarrow is imported here, by the first such read: most brokers never serve one."""
    import pyarrow as pa

    from broker.tiering.segment import records_to_table

    table = records_to_table(records)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())
