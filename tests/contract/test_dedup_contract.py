"""Sends flagged `dedup` (the Spark sink's): a message id this broker stored in the topic within
`dedup_window_s` is answered with its stored copy, not stored again; against `LocalBroker` and
`RemoteBroker` alike (conftest.py), so the flag crosses the internal service."""

from __future__ import annotations

from broker.client.api import BrokerApi
from common.errors import IllegalMessageId
from tests.contract.conftest import Scope
from tests.contract.test_broker_contract import expect_error, new_topic, out, wait_stored
from tests.helpers.records import outgoing


async def test_a_repeated_id_is_stored_once(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    a, b = out(scope, "a", dedup=True), out(scope, "b", dedup=True)
    [first] = await broker.send(topic, 0, [a])
    assert (first.queue_id, first.queue_offset) == (0, 0)
    await wait_stored(broker, topic, {0: 1})
    # the same id again, to either queue, alone or in a batch with repeats of its own
    assert await broker.send(topic, 0, [a]) == [first]
    again = await broker.send(topic, 1, [outgoing(b"other body", a.message_id, dedup=True), b, b])
    assert again[0] == first and again[1] == again[2] and (again[1].queue_id, again[1].queue_offset) == (1, 0)
    await wait_stored(broker, topic, {1: 1})
    status = await broker.topic_status(topic)
    assert [q.max_offset for q in status.queues] == [1, 1]

    # without the flag every copy is stored; another topic has ids of its own
    [plain] = await broker.send(topic, 0, [outgoing(b"a", a.message_id)])
    assert plain.queue_offset == 1
    other = await new_topic(broker, scope)
    [elsewhere] = await broker.send(other, 0, [a])
    assert (elsewhere.queue_id, elsewhere.queue_offset) == (0, 0)


async def test_dedup_needs_a_message_id(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    with expect_error(IllegalMessageId):
        await broker.send(topic, 0, [outgoing(b"x", "", dedup=True)])
