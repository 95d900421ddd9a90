"""The documented mapping between AMQP publishes and RocketMQ messages (proxy/amqp/crossmap.py),
vhost names as namespaces (proxy/amqp/access.py), and which queue topics and groups the janitor
takes for orphans (proxy/amqp/janitor.py)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import re
from typing import cast

import pytest
from pamqp import commands

from broker.client.api import BrokerApi, StoredMessage
from common import record
from common.model import MessageType
from common.security import Action, Effect, Rule, SecurityDoc, parse_pattern
from proxy.amqp import access, crossmap, janitor
from proxy.amqp.codes import NOT_ALLOWED, AmqpError
from proxy.amqp.meta import MetaDoc, QueueMeta, VhostMeta
from proxy.amqp.queues import PROP_EXCHANGE, PROP_HEADER, Publish, QueueGone, QueueStore, to_delivery, to_outgoing
from proxy.amqp.routing import decode_properties
from tests.helpers.records import delivered


def _stored(properties: dict[str, str], *, tag: str | None = None, keys: tuple[str, ...] = ()) -> StoredMessage:
    return delivered("orders", 0, 7, b"body", "01ID", MessageType.NORMAL, tag, keys, None, properties, {},
                         1_700_000_000_123, "h", 0, "", 0, 1)  # fmt: skip


def test_an_amqp_publish_as_a_rocketmq_message() -> None:
    props = commands.Basic.Properties(content_type="text/plain", correlation_id="c", message_id="m-1", priority=4,
                                      headers={"region": "eu", "n": 7, "nested": {"a": 1}, "content-type": "x"},
                                      timestamp=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), message_type="t")  # fmt: skip
    m = record.decode(crossmap.to_topic_message(Publish("ex", "order.new", props.marshal(), b"b"), "host"))
    assert (m.tag, m.keys, m.body) == ("order.new", ("m-1",), b"b")
    assert {k: v for k, v in m.properties.items() if k != PROP_HEADER} == {
        PROP_EXCHANGE: "ex", "AMQP_ROUTING_KEY": "order.new", "region": "eu", "n": "7", "nested": '{"a":1}',
        "content-type": "text/plain", "correlation-id": "c", "message-id": "m-1", "priority": "4",
        "timestamp": "1704067200", "type": "t"}  # fmt: skip
    # no tag the broker refuses
    unusable = record.decode(crossmap.to_topic_message(Publish("ex", "a||b", b"", b"b"), "host"))
    assert unusable.tag is None and unusable.keys == ()


def test_a_rocketmq_message_as_an_amqp_publish() -> None:
    m = _stored({"content-type": "application/json", "priority": "3", "timestamp": "1700000000", "region": "us"},
                tag="order.paid", keys=("k1", "k2"))  # fmt: skip
    p = crossmap.to_publish(m, "ex")
    props = decode_properties(p.properties)
    assert (p.exchange, p.routing_key, p.body) == ("ex", "order.paid", b"body")
    assert (props.content_type, props.priority, props.message_id) == ("application/json", 3, "01ID")
    assert props.timestamp == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    assert props.headers == {"region": "us", "x-rocketmq-tag": "order.paid", "x-rocketmq-keys": "k1 k2"}
    assert crossmap.to_publish(_stored({"AMQP_ROUTING_KEY": "rk"}, tag="t"), "ex").routing_key == "rk"
    assert crossmap.to_publish(_stored({}), "ex").routing_key == ""
    assert crossmap.from_amqp(_stored({PROP_EXCHANGE: ""})) and not crossmap.from_amqp(_stored({}))


def test_a_priority_queue_copy_takes_the_capped_priority() -> None:
    def level(priority: int | None, max_priority: int) -> str:
        raw = commands.Basic.Properties(priority=priority).marshal() if priority is not None else b""
        m = record.decode(to_outgoing(Publish("", "q", raw, b"b"), "h", 0, max_priority))
        assert m.message_type == MessageType.PRIORITY
        return m.system_properties["PRIORITY"]

    assert [level(None, 5), level(3, 5), level(9, 5), level(200, 255)] == ["0", "3", "5", "99"]


def test_a_queue_copy_keeps_any_content_header_and_any_body() -> None:
    """The content header's bytes ride in a system property, which the broker's user-property limit
    (16 KiB) does not bound: a header table as large as a frame, and an empty body, come back as
    published (before, the broker refused the copy and the publish was dropped). Copies stored
    with the header as a user property (before 2026-11-29) still deliver it."""
    raw = commands.Basic.Properties(headers={"big": "h" * 60_000}, content_type="text/plain").marshal()
    data = to_outgoing(Publish("", "q", raw, b""), "h")
    m = record.decode(data)
    assert sum(len(k) + len(v) for k, v in m.properties.items()) < 100
    d = to_delivery(delivered("AMQP_Q1", body=m.body, properties=m.properties, system_properties=m.system_properties))
    assert (d.properties, d.body) == (raw, b"")
    old = delivered("AMQP_Q1", properties={PROP_EXCHANGE: "", PROP_HEADER: base64.b64encode(raw).decode()})
    assert to_delivery(old).properties == raw


def test_vhosts_are_namespaces() -> None:
    assert access.namespace("/") == "" and access.namespace("team-a") == "team-a"
    for bad in ("a/b", "", "x%y", "a" * 200):
        with pytest.raises(AmqpError) as refused:
            access.namespace(bad)
        assert refused.value.code == NOT_ALLOWED
    every, sub = parse_pattern("*"), frozenset({Action.SUB})
    doc = SecurityDoc(rules=(Rule("amy", "team-a", every, sub), Rule("bob", "team-a", every, sub, Effect.DENY)))
    assert access.may_use_vhost(doc, "amy", "team-a") and not access.may_use_vhost(doc, "amy", "/")
    assert not access.may_use_vhost(doc, "bob", "team-a") and not access.may_use_vhost(None, "amy", "team-a")


def test_orphans_are_allocated_numbers_of_no_queue() -> None:
    doc = MetaDoc(next_id=10, vhosts={"/": VhostMeta(queues={"q": QueueMeta("q", 3, "b")}),
                                      "v": VhostMeta(queues={"r": QueueMeta("r", 5, "b")})})  # fmt: skip
    names = ["AMQP_Q2", "AMQP_Q3", "AMQP_Q5", "AMQP_Q10", "AMQP_Q11", "orders", "AMQP_Qx", "AMQP_G2"]
    assert janitor.orphans(doc, names, re.compile(r"^AMQP_Q([0-9]{1,18})$")) == ["AMQP_Q2"]


def test_a_stale_proxy_does_not_create_a_deleted_queues_topic() -> None:
    """QueueStore creates a queue's topic and group only when the newest metadata still has the queue."""
    created: list[str] = []

    class _Broker:
        async def create_topic(self, spec: object) -> None:
            created.append("topic")

        async def create_group(self, spec: object) -> None:
            created.append("group")

    async def gone(q: QueueMeta) -> bool:
        return False

    async def there(q: QueueMeta) -> bool:
        return True

    q = QueueMeta("q", 7, "b")
    stale = QueueStore(lambda name: cast(BrokerApi, _Broker()), lease_ms=1000, call_timeout_s=1, exists=gone)
    with pytest.raises(QueueGone):
        asyncio.run(stale.ensure(q))
    assert created == []
    fresh = QueueStore(lambda name: cast(BrokerApi, _Broker()), lease_ms=1000, call_timeout_s=1, exists=there)
    asyncio.run(fresh.ensure(q))
    assert created == ["topic", "group"]
