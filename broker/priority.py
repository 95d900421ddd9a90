"""Priority topics (docs/priority.md): each priority level is a queue of its own on each broker.

A PRIORITY topic accepts messages whose system property `PRIORITY` is 0..`max_priority` (larger
is more urgent). A message of priority p is stored in queue `PRIORITY_QUEUE_BASE + p` of the topic
on the broker the producer chose (whatever queue it named), and a pop reads those queues highest
level first: within one broker, a consumer gets every visible message of a higher priority before
any of a lower one; across brokers the order is best effort (each pop asks one broker). A retry
stays in its level's queue, so it keeps its priority; a dead-lettered copy keeps the property.
"""

from __future__ import annotations

from broker.client.api import OutgoingMessage, TopicSpec
from common.errors import BadRequest, MessageTypeConflict
from common.model import SYSPROP_PRIORITY, MessageType

PRIORITY_QUEUE_BASE = 1 << 16
MAX_PRIORITY_LIMIT = 99


_PRIORITY_ONLY = frozenset({MessageType.PRIORITY})


def is_priority(spec: TopicSpec) -> bool:
    return spec.message_types == _PRIORITY_ONLY


def check_priority_spec(spec: TopicSpec) -> None:
    if not 0 <= spec.max_priority <= MAX_PRIORITY_LIMIT:
        raise BadRequest(f"max priority must be between 0 and {MAX_PRIORITY_LIMIT}, got {spec.max_priority}")
    if spec.message_types != frozenset({MessageType.PRIORITY}):
        raise MessageTypeConflict("a PRIORITY topic accepts only PRIORITY messages: do not combine it with other types")


def priority_of(msg: OutgoingMessage, spec: TopicSpec) -> int:
    """The message's priority, checked against the topic's range."""
    raw = msg.system_properties.get(SYSPROP_PRIORITY)
    if raw is None:
        raise BadRequest(f"topic {spec.name} is a PRIORITY topic: a message needs a priority (0..{spec.max_priority})")
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"priority {raw[:16]!r} is not a number") from None
    if not 0 <= value <= spec.max_priority:
        raise BadRequest(
            f"priority {value} is out of range: topic {spec.name} accepts priorities 0..{spec.max_priority}"
        )
    return value


def level_queue(priority: int) -> int:
    return PRIORITY_QUEUE_BASE + priority


def level_of(queue_id: int) -> int:
    return queue_id - PRIORITY_QUEUE_BASE


def pop_queues(spec: TopicSpec) -> list[int]:
    """The topic's level queues on a broker, most urgent first."""
    return [level_queue(p) for p in range(spec.max_priority, -1, -1)]
