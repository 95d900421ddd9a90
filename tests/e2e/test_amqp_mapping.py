"""AMQP and RocketMQ on one set of messages (docs/amqp.md, "Both protocols"): an exchange mapped to
a RocketMQ topic (`x-sluice-topic`) with pika on one side and the official RocketMQ Python client
on the other, in both topologies. Both directions, with the documented property mapping."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pytest
from rocketmq import FilterExpression

from tests.e2e.support.amqp import WAIT_S, connect, drain, endpoints
from tests.e2e.support.clients import message, producer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster


def _queue_empty_after(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, wait_s: float) -> bool:
    """Nothing more arrives in `queue` for `wait_s` (no second copy of what was drained)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        method, _, _ = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return False
        time.sleep(0.1)
    return True


def test_one_set_of_messages_both_protocols(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("orders"))
    group = cluster.create_group(unique("billing"))
    exchange = unique("orders-x")
    with (
        connect(endpoints(cluster)[0]) as conn,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as rocket,
        producer(cluster.endpoints, topic) as p,
    ):
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", arguments={"x-sluice-topic": topic})
        ch.exchange_declare(exchange, "topic")  # the application's own declare, unchanged: equivalent
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, exchange, routing_key="order.*")
        ch.confirm_delivery()

        # AMQP -> RocketMQ (and the AMQP queue, once)
        props = pika.BasicProperties(content_type="application/json", correlation_id="c-1", message_id="m-1",
                                     reply_to="replies", headers={"region": "eu", "n": 7}, delivery_mode=2)  # fmt: skip
        ch.basic_publish(exchange, "order.created", b'{"id": 1}', props)
        (got,) = receive_count(rocket, 1)
        assert (got.body, got.tag, list(got.keys)) == (b'{"id": 1}', "order.created", ["m-1"])
        for name, want in {"content-type": "application/json", "correlation-id": "c-1", "message-id": "m-1",
                           "reply-to": "replies", "region": "eu", "n": "7", "delivery-mode": "2"}.items():  # fmt: skip
            assert got.properties.get(name) == want, (name, got.properties)

        # RocketMQ -> AMQP: the routing key is AMQP_ROUTING_KEY when given, else the tag
        send_all(p, [
            message(topic, b"paid", tag="order.paid", keys=["k-2"],
                    properties={"content-type": "text/plain", "correlation-id": "c-2", "region": "us"}),
            message(topic, b"shipped", tag="ignored", properties={"AMQP_ROUTING_KEY": "order.shipped"}),
            message(topic, b"not bound", tag="invoice.sent"),
        ])  # fmt: skip
        got_amqp = drain(ch, queue, 3)
        by_body = {body: (method, pr) for method, pr, body in got_amqp}
        assert set(by_body) == {b'{"id": 1}', b"paid", b"shipped"}, sorted(by_body)
        method, pr = by_body[b'{"id": 1}']
        assert (method.exchange, method.routing_key, pr.headers) == (exchange, "order.created", {"region": "eu",
                                                                                                  "n": 7})  # fmt: skip
        method, pr = by_body[b"paid"]
        assert (method.exchange, method.routing_key) == (exchange, "order.paid")
        assert (pr.content_type, pr.correlation_id) == ("text/plain", "c-2")
        assert pr.headers == {"region": "us", "x-rocketmq-tag": "order.paid", "x-rocketmq-keys": "k-2"}
        assert pr.message_id and pr.timestamp
        assert by_body[b"shipped"][0].routing_key == "order.shipped"
        assert _queue_empty_after(ch, queue, 1.5)  # the AMQP publish reached the queue once, not again via the topic
        receive_count(rocket, 3)  # the RocketMQ side still reads its own sends


def test_mapping_errors(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("mapped"))
    with connect(endpoints(cluster)[0]) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.exchange_declare(unique("x"), "direct", arguments={"x-sluice-topic": unique("no-such-topic")})
        assert missing.value.reply_code == 404 and "no RocketMQ topic" in missing.value.reply_text
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as bad:
            ch.exchange_declare(unique("x"), "direct", arguments={"x-sluice-topic": "%DLQ%x"})
        assert bad.value.reply_code == 406
        ch = conn.channel()
        first = unique("x")
        ch.exchange_declare(first, "direct", arguments={"x-sluice-topic": topic})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as twice:
            ch.exchange_declare(unique("y"), "direct", arguments={"x-sluice-topic": topic})
        assert twice.value.reply_code == 406 and first in twice.value.reply_text
        ch = conn.channel()
        ch.exchange_delete(first)
        ch.exchange_declare(unique("z"), "direct", arguments={"x-sluice-topic": topic})  # free again


def test_mandatory_publish_to_a_mapped_exchange_without_queues_is_routed(
    cluster: Cluster, unique: Callable[[str], str]
) -> None:
    topic = cluster.create_topic(unique("events"))
    group = cluster.create_group(unique("g"))
    exchange = unique("events-x")
    with (
        connect(endpoints(cluster)[-1]) as conn,
        simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as rocket,
    ):
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", arguments={"x-sluice-topic": topic})
        ch.confirm_delivery()
        returned: list[bytes] = []
        ch.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))
        ch.basic_publish(exchange, "", b"to the topic only", mandatory=True)
        conn.process_data_events(time_limit=0.2)
        (got,) = receive_count(rocket, 1, timeout_s=WAIT_S)
    assert got.body == b"to the topic only" and not got.tag and not returned
