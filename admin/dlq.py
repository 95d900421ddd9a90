"""`sluice admin dlq list|resend`: the dead letters of a consumer group, and sending them again.

`list` without a group lists the groups that have dead letters, with how many each has (the
messages stored in its `%DLQ%<group>` topic), as the console's dead-letter page does.

A message that runs out of delivery attempts is copied to the group's dead-letter topic
`%DLQ%<group>` with system properties naming where it came from (`DLQ_ORIGIN_TOPIC`,
`DLQ_ORIGIN_QUEUE_ID`, `DLQ_ORIGIN_QUEUE_OFFSET`) and how often it was delivered
(`DLQ_DELIVERY_ATTEMPTS`). `list` reads the dead-letter topic on every broker of its route with
`pull` (which moves no group's offset), at most `DLQ_READ_MAX` messages.

`resend` sends each chosen dead letter again as a *new* message (new message id) to its origin
topic or to `to`, with the user property `RESENT_FROM_PROPERTY` naming the original id. FIFO
messages keep their message group; DELAY and transactional ones are resent as plain messages (their
moment has passed; their transaction was committed). The dead letter itself stays in the
dead-letter topic (a topic is append-only): a later `list` marks it resent only through the new
message's property, so `resend --all` twice sends everything twice. Every id is checked before
anything is sent: an unknown id sends nothing.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from admin.cluster import Cluster
from admin.output import Report, format_time_ms, preview
from broker.client.api import FilterSpec, StoredMessage
from common import record
from common.errors import BadRequest, MessageNotFound, NotFound, TopicNotFound
from common.model import DLQ_PREFIX, MessageType, dlq_topic, validate_group_name, validate_topic_name
from common.record import (
    SYSPROP_DLQ_ATTEMPTS,
    SYSPROP_DLQ_ORIGIN_OFFSET,
    SYSPROP_DLQ_ORIGIN_QUEUE,
    SYSPROP_DLQ_ORIGIN_TOPIC,
)

DLQ_READ_MAX = 10_000  # dead letters read per list (a console page shows a slice of them)
_PULL_BATCH = 256
# The pull of a dead-letter topic names a group (the RPC needs one); it is never created and no
# offset of it is stored.
BROWSE_GROUP = "sluice-admin-dlq-browse"
RESENT_FROM_PROPERTY = "SLUICE_RESENT_FROM"
DLQ_COLUMNS = ["message_id", "origin_topic", "origin_queue", "origin_offset", "attempts", "dead_lettered", "tag",
               "keys", "bytes", "body"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class DeadLetter:
    broker: str
    message: StoredMessage

    @property
    def origin_topic(self) -> str:
        return self.message.system_properties.get(SYSPROP_DLQ_ORIGIN_TOPIC, "")

    def to_row(self) -> dict[str, Any]:
        m, sys = self.message, self.message.system_properties
        return {
            "message_id": m.message_id,
            "origin_topic": self.origin_topic,
            "origin_queue": _int(sys.get(SYSPROP_DLQ_ORIGIN_QUEUE)),
            "origin_offset": _int(sys.get(SYSPROP_DLQ_ORIGIN_OFFSET)),
            "attempts": _int(sys.get(SYSPROP_DLQ_ATTEMPTS)),
            "dead_lettered": format_time_ms(m.store_timestamp_ms),
            "tag": m.tag,
            "keys": list(m.keys),
            "bytes": len(m.body),
            "body": preview(m.body),
            "broker": self.broker,
            "dlq_queue": m.queue_id,
            "dlq_offset": m.queue_offset,
        }


async def read_dead_letters(cluster: Cluster, group: str, limit: int = DLQ_READ_MAX) -> list[DeadLetter]:
    """The dead letters of `group`, oldest first per broker; [] when nothing was ever dead-lettered."""
    validate_group_name(group)
    topic = dlq_topic(group)
    try:
        route = await cluster.route(topic)
    except TopicNotFound:
        return []
    found: list[DeadLetter] = []
    for broker in route.brokers:
        remote = cluster.broker(broker.broker_name, broker.address)
        status = await remote.topic_status(topic)
        for queue in status.queues:
            offset = queue.min_offset
            while offset < queue.max_offset and len(found) < limit:
                want = min(_PULL_BATCH, limit - len(found))
                result = await remote.pull(BROWSE_GROUP, topic, queue.queue_id, offset, want, FilterSpec())
                found.extend(DeadLetter(broker.broker_name, m) for m in result.messages[:want])
                if result.next_offset <= offset:
                    break
                offset = result.next_offset
    return found


async def list_dead_letters(cluster: Cluster, group: str, limit: int = DLQ_READ_MAX) -> Report:
    letters = await read_dead_letters(cluster, group, limit)
    rows = [d.to_row() for d in letters]
    more = " (the first ones only)" if len(letters) >= limit else ""
    return Report(columns=DLQ_COLUMNS, rows=rows, data={"group": group, "dead_letters": rows},
                  note=f"group {group}: {len(rows)} dead letter(s){more}")  # fmt: skip


async def list_dead_letter_groups(cluster: Cluster) -> Report:
    """Every group with a dead-letter topic: how many dead letters it holds, on which brokers."""
    rows: list[dict[str, Any]] = []
    for summary in await cluster.topics():
        if not summary.name.startswith(DLQ_PREFIX):
            continue
        rows.append({"group": summary.name[len(DLQ_PREFIX) :], "dead_letters": await _stored(cluster, summary.name),
                     "brokers": list(summary.broker_names)})  # fmt: skip
    rows.sort(key=lambda r: r["group"])
    return Report(columns=["group", "dead_letters", "brokers"], rows=rows,
                  note=f"{len(rows)} group(s) with dead letters; `dlq list GROUP` shows them")  # fmt: skip


async def dead_letter_count(cluster: Cluster, group: str) -> int:
    """Messages stored in the group's dead-letter topic `%DLQ%<group>` (0 when it has none: the
    topic is created with the first dead letter). Asks for the route, not the topic list: a cached
    list (the console keeps one for a second) can predate the first dead letter, and a missing
    topic's answer is never cached."""
    try:
        return await _stored(cluster, dlq_topic(group))
    except TopicNotFound:
        return 0


