"""The streaming source's executor read (spark_jobs/stream/hot.py) over a real `LocalBroker` whose
retention removed messages a batch still wanted: with failOnDataLoss (the default) the read fails
with an error naming the queue and the missing range; without, it skips them and reads the rest.
A batch planned past what the queue holds (a recreated topic) always fails. No Spark: the source's
plumbing around this read is covered by test_spark_stream.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from broker.client.api import TopicSpec
from broker.config import BrokerConfig
from broker.local import LocalBroker
from common.config import load_config
from common.errors import OffsetNotFound, PreconditionFailed
from common.model import MessageType
from spark_jobs.stream.hot import QueuePartition, read_range
from spark_jobs.stream.offsets import QueueKey
from spark_jobs.stream.options import StreamOptions
from tests.helpers.records import outgoing

TOPIC = "lossy"
SEGMENT_BYTES = 8192
OPTS = StreamOptions(namesrv=("127.0.0.1:1",), topics=frozenset({TOPIC}), read_rows=16)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, LocalBroker, int]]:
    """A broker whose queue 0 held 200 messages and whose retention deleted its oldest segments."""
    table = {
        "name": "broker-a",
        "data_dir": str(tmp_path / "b"),
        "store": {"commitlog": {"segment_bytes": SEGMENT_BYTES}},
    }
    config = load_config(BrokerConfig, section="broker", data={"broker": table})
    loop = asyncio.new_event_loop()
    local = LocalBroker(config)
    loop.run_until_complete(local.start())
    try:
        loop.run_until_complete(local.create_topic(TopicSpec(TOPIC, 1, frozenset({MessageType.NORMAL}))))
        for i in range(200):
            loop.run_until_complete(
                local.send(TOPIC, 0, [outgoing(body=f"m{i:04d}".encode() * 20, message_id=f"{i:032X}")])
            )
        assert local.store.wait_dispatched(10)
        assert local.store.run_retention(now_s=time.time() + 10 * 365 * 86400) > 0  # every sealed segment is old
        floor = local.store.queue_bounds(TOPIC, 0)[0]
        assert 0 < floor < 200
        yield loop, local, floor
    finally:
        loop.run_until_complete(local.close())
        loop.close()


def part(start: int, end: int) -> QueuePartition:
    return QueuePartition(QueueKey(TOPIC, "broker-a", 0), "sluice", "127.0.0.1:1", start, end)


def offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("queue_offset").to_pylist()]


def test_removed_messages_fail_the_read_naming_queue_and_range(
    broker: tuple[asyncio.AbstractEventLoop, LocalBroker, int],
) -> None:
    loop, local, floor = broker
    with pytest.raises(OffsetNotFound, match=rf"\[0, {floor}\) of {TOPIC} queue 0 on broker broker-a were removed"):
        list(read_range(loop, local, part(0, 200), OPTS))
    # A range that begins at the floor is no loss, and reads in bulk calls of readRows messages.
    assert offsets(list(read_range(loop, local, part(floor, 200), OPTS))) == list(range(floor, 200))


def test_without_fail_on_data_loss_the_rest_is_read(broker: tuple[asyncio.AbstractEventLoop, LocalBroker, int]) -> None:
    loop, local, floor = broker
    tolerant = dataclasses.replace(OPTS, fail_on_data_loss=False)
    assert offsets(list(read_range(loop, local, part(0, 200), tolerant))) == list(range(floor, 200))
    # A queue that appeared after the batch's start offsets is read from its oldest message: no loss.
    assert offsets(list(read_range(loop, local, dataclasses.replace(part(0, 200), fresh=True), OPTS))) == list(
        range(floor, 200)
    )


def test_a_batch_past_the_queue_end_fails(broker: tuple[asyncio.AbstractEventLoop, LocalBroker, int]) -> None:
    loop, local, floor = broker
    with pytest.raises(PreconditionFailed, match="deleted and recreated"):
        list(read_range(loop, local, part(floor, 250), dataclasses.replace(OPTS, fail_on_data_loss=False)))
