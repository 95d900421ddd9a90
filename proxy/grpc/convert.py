"""Conversion between `apache.rocketmq.v2` messages and the broker API's dataclasses.

Inbound (SendMessage): validates what only the wire format can get wrong (missing topic, unknown
message type) and encodes each message into its CommitLog record (`common.record.outgoing`);
content rules (body size, tags, keys) are the broker's, checked on the record. Outbound
(ReceiveMessage): builds a `Message` with everything the official clients need:
MD5 body digest in upper-case hex, encoding IDENTITY or GZIP, delivery attempt, receipt handle,
store time and host, queue id and offset.
"""

from __future__ import annotations

import functools
import hashlib
from typing import cast

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.client.api import StoredMessage
from common import record
from common.errors import (
    BadRequest,
    IllegalConsumerGroup,
    IllegalDeliveryTime,
    IllegalTopic,
    MessageTypeConflict,
    SluiceError,
)
from common.model import (
    DLQ_PREFIX,
    MessageType,
    validate_group_name,
    validate_topic_name,
)
from common.record import (
    SYSPROP_DLQ_ORIGIN_TOPIC,
    SYSPROP_LITE_TOPIC,
    SYSPROP_PRIORITY,
    SYSPROP_TRACE_CONTEXT,
    SYSPROP_TX_RECOVERY_MS,
)
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proxy import names

_TYPES: dict[int, MessageType] = {
    pb.NORMAL: MessageType.NORMAL,
    pb.FIFO: MessageType.FIFO,
    pb.DELAY: MessageType.DELAY,
    pb.TRANSACTION: MessageType.TRANSACTION,
    pb.LITE: MessageType.LITE,
    pb.PRIORITY: MessageType.PRIORITY,
}
_TYPES_OR_NORMAL = {**_TYPES, pb.MESSAGE_TYPE_UNSPECIFIED: MessageType.NORMAL}  # what `message_type` accepts
_DELIVERED_TYPES: dict[int, pb.MessageType] = {int(t): cast(pb.MessageType, int(t)) for t in MessageType}
_GZIP = record.FLAG_BODY_GZIP


def namespace_of(resource: pb.Resource, header_namespace: str) -> str:
    return resource.resource_namespace or header_namespace


def resource_name(resource: pb.Resource, header_namespace: str, what: str = "topic") -> tuple[str, str]:
    """(namespace, cluster-wide name) of a topic or group given on the wire.

    Names are checked here, at the edge, so that a malformed one is ILLEGAL_TOPIC or
    ILLEGAL_CONSUMER_GROUP in both topologies (not TOPIC_NOT_FOUND from wherever it is looked up).
    Topics may be system topics: dead-letter topics are consumed like any other.
    """
    if what == "topic":
        return topic_name(resource.resource_namespace, resource.name, header_namespace)
    if not resource.name:
        if what == "consumer group":  # as the reference proxy: a blank group is an illegal group
            raise IllegalConsumerGroup("the request names no consumer group")
        raise BadRequest(f"the request names no {what}")
    ns = namespace_of(resource, header_namespace)
    name = names.wrap(ns, resource.name)
    if what == "consumer group":
        validate_group_name(name)
    return ns, name


@functools.lru_cache(maxsize=4096)
def topic_name(resource_namespace: str, name: str, header_namespace: str) -> tuple[str, str]:
    """`resource_name` of a topic given as its Resource's two fields (a pure function: the names
    clients send recur, so checked ones are kept; a failure raises again each time)."""
    if not name:
        raise IllegalTopic("the request names no topic")
    ns = resource_namespace or header_namespace
    wrapped = names.wrap(ns, name)
    validate_topic_name(wrapped, allow_system=True)
    return ns, wrapped


def message_type(value: int) -> MessageType:
    mtype = _TYPES.get(value)
    if mtype is not None:
        return mtype
    if value == pb.MESSAGE_TYPE_UNSPECIFIED:
        return MessageType.NORMAL
    raise BadRequest(f"unknown message type {value}")


# The ranges google.protobuf defines for Duration (about +-10,000 years) and Timestamp (years 1 to
# 9999): anything outside is not a time at all and would overflow the int64 milliseconds downstream.
MAX_DURATION_S = 315_576_000_000
MIN_TIMESTAMP_S = -62_135_596_800
MAX_TIMESTAMP_S = 253_402_300_799
_NANOS = 1_000_000_000


def duration_ms(d: Duration, field: str, error: type[SluiceError] = BadRequest) -> int:
    """A Duration field in milliseconds; `error` naming `field` if it is not a valid, non-negative one."""
    seconds, nanos = d.seconds, d.nanos
    if (
        not -_NANOS < nanos < _NANOS
        or abs(seconds) > MAX_DURATION_S
        or (seconds and nanos and (seconds < 0) != (nanos < 0))
    ):
        raise error(f"{field} ({seconds} s, {nanos} ns) is not a valid Duration")
    if seconds < 0 or nanos < 0:
        raise error(f"{field} is negative ({seconds} s, {nanos} ns)")
    return seconds * 1000 + nanos // 1_000_000


