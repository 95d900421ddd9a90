"""One set of messages for every protocol: an MQTT PUBLISH as the record of a LITE message, and a
stored message (whoever sent it) as the PUBLISH a subscriber gets (docs/mqtt.md, "Messages and
properties").

MQTT 5 properties that RocketMQ and AMQP know become the user properties those edges read
(`content-type`, `reply-to`, `correlation-id`: proxy/amqp/crossmap.py's names), user properties stay
user properties, and what only MQTT reads rides in system properties (`SYSPROP_MQTT_*`).
"""

from __future__ import annotations

import base64
import itertools
import time
import uuid
import zlib
from dataclasses import dataclass

from broker.client.api import StoredMessage
from common import record
from common.model import MessageType
from common.record import (
    SYSPROP_LITE_TOPIC,
    SYSPROP_MQTT_EXPIRES_MS,
    SYSPROP_MQTT_FORMAT,
    SYSPROP_MQTT_ORIGIN,
    SYSPROP_MQTT_QOS,
    SYSPROP_MQTT_RETAIN,
)
from proxy.mqtt import properties as P
from proxy.mqtt.packets import Publish

CONTENT_TYPE, REPLY_TO, CORRELATION_ID = "content-type", "reply-to", "correlation-id"
CORRELATION_BASE64 = "mqtt-correlation-base64"
RESERVED = frozenset({CONTENT_TYPE, REPLY_TO, CORRELATION_ID, CORRELATION_BASE64})
TAG_PROPERTY, KEYS_PROPERTY = "x-rocketmq-tag", "x-rocketmq-keys"
DEFAULT_QOS = 1  # a message published by RocketMQ or AMQP clients counts as QoS 1
AMQP_OWN = "AMQP_"  # the AMQP edge's own properties (its exchange, routing key, header bytes): not passed on


_ID_PREFIX = uuid.uuid4().hex[:20].upper()  # this process's: ids stay unique across proxies
_ids = itertools.count(int(time.time() * 1000) << 16)


def new_message_id() -> str:
    """A message id unique in the cluster: this process's random prefix and a counter (an
    `uuid4()` each cost ~3 us per message on the publish path)."""
    return f"{_ID_PREFIX}{next(_ids):012X}"


def to_record(p: Publish, lite: str, origin: str, host: str, message_id: str, *, now_ms: int,
              dedup: bool = False) -> bytes:  # fmt: skip
    """The `outgoing` record of a PUBLISH to the lite topic `lite` by the session `origin`."""
    props: dict[str, str] = {}
    sysprops = {SYSPROP_LITE_TOPIC: lite, SYSPROP_MQTT_QOS: str(p.qos)}
    if p.retain:
        sysprops[SYSPROP_MQTT_RETAIN] = "1"
    if origin:
        sysprops[SYSPROP_MQTT_ORIGIN] = origin
    if p.props:
        pp = p.props
        for name, value in pp.get(P.USER_PROPERTY, ()):
            if name and name not in RESERVED:
                props[name] = value
        if P.CONTENT_TYPE in pp:
            props[CONTENT_TYPE] = pp[P.CONTENT_TYPE]
        if P.RESPONSE_TOPIC in pp:
            props[REPLY_TO] = pp[P.RESPONSE_TOPIC]
        if P.CORRELATION_DATA in pp:
            data: bytes = pp[P.CORRELATION_DATA]
            try:
                props[CORRELATION_ID] = data.decode()
            except UnicodeDecodeError:
                props[CORRELATION_BASE64] = base64.b64encode(data).decode()
        if P.PAYLOAD_FORMAT in pp:
            sysprops[SYSPROP_MQTT_FORMAT] = str(pp[P.PAYLOAD_FORMAT])
        if P.MESSAGE_EXPIRY in pp:
            sysprops[SYSPROP_MQTT_EXPIRES_MS] = str(now_ms + pp[P.MESSAGE_EXPIRY] * 1000)
    return record.outgoing(p.payload, message_id, MessageType.LITE, properties=props, system_properties=sysprops,
                           born_timestamp_ms=now_ms, born_host=host, dedup=dedup)  # fmt: skip


@dataclass(slots=True)
class Outbound:
    """What a stored message is to MQTT: topic, payload, its publish QoS and RETAIN, origin, expiry,
    and its 5.0 properties (before subscription identifiers and the remaining expiry are added)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    origin: str
    expires_ms: int  # 0: never
    props: P.Props


def expired(m: StoredMessage, now_ms: int) -> bool:
    value = m.system_properties.get(SYSPROP_MQTT_EXPIRES_MS)
    return value is not None and value.isdigit() and int(value) <= now_ms


def to_outbound(m: StoredMessage | record.MessageRecord, topic: str) -> Outbound:
    """The MQTT view of a stored message of `topic` (its lite topic, unescaped)."""
    sysprops = m.system_properties
    qos_text = sysprops.get(SYSPROP_MQTT_QOS, "")
    qos = int(qos_text) if qos_text in ("0", "1", "2") else DEFAULT_QOS
    expires = sysprops.get(SYSPROP_MQTT_EXPIRES_MS, "")
    props: P.Props = {}
    users: list[tuple[str, str]] = []
    for name, value in m.properties.items():
        if name == CONTENT_TYPE:
            props[P.CONTENT_TYPE] = value
        elif name == REPLY_TO:
            props[P.RESPONSE_TOPIC] = value
        elif name == CORRELATION_ID:
            props[P.CORRELATION_DATA] = value.encode()
        elif name == CORRELATION_BASE64:
            try:
                props[P.CORRELATION_DATA] = base64.b64decode(value, validate=True)
            except ValueError:
                users.append((name, value))
        elif not name.startswith(AMQP_OWN):
            users.append((name, value))
    if m.tag:
        users.append((TAG_PROPERTY, m.tag))
    if m.keys:
        users.append((KEYS_PROPERTY, " ".join(m.keys)))
    if users:
        props[P.USER_PROPERTY] = users
    fmt = sysprops.get(SYSPROP_MQTT_FORMAT)
    if fmt in ("0", "1"):
        props[P.PAYLOAD_FORMAT] = int(fmt)
    body = m.body
    if isinstance(m, StoredMessage):
        gzip = m.body_gzip
    else:
        gzip = bool(m.flags & record.FLAG_BODY_GZIP)
    if gzip:
        body = zlib.decompress(body, wbits=47)  # 47: gzip or zlib framing
    return Outbound(topic, body, qos, sysprops.get(SYSPROP_MQTT_RETAIN) == "1", sysprops.get(SYSPROP_MQTT_ORIGIN, ""),
                    int(expires) if expires.isdigit() else 0, props)  # fmt: skip


def now_ms() -> int:
    return int(time.time() * 1000)
