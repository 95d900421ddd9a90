"""Validation of produced messages against a topic and the broker's limits, and conversion between
the API's message dataclasses and the store's `MessageRecord`.

Each check raises the protocol's specific error with a message that says what to change.
"""

from __future__ import annotations

import re
from itertools import chain, repeat
from operator import attrgetter

from broker.client.api import OutgoingMessage, StoredMessage
from broker.config import LimitsConfig
from broker.store.record import FLAG_BODY_GZIP, MessageRecord
from common.errors import (
    BadRequest,
    IllegalDeliveryTime,
    IllegalMessageGroup,
    IllegalMessageId,
    IllegalMessageKey,
    IllegalMessagePropertyKey,
    IllegalMessageTag,
    MessageBodyEmpty,
    MessageBodyTooLarge,
    MessagePropertiesTooLarge,
    MessageTypeConflict,
)
from common.model import MessageType, TopicInfo

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _printable(text: str) -> bool:
    return _CONTROL.search(text) is None


def _valid_tag(tag: str, limits: LimitsConfig) -> bool:
    return bool(tag.strip()) and len(tag) <= limits.max_tag_chars and "|" not in tag and _printable(tag)


def validate_message(msg: OutgoingMessage, topic: TopicInfo, limits: LimitsConfig) -> None:
    if not msg.body:
        raise MessageBodyEmpty("message body is empty; send at least one byte")
    if len(msg.body) > limits.max_body_bytes:
        raise MessageBodyTooLarge(
            f"message body is {len(msg.body)} bytes; this broker accepts at most {limits.max_body_bytes}"
        )
    if not msg.message_id or len(msg.message_id) > limits.max_message_id_chars or not _printable(msg.message_id):
        raise IllegalMessageId(f"message id {msg.message_id[:64]!r} is empty, too long or not printable")
    if msg.tag is not None and not _valid_tag(msg.tag, limits):
        raise IllegalMessageTag(
            f"tag {msg.tag[:64]!r} is invalid: use 1-{limits.max_tag_chars} printable characters without '|'"
        )
    if len(msg.keys) > limits.max_key_count:
        raise IllegalMessageKey(f"{len(msg.keys)} keys given; at most {limits.max_key_count} are allowed")
    for key in msg.keys:
        if not key.strip() or len(key) > limits.max_key_chars or not _printable(key):
            raise IllegalMessageKey(f"key {key[:64]!r} is invalid: use 1-{limits.max_key_chars} printable characters")
    if len(msg.properties) > limits.max_property_count:
        raise MessagePropertiesTooLarge(
            f"{len(msg.properties)} user properties given; at most {limits.max_property_count} are allowed"
        )
    size = 0
    for k, v in msg.properties.items():
        if not k or not _printable(k):
            raise IllegalMessagePropertyKey(f"user property key {k[:64]!r} is empty or not printable")
        size += len(k.encode()) + len(v.encode())
    if size > limits.max_properties_bytes:
        raise MessagePropertiesTooLarge(
            f"user properties take {size} bytes; at most {limits.max_properties_bytes} are allowed"
        )
    _validate_type(msg, topic, limits)


_BODY, _ID, _TAG, _GROUP, _KEYS, _PROPS, _SYSPROPS, _TYPE, _BORN, _HOST, _DELIVERY, _GZIP = (
    attrgetter(f) for f in ("body", "message_id", "tag", "message_group", "keys", "properties", "system_properties",
                            "message_type", "born_timestamp_ms", "born_host", "delivery_timestamp_ms", "body_gzip")
)  # fmt: skip
_PLAIN_TYPES = frozenset((MessageType.NORMAL, MessageType.FIFO))


def plainly_valid(msgs: list[OutgoingMessage], topic: TopicInfo, limits: LimitsConfig) -> bool:
    """True when every message is a valid NORMAL or FIFO message for `topic` (what
    `validate_message` would accept), checked column by column: each distinct tag, group and key
    once, the texts of all messages in one regular-expression scan. False does not mean invalid:
    the caller then validates message by message, which raises the precise error."""
    bodies = list(map(len, map(_BODY, msgs)))
    if min(bodies) == 0 or max(bodies) > limits.max_body_bytes:
        return False
    ids = list(map(_ID, msgs))
    id_sizes = list(map(len, ids))
    if min(id_sizes) == 0 or max(id_sizes) > limits.max_message_id_chars:
        return False
    types = set(map(_TYPE, msgs))
    if not types <= _PLAIN_TYPES or not types <= topic.message_types or any(map(_DELIVERY, msgs)):
        return False
    texts = ids  # checked for control characters at once, below
    tags = set(map(_TAG, msgs))
    tags.discard(None)
    if tags and not all(map(_valid_tag, tags, repeat(limits))):
        return False
    groups = set(map(_GROUP, msgs))
    if MessageType.FIFO in types:
        if len(types) > 1 or None in groups:
            return False
        if not all(g.strip() and len(g) <= limits.max_message_group_chars for g in groups if g is not None):
            return False
        texts = [*texts, *(g for g in groups if g is not None)]
    elif groups != {None} and any(groups):
        return False
    keys = list(map(_KEYS, msgs))
    if any(keys):
        if max(map(len, keys)) > limits.max_key_count:
            return False
        distinct = set(chain.from_iterable(keys))
        if not all(k.strip() and len(k) <= limits.max_key_chars for k in distinct):
            return False
        texts = [*texts, *distinct]
    props = list(map(_PROPS, msgs))
    if any(props):
        if max(map(len, props)) > limits.max_property_count:
            return False
        names = set(chain.from_iterable(props))
        if "" in names:
            return False
        # The bytes of all messages together within the limit: so is each message's share.
        text = "".join(chain.from_iterable(props)) + "".join(chain.from_iterable(map(dict.values, props)))
        if len(text.encode()) > limits.max_properties_bytes:
            return False
        texts = [*texts, *names]
    return _CONTROL.search("".join(texts)) is None