def timestamp_ms(ts: Timestamp, field: str, error: type[SluiceError] = BadRequest) -> int:
    """A Timestamp field in milliseconds since the epoch; `error` naming `field` if it is not a valid one."""
    if not MIN_TIMESTAMP_S <= ts.seconds <= MAX_TIMESTAMP_S or not 0 <= ts.nanos < _NANOS:
        raise error(f"{field} ({ts.seconds} s, {ts.nanos} ns) is not a valid Timestamp")
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def outgoing(msg: pb.Message, peer: str) -> bytes:
    """A client's message as its record (`common.record.outgoing`): what the broker verifies, places
    and appends. The gRPC edge's one conversion of a sent message."""
    # Hot path (once per produced message): every attribute read of a upb message costs, so each
    # field is read once, and empty repeated and map fields are handed over as they are.
    sp = msg.system_properties
    mtype = _TYPES.get(sp.message_type) or message_type(sp.message_type)
    sysprops: dict[str, str] = {}
    if sp.HasField("trace_context"):
        sysprops[SYSPROP_TRACE_CONTEXT] = sp.trace_context
    if sp.HasField("orphaned_transaction_recovery_duration"):
        d = sp.orphaned_transaction_recovery_duration
        sysprops[SYSPROP_TX_RECOVERY_MS] = str(duration_ms(d, "orphaned_transaction_recovery_duration"))
    if sp.HasField("lite_topic") or sp.HasField("priority"):
        _lite_or_priority(sp, mtype, sysprops)
    born = sp.born_timestamp
    if not MIN_TIMESTAMP_S <= born.seconds <= MAX_TIMESTAMP_S or not 0 <= born.nanos < _NANOS:
        timestamp_ms(born, "born_timestamp")  # raises, naming the field
    return record.outgoing(
        msg.body, sp.message_id, mtype, sp.tag if sp.HasField("tag") else None, sp.keys,
        sp.message_group if sp.HasField("message_group") else None, msg.user_properties, sysprops,
        born.seconds * 1000 + born.nanos // 1_000_000, sp.born_host or peer,
        timestamp_ms(sp.delivery_timestamp, "delivery_timestamp", IllegalDeliveryTime)
        if sp.HasField("delivery_timestamp") else 0,
        sp.body_encoding == pb.GZIP,
    )  # fmt: skip


def _lite_or_priority(sp: pb.SystemProperties, mtype: MessageType, sysprops: dict[str, str]) -> None:
    """Carry a message's lite topic or priority to the broker; refuse it with a type it cannot have."""
    if sp.HasField("lite_topic"):
        if mtype is not MessageType.LITE:
            raise MessageTypeConflict(f"a {mtype.name} message cannot carry a lite topic; only LITE messages do")
        sysprops[SYSPROP_LITE_TOPIC] = sp.lite_topic
    if sp.HasField("priority"):
        if mtype is not MessageType.PRIORITY:
            raise MessageTypeConflict(
                f"a {mtype.name} message cannot carry a priority; only PRIORITY messages do (priority cannot be "
                "combined with a message group, a delivery time or a lite topic)"
            )
        sysprops[SYSPROP_PRIORITY] = str(sp.priority)
    elif mtype is MessageType.PRIORITY:
        raise BadRequest("a PRIORITY message needs a priority")


def _set_ms(ts: Timestamp, ms: int) -> None:
    """`ts.FromMilliseconds(ms)` without its Python-level checks (twice per delivered message)."""
    seconds, rest = divmod(ms, 1000)
    ts.seconds = seconds
    ts.nanos = rest * 1_000_000


def delivered(msg: StoredMessage, namespace: str) -> pb.Message:
    out = pb.Message()
    fill_delivered(out, msg, namespace)
    return out


def fill_delivered(out: pb.Message, msg: StoredMessage, namespace: str) -> None:
    """Write `msg` into `out` (an empty Message, e.g. a response's `message` field): the record's
    fields, read where the broker (or the internal stream's decode) left them, and the delivery's.

    Hot path (once per delivered message): filling the response's own field in place saves the
    copy (a serialise and a parse) that `Response(message=...)` makes of a message built apart.
    """
    rec = msg.record
    topic = out.topic
    topic.name = names.unwrap(namespace, rec.topic)
    if namespace:  # "" is the field's default: leaving it unset writes the same message
        topic.resource_namespace = namespace
    if rec.properties:
        up = out.user_properties
        for k, v in rec.properties.items():
            up[k] = v
    body = rec.body
    out.body = body
    sp = out.system_properties
    if rec.tag:
        sp.tag = rec.tag
    if rec.keys:
        sp.keys.extend(rec.keys)
    sp.message_id = rec.message_id
    digest = sp.body_digest
    digest.type = pb.MD5
    digest.checksum = hashlib.md5(body).hexdigest().upper()
    if rec.flags & _GZIP:
        sp.body_encoding = pb.GZIP
    else:
        sp.body_encoding = pb.IDENTITY
    sp.message_type = _DELIVERED_TYPES.get(rec.message_type, pb.NORMAL)  # a stored number: unknown ones are NORMAL
    _set_ms(sp.born_timestamp, rec.born_timestamp_ms)
    sp.born_host = rec.born_host
    _set_ms(sp.store_timestamp, rec.store_timestamp_ms)
    sp.store_host = msg.store_host
    if rec.delivery_timestamp_ms:
        _set_ms(sp.delivery_timestamp, rec.delivery_timestamp_ms)
    if msg.receipt_handle:
        sp.receipt_handle = msg.receipt_handle
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    sp.delivery_attempt = max(1, msg.delivery_attempt)
    if rec.message_group:
        sp.message_group = rec.message_group
    sysprops = rec.system_properties
    if sysprops:
        trace = sysprops.get(SYSPROP_TRACE_CONTEXT)
        if trace:
            sp.trace_context = trace
        lite = sysprops.get(SYSPROP_LITE_TOPIC)
        if lite is not None:
            sp.lite_topic = lite
        level = sysprops.get(SYSPROP_PRIORITY)
        if level is not None and level.isdigit():
            sp.priority = int(level)
        origin = sysprops.get(SYSPROP_DLQ_ORIGIN_TOPIC)
        if origin is not None and rec.topic.startswith(DLQ_PREFIX):
            sp.dead_letter_queue.topic = names.unwrap(namespace, origin)
            sp.dead_letter_queue.message_id = rec.message_id
