"""One set of messages, two protocols: an AMQP publish as a RocketMQ message of a mapped topic,
and a RocketMQ message of that topic as an AMQP publish (docs/amqp.md, "Both protocols").

An exchange declared with the argument `x-sluice-topic: T` is mapped to the RocketMQ topic T of
its vhost's namespace. AMQP → RocketMQ: the tag is the routing key, the key the message-id, the
standard AMQP properties become the user properties named in `PROPERTY_NAMES` and each header
becomes a user property of its name (values as text; tables and arrays as JSON). RocketMQ →
AMQP: the routing key is the user property `AMQP_ROUTING_KEY` when present, else the tag, else
""; the user properties of `PROPERTY_NAMES` become those AMQP properties, the others headers,
the RocketMQ message id is the message-id when none is given and the born time the timestamp.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
import uuid
import zlib
from typing import Any

from pamqp import commands

from broker.client.api import StoredMessage
from common import record
from common.model import MessageType
from proxy.amqp.meta import jsonable
from proxy.amqp.queues import PROP_EXCHANGE, PROP_HEADER, PROP_ROUTING_KEY, Publish
from proxy.amqp.routing import decode_properties
from proxy.litenames import routing_key_of

# AMQP basic property (pamqp's attribute) -> RocketMQ user property name.
PROPERTY_NAMES = {
    "content_type": "content-type", "content_encoding": "content-encoding", "correlation_id": "correlation-id",
    "reply_to": "reply-to", "message_id": "message-id", "message_type": "type", "app_id": "app-id",
    "user_id": "user-id", "priority": "priority", "delivery_mode": "delivery-mode", "expiration": "expiration",
    "timestamp": "timestamp",
}  # fmt: skip
_RESERVED = {*PROPERTY_NAMES.values(), PROP_EXCHANGE, PROP_ROUTING_KEY, PROP_HEADER}
_INT_PROPERTIES = ("priority", "delivery_mode")
_MAX_TAG_CHARS = 128  # the broker's default tag and key limits (broker/messages.py)
_TIMESTAMP = "timestamp"


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dt.datetime):
        return str(int(value.timestamp()))
    if isinstance(value, dict | list | tuple):
        return json.dumps(jsonable(value), separators=(",", ":"), sort_keys=True)
    return str(jsonable(value))


def _usable(text: str) -> bool:
    """A tag or key the broker accepts: 1-128 printable characters without '|'."""
    return 0 < len(text) <= _MAX_TAG_CHARS and text.isprintable() and "|" not in text


def to_topic_message(p: Publish, host: str, lite_topic: str | None = None) -> bytes:
    """The record (`common.record.outgoing`) of the RocketMQ message an AMQP publish to a mapped
    exchange stores in the exchange's topic (a LITE message of `lite_topic` when one is given: the
    topic is a LITE topic).
    It keeps the exchange, routing key and raw property bytes too (AMQP_* properties), which tell
    the topic's bridge (proxy/amqp/bridge.py) that AMQP queues already have it."""
    props: dict[str, str] = {PROP_EXCHANGE: p.exchange, PROP_ROUTING_KEY: p.routing_key}
    if p.properties:
        props[PROP_HEADER] = base64.b64encode(p.properties).decode()
    amqp = decode_properties(p.properties)
    for name, value in (amqp.headers or {}).items():
        key = str(name)
        if key and key.isprintable() and key not in _RESERVED:
            props[key] = _text(value)
    for attr, name in PROPERTY_NAMES.items():
        value = getattr(amqp, attr)
        if value is not None:
            props[name] = _text(value)
    message_id = amqp.message_id if isinstance(amqp.message_id, str) else ""
    kind, sysprops = (MessageType.NORMAL, {}) if lite_topic is None else (
        MessageType.LITE, {record.SYSPROP_LITE_TOPIC: lite_topic})  # fmt: skip
    tag = p.routing_key if _usable(p.routing_key) else None
    return record.outgoing(p.body, uuid.uuid4().hex.upper(), kind, tag=tag,
                           keys=(message_id,) if _usable(message_id) else (), properties=props,
                           system_properties=sysprops, born_timestamp_ms=int(time.time() * 1000),
                           born_host=host)  # fmt: skip


def from_amqp(m: StoredMessage) -> bool:
    """The message was published through AMQP (its AMQP queues got it at publish time)."""
    return PROP_EXCHANGE in m.properties


def routing_key(m: StoredMessage) -> str:
    """`AMQP_ROUTING_KEY` when present, else the lite topic's (proxy/litenames.py), else the tag."""
    given = m.properties.get(PROP_ROUTING_KEY)
    if given:
        return given
    lite = m.system_properties.get(record.SYSPROP_LITE_TOPIC)
    return routing_key_of(lite) if lite else m.tag or ""


def to_publish(m: StoredMessage, exchange: str) -> Publish:
    """The AMQP publish a RocketMQ message of a mapped topic makes to its exchange."""
    fields: dict[str, Any] = {}
    headers: dict[str, Any] = {}
    by_name = {name: attr for attr, name in PROPERTY_NAMES.items()}
    for key, value in m.properties.items():
        attr = by_name.get(key)
        if attr is None:
            if key not in _RESERVED and len(key) <= 255:
                headers[key] = value
        elif attr in _INT_PROPERTIES:
            if value.isdigit() and int(value) < 256:
                fields[attr] = int(value)
        elif attr == _TIMESTAMP:
            if value.isdigit():
                fields[attr] = dt.datetime.fromtimestamp(int(value), dt.UTC)
        elif len(value.encode()) <= 255:
            fields[attr] = value
    if m.tag:
        headers.setdefault("x-rocketmq-tag", m.tag)
    if m.keys:
        headers.setdefault("x-rocketmq-keys", " ".join(m.keys))
    fields.setdefault("message_id", m.message_id)
    fields.setdefault(_TIMESTAMP, dt.datetime.fromtimestamp(m.born_timestamp_ms // 1000, dt.UTC))
    if headers:
        fields["headers"] = headers
    body = zlib.decompress(m.body, wbits=47) if m.body_gzip else m.body  # 47: gzip or zlib framing
    return Publish(exchange, routing_key(m), commands.Basic.Properties(**fields).marshal(), body)
