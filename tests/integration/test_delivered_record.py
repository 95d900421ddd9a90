"""A delivered message is the record the store read, decoded once (issue 31: decode once, at the
edge): `LocalBroker.pop` and `pull` hand out `StoredMessage`s over the very bytes the CommitLog
holds, which the internal stream carries unchanged; a record that names no store host is
delivered with the broker's address. (The wire half, RemoteBroker's decode of those bytes, is in
tests/unit/test_broker_convert.py; the contract suite runs pop and pull on both implementations.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import grpc_convert
from broker.client.api import ConsumeFrom, FilterSpec, GroupSpec, PopRequest, TopicSpec
from broker.config import BrokerConfig
from broker.local import LocalBroker
from common import record
from tests.helpers.records import outgoing

TOPIC = "delivered"
ADDRESS = "broker-host.example:10911"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_pop_and_pull_deliver_the_stored_bytes_and_fill_a_missing_store_host(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    broker = LocalBroker(BrokerConfig(name="b1", data_dir=tmp_path, advertise=ADDRESS))
    loop.run_until_complete(broker.start())

    async def run() -> None:
        await broker.create_topic(TopicSpec(TOPIC, 1))
        await broker.send(TOPIC, 0, [outgoing(b"sent", "M-SENT", tag="TagA", properties={"p": "1"})])
        hostless = record.MessageRecord(TOPIC, 0, b"stored", "M-HOSTLESS", born_host="10.0.0.1", store_host="")
        await broker.store.append([hostless])
        assert broker.store.wait_dispatched(10.0)
        await broker.create_group(GroupSpec("g", consume_from=ConsumeFrom.EARLIEST))
        popped = await broker.pop(PopRequest("g", TOPIC, queue_id=0, max_messages=8))
        pulled = (await broker.pull("g", TOPIC, 0, 0, 8, FilterSpec())).messages
        for got in (popped, pulled):
            assert [m.message_id for m in got] == ["M-SENT", "M-HOSTLESS"]
            assert [m.store_host for m in got] == [ADDRESS, ADDRESS]
            sent, stored = got
            assert (sent.tag, sent.properties, sent.body, stored.body) == ("TagA", {"p": "1"}, b"sent", b"stored")
            for m in got:  # the bytes the store read, as the internal stream carries them
                raw = m.record.raw
                assert grpc_convert.stored_to_pb(m).record == raw
                assert record.decode(raw).queue_offset == m.queue_offset
        assert all(m.receipt_handle and m.delivery_attempt == 1 for m in popped)
        wire = grpc_convert.stored_to_pb(popped[1])
        assert wire.store_host == ADDRESS and not grpc_convert.stored_to_pb(popped[0]).store_host

    try:
        loop.run_until_complete(asyncio.wait_for(run(), 30))
    finally:
        loop.run_until_complete(broker.close())
