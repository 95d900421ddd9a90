"""`LocalBroker` hands its clock (common/clock.py) to retention and the dedup window: a test jumps
the clock (tests/helpers/clock.py) past an hour instead of waiting for it. The contract suite covers
the other readers (invisibility, retry delays, DELAY timers, check-backs, lite expiry, client
reports) on both implementations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from broker.client.api import TopicSpec
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.store.config import MIN_SEGMENT_BYTES, CommitLogConfig, RetentionConfig, StoreConfig
from tests.helpers.clock import JumpClock
from tests.helpers.records import outgoing

HOUR_S = 3600.0
TOPIC = "clocked"
WAIT_S = 10.0


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def start(loop: asyncio.AbstractEventLoop, data_dir: Path, clock: JumpClock) -> LocalBroker:
    config = BrokerConfig(
        name="clock-broker", data_dir=data_dir, dedup_window_s=HOUR_S,
        store=StoreConfig(
            commitlog=CommitLogConfig(segment_bytes=MIN_SEGMENT_BYTES),
            retention=RetentionConfig(max_age_s=HOUR_S, max_disk_used_ratio=1.0, check_interval_s=0.05),
        ),
    )  # fmt: skip
    broker = LocalBroker(config, clock=clock)
    loop.run_until_complete(broker.start())
    loop.run_until_complete(broker.create_topic(TopicSpec(TOPIC, 1)))
    return broker


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.05)


def test_retention_ages_segments_on_the_broker_clock(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    clock = JumpClock()
    broker = start(loop, tmp_path / "broker", clock)

    async def min_offset() -> int:
        return (await broker.topic_status(TOPIC)).queues[0].min_offset

    async def run() -> None:
        for i in range(40):  # ~1 KiB each: about ten 4 KiB segments
            await broker.send(TOPIC, 0, [outgoing(body=bytes(1000), message_id=f"M{i}")])
        assert broker.store.wait_dispatched(WAIT_S)
        await asyncio.sleep(0.3)  # several retention checks: nothing is an hour old yet
        assert await min_offset() == 0
        clock.advance(2 * HOUR_S)

        async def trimmed() -> bool:
            return await min_offset() > 0

        await eventually(trimmed, "the sealed segments deleted once they are two hours old")
        status = (await broker.topic_status(TOPIC)).queues[0]
        assert 0 < status.min_offset < status.max_offset == 40, "the active segment stays"

    try:
        loop.run_until_complete(asyncio.wait_for(run(), 3 * WAIT_S))
    finally:
        loop.run_until_complete(broker.close())


def test_the_dedup_window_ends_on_the_broker_clock(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    clock = JumpClock()
    broker = start(loop, tmp_path / "broker", clock)

    async def send() -> int:
        [res] = await broker.send(TOPIC, 0, [outgoing(body=b"once", message_id="D" * 32, dedup=True)])
        return res.queue_offset

    async def run() -> None:
        first = await send()
        assert await send() == first, "a repeat within the window is not stored"
        clock.advance(HOUR_S + 1)
        assert await send() == first + 1, "past the window: stored again"

    try:
        loop.run_until_complete(asyncio.wait_for(run(), 3 * WAIT_S))
    finally:
        loop.run_until_complete(broker.close())
