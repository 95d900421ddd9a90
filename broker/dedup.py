"""Idempotent sends: a message sent with `dedup` (`record.FLAG_DEDUP`) is stored at most once per (topic, message id)
within `[broker] dedup_window_s` on this broker (the Spark sink's deterministic ids make a
replayed batch a no-op; docs/spark.md).

A flagged message whose id was stored in the topic within the window is answered with where that
copy is (its queue and offset) and not stored again. The copies are found in the broker's own
message-id index (`MessageStore.find_by_id`, which survives a restart and is replicated), and in a
bounded memory of this process's recent dedup sends (a message stored a moment ago may not be
indexed yet). Sends of the same id at the same time are serialized, so two racing retries store
one copy. Sends without the flag never come here and cost nothing more.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from broker.client.api import SendResult
from broker.store.store import MessageStore
from common.clock import SYSTEM_CLOCK, Clock
from common.config import ConfigError
from common.errors import IllegalMessageId
from common.record import FLAG_DEDUP, MessageRecord

RECENT_MAX = 100_000  # recent dedup sends remembered in memory (the index covers the rest)

Key = tuple[str, str]  # (topic, message id)


class Deduplicator:
    def __init__(
        self, store: MessageStore, window_s: float, *, clock: Clock = SYSTEM_CLOCK,
        recent_max: int = RECENT_MAX,
    ) -> None:  # fmt: skip
        if window_s < 0:
            raise ConfigError(f"broker dedup_window_s must not be negative, got {window_s}")
        self._store = store
        self._window_ms = int(window_s * 1000)
        self._clock = clock
        self._recent: OrderedDict[Key, tuple[SendResult, int]] = OrderedDict()  # -> (result, stored ms)
        self._recent_max = recent_max
        self._inflight: dict[Key, asyncio.Future[None]] = {}
        self.dropped = 0  # repeats answered without storing, since start

    async def send(
        self, topic: str, messages: Sequence[MessageRecord],
        store: Callable[[list[MessageRecord]], Awaitable[list[SendResult]]],
    ) -> list[SendResult]:  # fmt: skip
        """Results of `messages` in order: a repeat's is its stored copy's, the others' come from `store`."""
        if self._window_ms == 0:
            return await store(list(messages))
        keys = [(topic, m.message_id) for m in messages]
        for m in messages:
            if m.flags & FLAG_DEDUP and not m.message_id:
                raise IllegalMessageId(f"a message sent to {topic} for deduplication needs a message id")
        flagged = {key for m, key in zip(messages, keys, strict=True) if m.flags & FLAG_DEDUP}
        while waiting := [self._inflight[k] for k in flagged if k in self._inflight]:
            await asyncio.gather(*waiting, return_exceptions=True)
        now_ms = self._clock.now_ms()
        results: list[SendResult | None] = [None] * len(messages)
        fresh: list[int] = []  # positions of the messages stored now
        first: dict[Key, int] = {}  # a flagged id stored now -> its position
        repeats: dict[int, int] = {}  # an id repeated within this send -> the position of its first copy
        for i, (m, key) in enumerate(zip(messages, keys, strict=True)):
            if m.flags & FLAG_DEDUP:
                results[i] = self._stored(key, now_ms)
                if results[i] is not None:
                    continue
                if key in first:
                    repeats[i] = first[key]
                    continue
                first[key] = i
            fresh.append(i)
        mine = {key: asyncio.get_running_loop().create_future() for key in first}
        self._inflight.update(mine)
        try:
            stored = await store([messages[i] for i in fresh]) if fresh else []
        finally:
            for key, fut in mine.items():
                del self._inflight[key]
                fut.set_result(None)
        for i, r in zip(fresh, stored, strict=True):
            results[i] = r
        for i, j in repeats.items():
            results[i] = results[j]
        for key, i in first.items():
            self._remember(key, results[i], now_ms)  # type: ignore[arg-type]
        self.dropped += len(messages) - len(fresh)
        return [r for r in results if r is not None]

    def _stored(self, key: Key, now_ms: int) -> SendResult | None:
        since = now_ms - self._window_ms
        hit = self._recent.get(key)
        if hit is not None and hit[1] >= since:
            return hit[0]
        topic, message_id = key
        copies = [r for r in self._store.find_by_id(message_id, topic) if r.store_timestamp_ms >= since]
        if not copies:
            return None
        r = min(copies, key=lambda c: c.store_timestamp_ms)
        return SendResult(message_id, r.queue_id, r.queue_offset)

    def forget(self, topic: str) -> None:
        """Forget the recent sends of a deleted topic (its index entries are left out by `find_by_id`)."""
        for key in [k for k in self._recent if k[0] == topic]:
            del self._recent[key]

    def _remember(self, key: Key, result: SendResult, now_ms: int) -> None:
        self._recent[key] = (result, now_ms)
        self._recent.move_to_end(key)
        while len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)
