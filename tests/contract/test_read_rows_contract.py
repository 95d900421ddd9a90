"""`BrokerApi.read_rows` (the Spark streaming source's bulk read) and `QueueStatus.acked_offset`,
against `LocalBroker` and `RemoteBroker` alike (conftest.py).

The rows are the tiered archive's: the same schema (broker/tiering/format.SCHEMA) and the same
values the uploader writes for a (queue, offset); tests/integration/test_spark_stream.py compares
them with a tiered segment of the same messages.
"""

from __future__ import annotations

import pyarrow as pa

from broker.client.api import READ_ROWS_MAX_MESSAGES, BrokerApi
from broker.tiering.format import SCHEMA
from common.errors import BadRequest, TopicNotFound
from tests.contract.conftest import Scope
from tests.contract.test_broker_contract import expect_error, new_topic, out, wait_stored

BUDGET = 1 << 20


def decode(rows: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(rows)).read_all()


async def test_read_rows_returns_the_archive_rows_of_a_range(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    sent = [
        out(scope, f"body-{i}", tag=f"t{i % 3}", keys=(f"k{i}", "shared"), properties={"n": str(i)}) for i in range(40)
    ]
    results = await broker.send(topic, 1, sent)
    await wait_stored(broker, topic, {1: 40})

    got = await broker.read_rows(topic, 1, 0, 40, 1000, BUDGET)
    assert (got.count, got.next_offset, got.min_offset, got.max_offset) == (40, 40, 0, 40)
    table = decode(got.rows)
    assert table.schema.equals(SCHEMA)
    assert table["queue_offset"].to_pylist() == list(range(40))
    assert table["queue_id"].to_pylist() == [1] * 40
    assert table["body"].to_pylist() == [m.body for m in sent]
    assert table["message_id"].to_pylist() == [r.message_id for r in results]
    assert table["tag"].to_pylist() == [m.tag for m in sent]
    assert table["keys"].to_pylist() == [[f"k{i}", "shared"] for i in range(40)]
    assert [dict(p) for p in table["properties"].to_pylist()] == [{"n": str(i)} for i in range(40)]

    # a sub-range, and the count bound
    part = await broker.read_rows(topic, 1, 5, 8, 1000, BUDGET)
    assert (part.count, part.next_offset) == (3, 8)
    assert decode(part.rows)["queue_offset"].to_pylist() == [5, 6, 7]
    first = await broker.read_rows(topic, 1, 0, 40, 7, BUDGET)
    assert (first.count, first.next_offset) == (7, 7)
    # the byte bound still returns at least one row
    one = await broker.read_rows(topic, 1, 10, 40, READ_ROWS_MAX_MESSAGES, 1)
    assert (one.count, one.next_offset) == (1, 11)

    # nothing at or past the end, and nothing in an empty queue
    at_end = await broker.read_rows(topic, 1, 40, 100, 1000, BUDGET)
    assert (at_end.count, at_end.rows, at_end.next_offset, at_end.max_offset) == (0, b"", 40, 40)
    empty = await broker.read_rows(topic, 0, 0, 10, 1000, BUDGET)
    assert (empty.count, empty.next_offset, empty.max_offset) == (0, 0, 0)


async def test_acked_offset_is_the_end_of_a_standalone_queue(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    await broker.send(topic, 0, [out(scope, f"m{i}") for i in range(5)])
    await wait_stored(broker, topic, {0: 5})
    status = await broker.topic_status(topic)
    assert [(q.queue_id, q.max_offset, q.acked_offset) for q in status.queues] == [(0, 5, 5), (1, 0, 0)]


async def test_read_rows_rejects_bad_requests(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=1)
    with expect_error(TopicNotFound):
        await broker.read_rows(scope.topic(), 0, 0, 1, 10, BUDGET)
    for queue, start, end, count, size in [(1, 0, 1, 10, BUDGET), (-1, 0, 1, 10, BUDGET), (0, 5, 4, 10, BUDGET),
                                           (0, -1, 4, 10, BUDGET), (0, 0, 1, 0, BUDGET), (0, 0, 1, 10, 0)]:  # fmt: skip
        with expect_error(BadRequest):
            await broker.read_rows(topic, queue, start, end, count, size)
