"""`Deduplicator` (broker/dedup.py) over a real `MessageStore`: the window is configurable and ends,
the message-id index finds copies after a restart (no memory of recent sends), and racing sends of
one id store one copy."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.client.api import SendResult
from broker.dedup import Deduplicator
from broker.store.config import StoreConfig
from broker.store.store import MessageStore
from common import record
from common.config import ConfigError
from common.record import MessageRecord, received
from tests.helpers.clock import JumpClock

TOPIC = "sink"


def flagged(message_id: str) -> MessageRecord:
    return received([record.outgoing(body=b"x", message_id=message_id, dedup=True)], TOPIC, 0, "host:1")[0]


def storer(store: MessageStore, stored: list[str]) -> Callable[[list[MessageRecord]], Awaitable[list[SendResult]]]:
    async def store_fn(messages: list[MessageRecord]) -> list[SendResult]:
        await asyncio.sleep(0.01)  # let a racing send start meanwhile
        results = await store.append(messages)
        stored.extend(m.message_id for m in messages)
        return [SendResult(m.message_id, 0, r.queue_offset) for m, r in zip(messages, results, strict=True)]

    return store_fn


def test_the_window_ends_and_survives_a_restart(tmp_path: Path) -> None:
    async def run() -> None:
        store = MessageStore(tmp_path / "s", StoreConfig())
        stored: list[str] = []
        try:
            clock = JumpClock()
            dedup = Deduplicator(store, 60.0, clock=clock)
            first = await dedup.send(TOPIC, [flagged("A" * 32)], storer(store, stored))
            assert store.wait_dispatched(10)
            # a fresh deduplicator (as after a restart) finds the copy in the index
            again = Deduplicator(store, 60.0, clock=clock)
            assert await again.send(TOPIC, [flagged("A" * 32)], storer(store, stored)) == first
            assert again.dropped == 1
            clock.advance(61)  # past the window: stored again
            later = await again.send(TOPIC, [flagged("A" * 32)], storer(store, stored))
            assert later[0].queue_offset == 1 and stored == ["A" * 32, "A" * 32]
            # racing sends of one id store one copy
            racing = await asyncio.gather(*(again.send(TOPIC, [flagged("B" * 32)], storer(store, stored))
                                             for _ in range(5)))  # fmt: skip
            assert len({r[0] for r in racing}) == 1 and stored.count("B" * 32) == 1
            # a window of 0 stores every copy
            off = Deduplicator(store, 0.0, clock=clock)
            await off.send(TOPIC, [flagged("B" * 32)], storer(store, stored))
            assert stored.count("B" * 32) == 2
        finally:
            store.close()

    asyncio.run(run())


def test_a_negative_window_is_refused(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "s", StoreConfig())
    try:
        with pytest.raises(ConfigError, match="dedup_window_s"):
            Deduplicator(store, -1.0)
    finally:
        store.close()