async def _stored(cluster: Cluster, topic: str) -> int:
    """Messages `topic` holds now, on every broker of its route."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    statuses = await cluster.on_each(targets, lambda b: b.topic_status(topic))
    return sum(q.max_offset - q.min_offset for status in statuses for q in status.queues)


async def resend(cluster: Cluster, group: str, ids: Sequence[str] | None, to: str | None = None) -> Report:
    """Send the dead letters with `ids` (None: all) again, to their origin topic or `to`."""
    if to is not None:
        validate_topic_name(to)
    if ids is not None and not ids:
        raise BadRequest("name at least one message id, or resend all")
    letters = await read_dead_letters(cluster, group)
    chosen = _choose(letters, ids, group)
    if not chosen:
        return Report(columns=["message_id", "new_message_id", "topic"], note=f"group {group}: no dead letters")
    by_topic: dict[str, list[DeadLetter]] = {}
    for letter in chosen:
        target = to or letter.origin_topic
        if not target:
            raise BadRequest(f"dead letter {letter.message.message_id} names no origin topic; give a topic to send to")
        by_topic.setdefault(target, []).append(letter)
    rows: list[dict[str, Any]] = []
    for topic, batch in by_topic.items():
        rows.extend(await _send_again(cluster, topic, batch))
    return Report(columns=["message_id", "new_message_id", "topic", "queue", "offset"], rows=rows,
                  data={"group": group, "resent": rows},
                  note=f"group {group}: {len(rows)} dead letter(s) resent")  # fmt: skip


def _choose(letters: list[DeadLetter], ids: Sequence[str] | None, group: str) -> list[DeadLetter]:
    if ids is None:
        return letters
    by_id: dict[str, DeadLetter] = {}
    for letter in letters:
        by_id.setdefault(letter.message.message_id, letter)
    missing = [i for i in dict.fromkeys(ids) if i not in by_id]
    if missing:
        raise MessageNotFound(f"no dead letter of group {group} has id {', '.join(missing)}; nothing was resent")
    return [by_id[i] for i in dict.fromkeys(ids)]


async def _send_again(cluster: Cluster, topic: str, letters: list[DeadLetter]) -> list[dict[str, Any]]:
    try:
        route = await cluster.route(topic)
    except TopicNotFound:
        raise TopicNotFound(f"topic {topic} does not exist; nothing of it was resent") from None
    queues = [(b.broker_name, b.address, q) for b in route.brokers for q in range(b.queue_count)]
    if not queues:
        raise NotFound(f"topic {topic} has no queues")
    spread = itertools.cycle(queues)
    rows = []
    for letter in letters:
        name, address, queue_id = next(spread)
        new_id = new_message_id()
        (result,) = await cluster.broker(name, address).send(topic, queue_id, [_copy_of(letter.message, new_id)])
        rows.append({"message_id": letter.message.message_id, "new_message_id": new_id,
                     "topic": topic, "queue": queue_id, "offset": result.queue_offset})  # fmt: skip
    return rows


def _copy_of(m: StoredMessage, message_id: str) -> bytes:
    """The record that resends a dead letter under `message_id`: the message as its producer sent it
    (`common.record.outgoing_copy`: every field an edge record carries, so a new field is carried
    too), as a new message: the original id as `RESENT_FROM_PROPERTY`, born now, FIFO only with a
    group, otherwise NORMAL and due at once; the dead letter's system properties (its DLQ origin)
    are not the new message's."""
    fifo = m.message_type is MessageType.FIFO and bool(m.message_group)
    return record.outgoing_copy(
        m.record,
        message_id=message_id,
        message_type=MessageType.FIFO if fifo else MessageType.NORMAL,
        message_group=m.message_group if fifo else None,
        properties={**m.properties, RESENT_FROM_PROPERTY: m.message_id},
        system_properties={},
        born_timestamp_ms=int(time.time() * 1000),
        delivery_timestamp_ms=0,
    )


def new_message_id() -> str:
    """A fresh id in the clients' shape (version byte 01, 16 random bytes, upper-case hex)."""
    return "01" + uuid.uuid4().hex.upper()


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None
