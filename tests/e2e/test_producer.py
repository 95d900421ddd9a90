"""Producer: what the official Python client sends arrives intact, and what must fail does, with the
client's own exception. Every test runs against the merged and the separated topology."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rocketmq.grpc_protocol import MessageType
from rocketmq.v5.exception import IllegalArgumentException, PayloadTooLargeException

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, producer_and_consumer, receive_count, send_all
from tests.e2e.support.cluster import Cluster


def test_normal_messages_keep_tag_keys_and_properties(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    sent = {}
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        for i in range(6):
            msg = message(topic, f"body-{i}".encode(), tag=f"Tag{i % 2}", keys=[f"key-{i}", "shared-key"],
                          properties={"index": str(i), "origin": "e2e"})  # fmt: skip
            receipt = p.send(msg)
            assert receipt.message_id
            sent[receipt.message_id] = i
        got = receive_count(c, len(sent))
    raw.assert_drained(cluster.first_proxy, cluster.brokers, topic, group)
    assert sorted(m.message_id for m in got) == sorted(sent)
    for m in got:
        i = sent[m.message_id]
        assert m.topic == topic
        assert m.body == f"body-{i}".encode()
        assert m.tag == f"Tag{i % 2}"
        assert m.keys == {f"key-{i}", "shared-key"}
        assert m.properties == {"index": str(i), "origin": "e2e"}
        assert m.message_type == MessageType.NORMAL
        assert m.delivery_attempt == 1
        assert not m.corrupted


def test_fifo_messages_carry_their_message_group(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"), "fifo")
    group = cluster.create_group(unique("g"), fifo=True)
    order = [(g, n) for n in range(3) for g in ("ga", "gb", "gc")]
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        ids = send_all(p, [message(topic, f"{g}:{n}".encode(), group=g) for g, n in order])
        got = receive_count(c, len(ids))
    assert sorted(m.message_id for m in got) == sorted(ids)
    for m in got:
        assert m.message_type == MessageType.FIFO
        assert m.message_group == m.body.decode().split(":")[0]


def test_body_at_the_advertised_limit_passes_and_one_byte_more_fails(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("t"), queues=2)
    group = cluster.create_group(unique("g"))
    limit = raw.advertised_settings(cluster.first_proxy, topic).publishing.max_body_size
    assert 0 < limit <= 4 * 1024 * 1024  # the broker's own limit is 4 MiB
    body = bytes(range(256)) * (limit // 256) + b"x" * (limit % 256)
    assert len(body) == limit
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        message_id = p.send(message(topic, body)).message_id
        # Over the limit: the client refuses locally once it has the settings; before that, the
        # server refuses with MESSAGE_BODY_TOO_LARGE. Either way the caller gets an exception.
        with pytest.raises((IllegalArgumentException, PayloadTooLargeException)):
            p.send(message(topic, body + b"!"))
        (got,) = receive_count(c, 1)
    assert got.message_id == message_id
    assert got.body == body
    assert not got.corrupted


def test_send_to_a_topic_that_does_not_exist_raises(cluster: Cluster, unique: Callable[[str], str]) -> None:
    missing = unique("missing")
    with raw.stub(cluster.first_proxy) as s:
        route = raw.query_route(s, missing)
    assert raw.code_name(route.status.code) == "TOPIC_NOT_FOUND"
    with producer(cluster.endpoints) as p, pytest.raises(Exception, match=missing):
        p.send(message(missing, b"nobody home"))


def test_fifo_message_to_a_normal_topic_raises(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    with producer(cluster.endpoints, topic) as p:
        with pytest.raises(IllegalArgumentException, match="message type"):
            p.send(message(topic, b"ordered", group="g1"))
        assert p.send(message(topic, b"plain")).message_id  # the producer is still usable
