"""Domain types shared by the broker, the NameServer and the proxy.

Enum numbers equal the protocol's (`apache.rocketmq.v2.MessageType`, `Permission`) so edges convert
by value, but nothing here depends on protobuf.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import IntEnum

from common.errors import IllegalConsumerGroup, IllegalLiteTopic, IllegalTopic
from common.litefilter import validate_filter


class MessageType(IntEnum):
    NORMAL = 1
    FIFO = 2
    DELAY = 3
    TRANSACTION = 4
    LITE = 5  # a message of a lite topic inside a LITE (bind) topic: docs/lite-topics.md
    PRIORITY = 6  # a message with a priority, for a PRIORITY topic: docs/priority.md

    @classmethod
    def parse(cls, text: str) -> MessageType:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            allowed = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"unknown message type {text!r}; use one of {allowed}") from None


# A stored or wire type number as its MessageType (`.get`: None for a number no type has).
MESSAGE_TYPES: dict[int, MessageType] = {int(t): t for t in MessageType}

# The types a topic may mix ("mixed" topics, auto-created topics). LITE and PRIORITY topics accept
# only their own type: their messages are stored in queues of their own (lite topics, levels).
ALL_MESSAGE_TYPES: frozenset[MessageType] = frozenset(
    (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)
)
EXCLUSIVE_TYPES: frozenset[MessageType] = frozenset((MessageType.LITE, MessageType.PRIORITY))
# A topic created on first use before its first message: it accepts every type until that message
# decides (`auto_types`), so clients that check a message's type against the route send it.
UNDECIDED_TYPES: frozenset[MessageType] = frozenset(MessageType)


def auto_types(first: MessageType) -> frozenset[MessageType]:
    """What a topic created on first use accepts once a message of type `first` decided it: a LITE
    or PRIORITY topic for such a message, else a topic of the four ordinary types."""
    return frozenset({first}) if first in EXCLUSIVE_TYPES else ALL_MESSAGE_TYPES


class Permission(IntEnum):
    NONE = 1
    READ = 2
    WRITE = 3
    READ_WRITE = 4

    @property
    def readable(self) -> bool:
        return self in (Permission.READ, Permission.READ_WRITE)

    @property
    def writable(self) -> bool:
        return self in (Permission.WRITE, Permission.READ_WRITE)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as one broker holds it: the queues [0, queue_count) of this topic live on that broker."""

    name: str
    queue_count: int
    permission: Permission = Permission.READ_WRITE
    message_types: frozenset[MessageType] = field(default_factory=lambda: frozenset({MessageType.NORMAL}))


# Names: the protocol's rules for topics and groups (letters, digits, %, -, _, | up to 127 chars);
# names starting with % are reserved for system topics (retry, DLQ) and cannot be created by users.
_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
DLQ_PREFIX = "%DLQ%"
SYSTEM_PREFIX = "%"
# Pulls by groups named so are the admin tool's and console's own reads (message search, tail
# without a group, dead-letter listing): no group state, and not counted as deliveries.
ADMIN_READ_GROUP_PREFIX = "sluice-admin-"


def validate_topic_name(name: str, *, allow_system: bool = False) -> str:
    if not name:
        raise IllegalTopic("topic name is empty")
    if not _NAME_RE.match(name):
        raise IllegalTopic(
            f"topic name {name[:64]!r} is invalid: use 1-127 characters from letters, digits, '-', '_', '%', '|'"
        )
    if name.startswith(SYSTEM_PREFIX) and not allow_system:
        raise IllegalTopic(f"topic name {name!r} is reserved: names starting with '%' are system topics")
    return name


def is_system_topic(name: str) -> bool:
    """A topic brokers create for themselves (dead letters): never created on first use by a client."""
    return name.startswith(SYSTEM_PREFIX)


def validate_group_name(name: str) -> str:
    if not name:
        raise IllegalConsumerGroup("consumer group name is empty")
    if not _NAME_RE.match(name) or name.startswith(SYSTEM_PREFIX):
        raise IllegalConsumerGroup(
            f"consumer group name {name[:64]!r} is invalid: use 1-127 characters from letters, digits, '-', '_'"
        )
    return name


# Lite topic names: letters, digits and "-_.:@#=/", up to a length the server announces to lite consumers
# (Settings.max_lite_topic_size) and enforces. "/" separates the levels filter subscriptions match
# (common/litefilter.py; the MQTT gateway's topics, docs/mqtt.md).
_LITE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@#=/-]+$")
_LITE_FILTER_RE = re.compile(r"^[A-Za-z0-9_.:@#=/+-]+$")


def validate_lite_topic_name(name: str, max_chars: int) -> str:
    if not name:
        raise IllegalLiteTopic("lite topic name is empty")
    if len(name) > max_chars:
        raise IllegalLiteTopic(f"lite topic name {name[:32]!r}... is {len(name)} characters long; at most {max_chars}")
    if not _LITE_NAME_RE.match(name):
        raise IllegalLiteTopic(
            f"lite topic name {name[:64]!r} is invalid: use letters, digits and '-', '_', '.', ':', '@', '#', '=', '/'"
        )
    return name


def validate_lite_filter(text: str, max_chars: int) -> str:
    """A filter subscription to lite topics (common/litefilter.py): a lite topic name whose levels
    may be `+`, or `#` as the last one."""
    if len(text) > max_chars:
        raise IllegalLiteTopic(f"lite topic filter {text[:32]!r}... is {len(text)} characters long; "
                               f"at most {max_chars}")  # fmt: skip
    if not _LITE_FILTER_RE.match(text):
        raise IllegalLiteTopic(f"lite topic filter {text[:64]!r} is invalid: use the characters of lite topic names "
                               "and '+'")  # fmt: skip
    return validate_filter(text)


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


def require_field_order(cls: type, names: tuple[str, ...]) -> None:
    """Fail the import unless dataclass `cls` declares exactly `names`, in this order: for hot paths
    that build `cls` positionally (keywords cost about a microsecond more per object)."""
    if tuple(f.name for f in fields(cls)) != names:
        raise ImportError(f"{cls.__name__}'s fields changed: update the code that builds it positionally ({names})")
