"""Priority messages with the official Python client, in both topologies (docs/priority.md).

A backlog sent at mixed priorities is received most urgent first within each broker; a received
message carries its priority; conflicts (priority with a message group, or a priority outside the
topic's range) are refused with clear codes even when the client does not check.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rocketmq.grpc_protocol import MessageType
from rocketmq.v5.model import FilterExpression

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, receive_count, simple_consumer
from tests.e2e.support.cluster import Cluster


def test_backlog_is_received_highest_priority_first_per_broker(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = unique("t")
    cluster.admin("topic", "create", topic, "--type", "priority", "--max-priority", "5", "--queues", "2")
    group = cluster.create_group(unique("g"), consume_from="earliest")
    sent = [(i, i % 6) for i in range(30)]  # (index, priority)
    with producer(cluster.endpoints, topic) as p:
        for i, level in sent:
            msg = message(topic, f"m{i}".encode())
            msg.priority = level
            p.send(msg)
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as c:
        got = receive_count(c, len(sent), max_messages=32)
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i, _ in sent)
    assert {m.message_type for m in got} == {MessageType.PRIORITY}
    by_broker: dict[str, list[int]] = {}
    for m in got:
        assert m.priority == int(m.body[1:]) % 6, "a received message carries its priority"
        by_broker.setdefault(m.receipt_handle.split("~", 1)[0], []).append(m.priority)  # handles name their broker
    # Within one receive order is strict; the whole backlog was stored before the first receive,
    # so each broker handed out its levels in order.
    for levels in by_broker.values():
        assert levels == sorted(levels, reverse=True), levels


def test_priority_conflicts_and_range_are_refused(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = unique("t")
    cluster.admin("topic", "create", topic, "--type", "priority", "--max-priority", "3", "--queues", "2")
    normal = cluster.create_topic(unique("n"))
    with raw.stub(cluster.first_proxy) as stub:

        def send(msg: raw.pb.Message) -> tuple[str, str]:
            response = raw.send(stub, msg)
            return raw.code_name(response.status.code), response.status.message

        out_of_range = raw.message(topic, b"x", message_type=raw.pb.PRIORITY)
        out_of_range.system_properties.priority = 4
        code, text = send(out_of_range)
        assert code == "BAD_REQUEST" and "out of range" in text and "0..3" in text
        with_group = raw.message(topic, b"x", message_type=raw.pb.FIFO)
        with_group.system_properties.message_group = "g1"
        with_group.system_properties.priority = 1
        assert send(with_group)[0] == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        typed_priority_with_group = raw.message(topic, b"x", message_type=raw.pb.PRIORITY)
        typed_priority_with_group.system_properties.priority = 1
        typed_priority_with_group.system_properties.message_group = "g1"
        assert send(typed_priority_with_group)[0] == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        to_normal = raw.message(normal, b"x", message_type=raw.pb.PRIORITY)
        to_normal.system_properties.priority = 1
        assert send(to_normal)[0] == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        missing = raw.message(topic, b"x", message_type=raw.pb.PRIORITY)
        assert send(missing)[0] == "BAD_REQUEST"
    described = cluster.admin("topic", "describe", topic)
    assert all(row["messages"] == 0 for row in described), "nothing refused was stored"


def test_client_side_conflict_is_caught_by_the_client(cluster: Cluster, unique: Callable[[str], str]) -> None:
    msg = message(unique("t"), b"x")
    msg.priority = 2
    with pytest.raises(Exception, match="priority"):
        msg.message_group = "g"
