"""Priority topics (docs/priority.md): each priority level is a queue of its own on each broker.

A PRIORITY topic accepts messages whose system property `PRIORITY` is 0..`max_priority` (larger
is more urgent). A message of priority p is stored in queue `PRIORITY_QUEUE_BASE + p` of the topic
on the broker the producer chose (whatever queue it named), and a pop reads those queues highest
level first: within one broker, a consumer gets every visible message of a higher priority before
any of a lower one; across brokers the order is best effort (each pop asks one broker). A retry
stays in its level's queue, so it keeps its priority; a dead-lettered copy keeps the property.
"""

from __future__ import annotations

from broker.client.api import TopicSpec
from common.errors import BadRequest, MessageTypeConflict
from common.model import MessageType
from common.record import SYSPROP_PRIORITY, MessageRecord

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


def priority_of(msg: MessageRecord, spec: TopicSpec) -> int:
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


class EmptyLevels:
    """The level queues a group has consumed to their end, until a dispatch writes to them again.

    A pop of a priority topic looks at its levels most urgent first. Once the urgent levels are
    drained, reading each of them again on every pop (a cursor get and a ConsumeQueue seek per level)
    is most of a pop's cost when a low level holds the backlog. A group's pop that took nothing from
    a level and found its cursor at the level's end marks it empty for the group, at the level's
    dispatch count; later pops skip it until a dispatch into the level counts one more. Redeliveries
    come from the due index, never from here. Memory: one entry per (topic, level) written and per
    (group, topic, level) drained; event-loop thread only (the dispatch count moves when the
    broker's dispatch listener runs there).
    """

    def __init__(self) -> None:
        self._writes: dict[tuple[str, int], int] = {}  # (topic, level queue) -> dispatches seen
        self._drained: dict[tuple[str, str, int], int] = {}  # (group, topic, level queue) -> count when drained

    def dispatched(self, topic: str, queue_id: int) -> None:
        key = (topic, queue_id)
        self._writes[key] = self._writes.get(key, 0) + 1

    def drained(self, group: str, topic: str, queue_id: int) -> None:
        self._drained[(group, topic, queue_id)] = self._writes.get((topic, queue_id), 0)

    def is_drained(self, group: str, topic: str, queue_id: int) -> bool:
        seen = self._drained.get((group, topic, queue_id))
        return seen is not None and seen == self._writes.get((topic, queue_id), 0)

    def forget(self, group: str | None, topic: str | None) -> None:
        """Look at levels again: of one topic or all (None), for one group or every group (None).
        Offsets were reset, the group is gone, or the topic is (which also forgets its counts)."""
        for key in [k for k in self._drained if (topic is None or k[1] == topic) and (group is None or k[0] == group)]:
            del self._drained[key]
        if group is None and topic is not None:
            for wkey in [k for k in self._writes if k[0] == topic]:
                del self._writes[wkey]
