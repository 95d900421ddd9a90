"""One set of messages for MQTT, RocketMQ and AMQP (docs/mqtt.md, "Mapping"), on both shared
topologies: what an MQTT client publishes to `T/a/b` is the lite topic `T/a/b` of the LITE bind topic
`T`, which the official client's LiteSimpleConsumer receives (MQTT 5 properties as the user
properties RocketMQ readers see); what the official producer sends to that lite topic reaches the
MQTT subscribers whose filters match it (tag and keys as user properties); and an AMQP exchange
mapped to `T` (`x-sluice-topic`) stores a publish with routing key `T.a.b` in that lite topic, and
carries what MQTT publishes there to the queues bound to it."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.support.amqp import connect, drain, endpoints
from tests.e2e.support.clients import producer, receive_until
from tests.e2e.support.cluster import Cluster
from tests.e2e.support.mqtt import Paho
from tests.e2e.test_lite_topics import create_lite_topic, lite_consumer, lite_message, lite_topic_of

pytestmark = pytest.mark.timeout(120)
WAIT_S = 30.0


def test_mqtt_publishes_reach_rocketmq_lite_consumers(cluster: Cluster, unique: Callable[[str], str]) -> None:
    bind = create_lite_topic(cluster, unique("t").replace("-", "_"))
    group = cluster.create_group(unique("g"))
    consumer = lite_consumer(cluster, bind, group)
    pub = Paho(cluster.mqtt[0])
    try:
        consumer.subscribe_lite(f"{bind}/dev/1")
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "text/plain"
        props.ResponseTopic = f"{bind}/replies"
        props.UserProperty = [("site", "north")]
        for i in range(3):
            pub.publish(f"{bind}/dev/1", f"reading {i}", 1, props=props)
        pub.publish(f"{bind}/dev/2", "not subscribed", 1)
        got = receive_until(consumer, lambda g: len(g) >= 3, timeout_s=WAIT_S)  # type: ignore[arg-type]
        assert [m.body.decode() for m in got] == [f"reading {i}" for i in range(3)]
        first = got[0]
        assert lite_topic_of(first) == f"{bind}/dev/1"
        assert first.properties["content-type"] == "text/plain"
        assert first.properties["reply-to"] == f"{bind}/replies"
        assert first.properties["site"] == "north"
    finally:
        pub.disconnect()
        consumer.shutdown()


def test_rocketmq_lite_sends_reach_mqtt_subscribers(cluster: Cluster, unique: Callable[[str], str]) -> None:
    bind = create_lite_topic(cluster, unique("t").replace("-", "_"))
    sub = Paho(cluster.mqtt[-1], version=5)
    try:
        sub.subscribe(f"{bind}/room/+", 1)
        with producer(cluster.endpoints, bind) as p:
            msg = lite_message(bind, f"{bind}/room/7", b"from rocketmq")
            msg.tag = "alarm"
            msg.add_property("level", "high")
            p.send(msg)
            p.send(lite_message(bind, f"{bind}/other/7", b"unmatched"))
        got = sub.get(WAIT_S)
        assert (got.topic, got.payload, got.qos) == (f"{bind}/room/7", b"from rocketmq", 1)
        users = {k: v for k, v in got.props["UserProperty"]}
        assert users["level"] == "high" and users["x-rocketmq-tag"] == "alarm"
        assert sub.quiet(1.0) == []
    finally:
        sub.disconnect()


def test_amqp_exchange_mapped_to_a_bind_topic(cluster: Cluster, unique: Callable[[str], str]) -> None:
    bind = create_lite_topic(cluster, unique("t").replace("-", "_"))
    exchange = unique("x")
    sub = Paho(cluster.mqtt[-1], version=5)
    pub = Paho(cluster.mqtt[0], version=5)
    try:
        sub.subscribe(f"{bind}/sensor/+", 1)
        with connect(endpoints(cluster)[0]) as conn:
            ch = conn.channel()
            ch.exchange_declare(exchange, "topic", arguments={"x-sluice-topic": bind})
            queue = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(queue, exchange, routing_key=f"{bind}.sensor.*")
            ch.confirm_delivery()

            # AMQP -> MQTT: routing key T.sensor.t1 is the MQTT topic T/sensor/t1
            props = pika.BasicProperties(content_type="text/plain", correlation_id="c-1", headers={"site": "north"})
            ch.basic_publish(exchange, f"{bind}.sensor.t1", b"21.5", props)
            ch.basic_publish(exchange, f"{bind}.other.t1", b"not matched", props)
            got = sub.get(WAIT_S)
            assert (got.topic, got.payload, got.qos) == (f"{bind}/sensor/t1", b"21.5", 1)
            assert (got.props["ContentType"], bytes.fromhex(got.props["CorrelationData"])) == ("text/plain", b"c-1")
            users = dict(got.props["UserProperty"])
            assert users["site"] == "north" and not [k for k in users if k.startswith("AMQP_")], users

            # MQTT -> AMQP: the bound queue gets the AMQP publish once, and what MQTT published
            pub.publish(f"{bind}/sensor/t2", "from mqtt", 1)
            pub.publish(f"{bind}/elsewhere/t2", "unbound", 1)
            bodies = {body: method.routing_key for method, _, body in drain(ch, queue, 2)}
            assert bodies == {b"21.5": f"{bind}.sensor.t1", b"from mqtt": f"{bind}.sensor.t2"}
            assert sub.get(WAIT_S).payload == b"from mqtt"
            assert sub.quiet(1.0) == []

            # a routing key that names no lite topic is refused, not dropped: the channel is closed
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                ch.basic_publish(exchange, "", b"no lite topic", props)
            assert refused.value.reply_code == 406, refused.value
    finally:
        sub.disconnect()
        pub.disconnect()
