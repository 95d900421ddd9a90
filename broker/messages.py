"""Validation of produced messages (the records a send carries, `common.record.received`) against a
topic and the broker's limits.

Each check raises the protocol's specific error with a message that says what to change. An empty
body is a message like any other here: AMQP publishes may have one (signals, headers-only
messages); the RocketMQ protocol's refusal of an empty body (MESSAGE_BODY_EMPTY) is its edge's
(proxy/grpc/produce.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain, repeat
from operator import attrgetter

from broker.config import LimitsConfig
from common.errors import (
    BadRequest,
    IllegalDeliveryTime,
    IllegalMessageGroup,
    IllegalMessageId,
    IllegalMessageKey,
    IllegalMessagePropertyKey,
    IllegalMessageTag,
    MessageBodyTooLarge,
    MessagePropertiesTooLarge,
    MessageTypeConflict,
    SluiceError,
)
from common.model import MESSAGE_TYPES, MessageType, TopicInfo
from common.record import MessageRecord

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Below this many messages, checking a send one by one (`validate_message`) costs less than
# setting up the column-wise maps (`plainly_valid`); from it on the columns win (24-28 against
# 80-116 µs for one message in the broker; measured on a shared, noisy 2-core machine).
COLUMNS_MIN = 4

# -- the rules, each stated once -------------------------------------------------------------------
# `validate_message` applies them message by message and raises the precise error;
# `plainly_valid` applies the same predicates column by column (each distinct value once, the
# printable check of all texts in one scan). Texts (ids, tags, keys, groups, property names) must
# also be printable: `_printable`.


def _printable(text: str) -> bool:
    return _CONTROL.search(text) is None


def _body_ok(size: int, limits: LimitsConfig) -> bool:
    return size <= limits.max_body_bytes


def _id_ok(message_id: str, limits: LimitsConfig) -> bool:
    return 0 < len(message_id) <= limits.max_message_id_chars


def _valid_tag(tag: str, limits: LimitsConfig) -> bool:
    return bool(tag.strip()) and len(tag) <= limits.max_tag_chars and "|" not in tag and _printable(tag)


def _key_ok(key: str, limits: LimitsConfig) -> bool:
    return bool(key.strip()) and len(key) <= limits.max_key_chars


def _group_ok(group: str, limits: LimitsConfig) -> bool:
    return bool(group.strip()) and len(group) <= limits.max_message_group_chars


def _properties_bytes(properties: Iterable[dict[str, str]]) -> int:
    """UTF-8 bytes of the names and values of the given property maps together."""
    names = "".join(chain.from_iterable(properties := list(properties)))
    return len(names.encode()) + len("".join(chain.from_iterable(map(dict.values, properties))).encode())


def _type_error(
    mtype: MessageType, grouped: bool, delivery_ms: int, topic: TopicInfo, limits: LimitsConfig
) -> SluiceError | None:
    """What a message of this type may carry on this topic: None when the combination is allowed."""
    if mtype not in topic.message_types:
        accepted = ", ".join(sorted(t.name for t in topic.message_types))
        return MessageTypeConflict(f"topic {topic.name} does not accept {mtype.name} messages (it accepts {accepted})")
    if mtype is MessageType.FIFO:
        if not grouped:
            return IllegalMessageGroup(
                f"a FIFO message needs a message group of 1-{limits.max_message_group_chars} printable characters"
            )
    elif grouped:
        return MessageTypeConflict(f"only FIFO messages carry a message group, not {mtype.name} messages")
    if mtype is MessageType.DELAY:
        if delivery_ms <= 0:
            return IllegalDeliveryTime("a DELAY message needs a delivery timestamp (when to deliver it)")
    elif delivery_ms:
        return MessageTypeConflict("only DELAY messages carry a delivery timestamp")
    return None


def validate_message(msg: MessageRecord, topic: TopicInfo, limits: LimitsConfig) -> None:
    if not _body_ok(len(msg.body), limits):
        raise MessageBodyTooLarge(
            f"message body is {len(msg.body)} bytes; this broker accepts at most {limits.max_body_bytes}"
        )
    if not _id_ok(msg.message_id, limits) or not _printable(msg.message_id):
        raise IllegalMessageId(f"message id {msg.message_id[:64]!r} is empty, too long or not printable")
    if msg.tag is not None and not _valid_tag(msg.tag, limits):
        raise IllegalMessageTag(
            f"tag {msg.tag[:64]!r} is invalid: use 1-{limits.max_tag_chars} printable characters without '|'"
        )
    if len(msg.keys) > limits.max_key_count:
        raise IllegalMessageKey(f"{len(msg.keys)} keys given; at most {limits.max_key_count} are allowed")
    for key in msg.keys:
        if not _key_ok(key, limits) or not _printable(key):
            raise IllegalMessageKey(f"key {key[:64]!r} is invalid: use 1-{limits.max_key_chars} printable characters")
    if msg.properties:
        _validate_properties(msg.properties, limits)
    group = msg.message_group
    if msg.message_type is MessageType.FIFO and group and not (_group_ok(group, limits) and _printable(group)):
        group = ""  # present but unusable: as missing
    mtype = MESSAGE_TYPES.get(msg.message_type)
    if mtype is None:
        raise BadRequest(f"unknown message type {msg.message_type}")
    error = _type_error(mtype, bool(group), msg.delivery_timestamp_ms, topic, limits)
    if error is not None:
        raise error


def _validate_properties(properties: dict[str, str], limits: LimitsConfig) -> None:
    if len(properties) > limits.max_property_count:
        raise MessagePropertiesTooLarge(
            f"{len(properties)} user properties given; at most {limits.max_property_count} are allowed"
        )
    if "" in properties or not _printable("".join(properties)):  # all names at once; then name the first bad one
        for k in properties:
            if not k or not _printable(k):
                raise IllegalMessagePropertyKey(f"user property key {k[:64]!r} is empty or not printable")
    size = _properties_bytes((properties,))
    if size > limits.max_properties_bytes:
        raise MessagePropertiesTooLarge(
            f"user properties take {size} bytes; at most {limits.max_properties_bytes} are allowed"
        )


_BODY, _ID, _TAG, _GROUP, _KEYS, _PROPS, _TYPE, _DELIVERY = (
    attrgetter(f) for f in ("body", "message_id", "tag", "message_group", "keys", "properties", "message_type",
                            "delivery_timestamp_ms")
)  # fmt: skip
_PLAIN_TYPES = frozenset((MessageType.NORMAL, MessageType.FIFO))


def plainly_valid(
    msgs: list[MessageRecord], topic: TopicInfo, limits: LimitsConfig, types: frozenset[MessageType] = _PLAIN_TYPES
) -> bool:
    """True when every message is a valid message of one of `types` (NORMAL or FIFO unless told) for `topic` (what
    `validate_message` would accept), checked column by column with the same rules: each distinct
    tag, group and key once, the texts of all messages in one regular-expression scan. False does
    not mean invalid: the caller then validates message by message, which raises the precise error."""
    bodies = list(map(len, map(_BODY, msgs)))
    if not (_body_ok(min(bodies), limits) and _body_ok(max(bodies), limits)):
        return False
    ids = list(map(_ID, msgs))
    if not (_id_ok(min(ids, key=len), limits) and _id_ok(max(ids, key=len), limits)):
        return False
    if not set(map(_TYPE, msgs)) <= types or any(map(_DELIVERY, msgs)):
        return False
    texts = ids  # checked for control characters at once, below
    tags = set(map(_TAG, msgs))
    tags.discard(None)
    if tags and not all(map(_valid_tag, tags, repeat(limits))):
        return False
    groups = set(map(_GROUP, msgs))
    if not all(_group_ok(g, limits) for g in groups if g):
        return False
    texts = [*texts, *(g for g in groups if g)]
    combos = set(zip(map(_TYPE, msgs), map(bool, map(_GROUP, msgs)), strict=True))  # (type, has a group)
    if any(_type_error(t, grouped, 0, topic, limits) for t, grouped in combos):
        return False
    keys = list(map(_KEYS, msgs))
    if any(keys):
        if max(map(len, keys)) > limits.max_key_count:
            return False
        distinct = set(chain.from_iterable(keys))
        if not all(map(_key_ok, distinct, repeat(limits))):
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
        if _properties_bytes(props) > limits.max_properties_bytes:
            return False
        texts = [*texts, *names]
    return _CONTROL.search("".join(texts)) is None


def validate_all(
    msgs: list[MessageRecord], topic: TopicInfo, limits: LimitsConfig, types: frozenset[MessageType] = _PLAIN_TYPES
) -> bool:
    """Check every message of a send against `topic` and `limits`, raising the first one's precise
    error; True when all are of `types` (NORMAL or FIFO unless told). A batch of `COLUMNS_MIN` or
    more goes column by column first (`plainly_valid`), fewer message by message, which costs less
    there (the one place this is decided)."""
    if len(msgs) >= COLUMNS_MIN and plainly_valid(msgs, topic, limits, types):
        return True
    for msg in msgs:
        validate_message(msg, topic, limits)
    return all(map(types.__contains__, map(_TYPE, msgs)))


def at_queues(msgs: list[MessageRecord], queue_ids: Iterable[int]) -> list[MessageRecord]:
    """`msgs`, each placed in its queue (lite topics and priority levels: a queue per message)."""
    for msg, queue_id in zip(msgs, queue_ids, strict=True):
        msg.queue_id = queue_id
    return msgs


def validate_queue(topic: TopicInfo, queue_id: int) -> None:
    if queue_id < 0 or queue_id >= topic.queue_count:
        raise BadRequest(
            f"queue {queue_id} does not exist: topic {topic.name} has queues 0..{topic.queue_count - 1} here"
        )
