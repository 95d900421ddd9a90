"""The streaming source's offsets: one exclusive end per (topic, broker, queue), as canonical JSON.

    {"queues": {"orders": {"broker-a": {"0": 120, "1": 98}}}, "version": 1}

Keys are sorted at every level (queue ids as strings, so `json.dumps(doc, sort_keys=True)` is the
same text), and an offset is the first message *not* read: a batch reads `[start, end)` of every
queue. With `failOnDataLoss=false`, a document also counts, per queue, the messages the query
skipped because retention removed them before it read them (`"lost"`, same shape, cumulative since
the checkpoint began; absent when nothing was lost): Spark shows the document in the query's
progress (`sources[].endOffset`), so a loss is never silent. Spark keeps these documents in the
query's checkpoint; a version this code does not know is refused rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import BadRequest

VERSION = 1
EARLIEST = -2  # in startingOffsets JSON, as Kafka's source: the oldest message still readable
LATEST = -1  # the acknowledged end when the query starts


@dataclass(frozen=True, order=True, slots=True)
class QueueKey:
    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic} queue {self.queue_id} on broker {self.broker}"


Positions = dict[QueueKey, int]


def _tree(positions: Mapping[QueueKey, int]) -> dict[str, dict[str, dict[str, int]]]:
    tree: dict[str, dict[str, dict[str, int]]] = {}
    for key in sorted(positions, key=lambda k: (k.topic, k.broker, str(k.queue_id))):
        tree.setdefault(key.topic, {}).setdefault(key.broker, {})[str(key.queue_id)] = positions[key]
    return tree


def to_json(positions: Mapping[QueueKey, int], lost: Mapping[QueueKey, int] | None = None) -> dict[str, Any]:
    """The canonical document of `positions` (and of the messages lost so far, when any were)."""
    doc: dict[str, Any] = {"queues": _tree(positions), "version": VERSION}
    if lost := {key: n for key, n in (lost or {}).items() if n > 0}:
        doc["lost"] = _tree(lost)
    return dict(sorted(doc.items()))


def lost_from_json(doc: Any) -> Positions:
    """The `lost` counts of a document `to_json` wrote (none: an empty dict)."""
    lost = doc.get("lost") if isinstance(doc, Mapping) else None
    return parse_tree(lost, "lost count", allow_special=False) if lost else {}


def from_json(doc: Any) -> Positions:
    """Positions of a document `to_json` wrote (a checkpoint's offsets); BadRequest if it is not one."""
    if not isinstance(doc, Mapping) or doc.get("version") != VERSION or not isinstance(doc.get("queues"), Mapping):
        raise BadRequest(
            f"not a sluice stream offset of version {VERSION}: {str(doc)[:200]} (a checkpoint of another source "
            "or of a newer Sluice)"
        )
    return parse_tree(doc["queues"], "offset", allow_special=False)


def parse_tree(tree: Any, what: str, *, allow_special: bool) -> Positions:
    """`{"topic": {"broker": {"queue": offset}}}`; with `allow_special`, offsets may be EARLIEST/LATEST."""
    lowest = EARLIEST if allow_special else 0
    out: Positions = {}
    if not isinstance(tree, Mapping):
        raise BadRequest(f"{what}: expected {{topic: {{broker: {{queue: offset}}}}}}, got {str(tree)[:200]}")
    for topic, brokers in tree.items():
        if not isinstance(brokers, Mapping):
            raise BadRequest(f"{what}: topic {topic!r} must map broker names to queues")
        for broker, queues in brokers.items():
            if not isinstance(queues, Mapping):
                raise BadRequest(f"{what}: broker {broker!r} of topic {topic!r} must map queue ids to offsets")
            for queue, offset in queues.items():
                try:
                    queue_id = int(queue)
                except ValueError:
                    raise BadRequest(f"{what}: queue id {queue!r} of {topic}/{broker} is not a number") from None
                if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest or queue_id < 0:
                    accepted = "an offset >= 0, -2 (earliest) or -1 (latest)" if allow_special else "an offset >= 0"
                    raise BadRequest(f"{what}: {topic}/{broker} queue {queue}: {offset!r} is not {accepted}")
                out[QueueKey(str(topic), str(broker), queue_id)] = offset
    return out