def records_of(topic: str, queue_id: int, msgs: list[OutgoingMessage], store_host: str) -> list[MessageRecord]:
    """`to_record` of each message, built column by column (no Python bytecode per message)."""
    n = len(msgs)
    flags = (FLAG_BODY_GZIP if gzip else 0 for gzip in map(_GZIP, msgs)) if any(map(_GZIP, msgs)) else repeat(0, n)
    return list(map(MessageRecord, repeat(topic, n), repeat(queue_id, n), map(_BODY, msgs), map(_ID, msgs),
                    map(_TAG, msgs), map(_KEYS, msgs), map(_GROUP, msgs), map(_PROPS, msgs), map(_SYSPROPS, msgs),
                    map(int, map(_TYPE, msgs)), flags, map(_BORN, msgs), map(_HOST, msgs), repeat(store_host, n),
                    map(_DELIVERY, msgs)))  # fmt: skip


def _validate_type(msg: OutgoingMessage, topic: TopicInfo, limits: LimitsConfig) -> None:
    mtype = msg.message_type
    if mtype not in topic.message_types:
        accepted = ", ".join(sorted(t.name for t in topic.message_types))
        raise MessageTypeConflict(f"topic {topic.name} does not accept {mtype.name} messages (it accepts {accepted})")
    if mtype is MessageType.FIFO:
        group = msg.message_group or ""
        if not group.strip() or len(group) > limits.max_message_group_chars or not _printable(group):
            raise IllegalMessageGroup(
                f"a FIFO message needs a message group of 1-{limits.max_message_group_chars} printable characters"
            )
    elif msg.message_group:
        raise MessageTypeConflict(f"only FIFO messages carry a message group, not {mtype.name} messages")
    if mtype is MessageType.DELAY:
        if msg.delivery_timestamp_ms <= 0:
            raise IllegalDeliveryTime("a DELAY message needs a delivery timestamp (when to deliver it)")
    elif msg.delivery_timestamp_ms:
        raise MessageTypeConflict("only DELAY messages carry a delivery timestamp")


def validate_queue(topic: TopicInfo, queue_id: int) -> None:
    if queue_id < 0 or queue_id >= topic.queue_count:
        raise BadRequest(
            f"queue {queue_id} does not exist: topic {topic.name} has queues 0..{topic.queue_count - 1} here"
        )


def to_record(topic: str, queue_id: int, msg: OutgoingMessage, store_host: str) -> MessageRecord:
    return MessageRecord(
        topic=topic, queue_id=queue_id, body=msg.body, message_id=msg.message_id, tag=msg.tag, keys=msg.keys,
        message_group=msg.message_group, properties=msg.properties, system_properties=msg.system_properties,
        message_type=int(msg.message_type), flags=FLAG_BODY_GZIP if msg.body_gzip else 0,
        born_timestamp_ms=msg.born_timestamp_ms, born_host=msg.born_host, store_host=store_host,
        delivery_timestamp_ms=msg.delivery_timestamp_ms,
    )  # fmt: skip


def to_stored(rec: MessageRecord, delivery_attempt: int) -> StoredMessage:
    try:
        mtype = MessageType(rec.message_type)
    except ValueError:
        mtype = MessageType.NORMAL
    return StoredMessage(
        topic=rec.topic, queue_id=rec.queue_id, queue_offset=rec.queue_offset, body=rec.body,
        message_id=rec.message_id, message_type=mtype, tag=rec.tag, keys=rec.keys,
        message_group=rec.message_group, properties=rec.properties, system_properties=rec.system_properties,
        born_timestamp_ms=rec.born_timestamp_ms, born_host=rec.born_host,
        store_timestamp_ms=rec.store_timestamp_ms, store_host=rec.store_host,
        delivery_timestamp_ms=rec.delivery_timestamp_ms, delivery_attempt=delivery_attempt,
        body_gzip=bool(rec.flags & FLAG_BODY_GZIP),
    )  # fmt: skip
