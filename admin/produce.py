"""`sluice admin message send|tail|list`: produce, follow and browse a topic from the shell.

These talk to the brokers directly (as every admin command does, with the cluster token), not to
a proxy: no client session, no access rules of the proxies (the cluster token is the admin's
credential). A send picks a writable queue the way a proxy does (round robin; a message group
always maps to the same queue). `tail` and `list` read with Pull, which changes no consumer
group's state; `tail --ack --group G` consumes as group G instead (pop and ack, like a client).

`send_messages`, `tail_messages` and `list_messages` are what the web console calls too.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from admin.cluster import Cluster
from admin.messages import MESSAGE_COLUMNS, message_json, message_row
from admin.output import Report, cell, format_time_ms
from broker.client.api import (
    CallContext,
    FilterSpec,
    OffsetPolicy,
    PopRequest,
    StoredMessage,
)
from broker.client.remote import RemoteBroker
from common import record
from common.errors import BadRequest, Forbidden, MessageTypeConflict
from common.model import MessageType
from nameserver.model import TopicRoute
from proxy.core.routing import QueueSelector
from proxy.directory import BrokerRoute

ADMIN_CLIENT_ID = "sluice-admin"
_ADMIN = CallContext(client_id=ADMIN_CLIENT_ID)  # the producer the trace names for admin sends
BROWSE_GROUP = "sluice-admin-browse"  # Pull needs a group name; it keeps no state for it
TAIL_BATCH = 32
TAIL_IDLE_S = 0.5  # between rounds that found nothing
TAIL_POP_INVISIBLE_MS = 30_000
TAIL_POP_LONG_POLL_MS = 1_000
MAX_LIST_COUNT = 1_000
SENT_COLUMNS = ["message_id", "broker", "queue", "offset", "type", "bytes"]
# What makes `sluice admin message send` send each type, for the hint of a type conflict.
SEND_FLAGS = {
    MessageType.NORMAL: "neither --message-group nor --deliver-at (a NORMAL message)",
    MessageType.FIFO: "--message-group MG (a FIFO message; MG orders messages among themselves)",
    MessageType.DELAY: "--deliver-at TIME (a DELAY message)",
}


@dataclass(frozen=True)
class SendOptions:
    tag: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str | None = None  # FIFO
    deliver_at_ms: int = 0  # DELAY


def new_message_id() -> str:
    return "01" + uuid.uuid4().hex.upper()


def _routes(route: TopicRoute) -> list[BrokerRoute]:
    return [BrokerRoute(b.broker_name, b.queue_count, b.permission, b.message_types) for b in route.brokers]


async def send_messages(cluster: Cluster, topic: str, bodies: Iterable[bytes], options: SendOptions) -> Report:
    """Send each body as one message of `topic`; one row per message: where it was stored."""
    route = await cluster.route(topic)
    addresses = {b.broker_name: b.address for b in route.brokers}
    routes = _routes(route)
    selector = QueueSelector()
    mtype = (
        MessageType.DELAY
        if options.deliver_at_ms
        else MessageType.FIFO
        if options.message_group
        else MessageType.NORMAL
    )
    host = socket.gethostname()
    rows: list[dict[str, Any]] = []
    for body in bodies:
        broker_name, queue_id = selector.pick(topic, routes, options.message_group)
        msg = record.outgoing(
            body=body, message_id=new_message_id(), message_type=mtype, tag=options.tag, keys=options.keys,
            message_group=options.message_group, properties=dict(options.properties),
            born_timestamp_ms=int(time.time() * 1000),
            born_host=host, delivery_timestamp_ms=options.deliver_at_ms,
        )  # fmt: skip
        broker = cluster.broker(broker_name, addresses[broker_name])
        try:
            (result,) = await broker.send(topic, queue_id, [msg], ctx=_ADMIN)
        except Forbidden as exc:
            raise Forbidden(f"broker {broker_name}: {exc}") from None
        except MessageTypeConflict as exc:
            accepted = next(b.message_types for b in route.brokers if b.broker_name == broker_name)
            raise MessageTypeConflict(f"{exc}; {type_hint(accepted)}") from None
        rows.append({"message_id": result.message_id, "broker": broker_name, "queue": result.queue_id,
                     "offset": result.queue_offset, "type": mtype.name.lower(), "bytes": len(body)})  # fmt: skip
    if not rows:
        raise BadRequest("nothing to send: give a BODY, --file, or lines on stdin")
    return Report(columns=SENT_COLUMNS, rows=rows, note=f"{len(rows)} message(s) sent to {topic}")


def type_hint(accepted: Iterable[MessageType]) -> str:
    """Which flags send a message of a type the topic accepts (the broker's refusal names no flag)."""
    flags = [SEND_FLAGS[t] for t in sorted(accepted) if t in SEND_FLAGS]
    if not flags:
        return "sluice admin message send cannot send the types this topic accepts: use a client"
    return "send with " + ", or with ".join(flags)


async def list_messages(
    cluster: Cluster, topic: str, queue: int, from_offset: int, count: int, broker: str | None = None
) -> Report:
    """Up to `count` messages of queue `queue` from `from_offset` on, on every broker holding it
    (or `broker`), without touching any consumer group."""
    if not 1 <= count <= MAX_LIST_COUNT:
        raise BadRequest(f"--count must be between 1 and {MAX_LIST_COUNT}, got {count}")
    if from_offset < 0:
        raise BadRequest(f"--from-offset must not be negative, got {from_offset}")
    route = await cluster.route(topic)
    holders = [(b.broker_name, b.address) for b in route.brokers
               if (broker is None or b.broker_name == broker) and queue < b.queue_count]  # fmt: skip
    if not holders:
        raise BadRequest(
            f"no broker{'' if broker is None else ' named ' + broker} holds queue {queue} of topic {topic}; its "
            f"brokers and queues: {', '.join(f'{b.broker_name} 0..{b.queue_count - 1}' for b in route.brokers)}"
        )

    async def read(b: RemoteBroker) -> list[StoredMessage]:
        got: list[StoredMessage] = []
        offset = from_offset
        while len(got) < count:
            res = await b.pull(BROWSE_GROUP, topic, queue, offset, min(TAIL_BATCH, count - len(got)), FilterSpec())
            got.extend(res.messages)
            if res.next_offset <= offset or res.next_offset >= res.max_offset:
                break
            offset = res.next_offset
        return got[:count]

    found = [(n, m) for (n, _), msgs in zip(holders, await cluster.on_each(holders, read), strict=True) for m in msgs]
    return Report(
        columns=MESSAGE_COLUMNS,
        rows=[message_row(n, m) for n, m in found],
        data=[message_json(n, m) for n, m in found],
        note=f"{len(found)} message(s) of {topic} queue {queue} from offset {from_offset}",
    )


@dataclass
class TailOptions:
    start: str = "latest"  # "latest", "earliest", "time", "group" (the group's consumed offsets)
    start_ms: int = 0
    group: str | None = None
    ack: bool = False  # consume as `group` (pop and ack) instead of reading with Pull
    count: int = 0  # stop after this many messages (0: never)
    for_s: float = 0.0  # stop after this long (0: never)


async def tail_messages(
    cluster: Cluster,
    topic: str,
    options: TailOptions,
    emit: Callable[[str, StoredMessage], None],
    on_start: Callable[[], None] = lambda: None,
) -> int:
    """Call `emit(broker, message)` for every message of `topic` as it arrives; returns how many.
    `on_start()` once it knows where to start (its start offsets taken), before the first `emit`."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address, b.queue_count) for b in route.brokers]
    deadline = time.monotonic() + options.for_s if options.for_s > 0 else float("inf")
    seen = 0

    def done() -> bool:
        return (options.count > 0 and seen >= options.count) or time.monotonic() >= deadline

    if options.ack:
        if not options.group:
            raise BadRequest("--ack consumes as a group: give --group")
        on_start()
        while not done():
            for name, address, _ in targets:
                b = cluster.broker(name, address)
                wait_ms = int(min(TAIL_POP_LONG_POLL_MS, max(0.0, deadline - time.monotonic()) * 1000))
                want = TAIL_BATCH if options.count <= 0 else max(1, min(TAIL_BATCH, options.count - seen))
                msgs = await b.pop(PopRequest(options.group, topic, None, want, TAIL_POP_INVISIBLE_MS, FilterSpec(),
                                              wait_ms))  # fmt: skip
                if msgs:
                    await b.ack(options.group, topic, [m.receipt_handle for m in msgs])
                for m in msgs:
                    emit(name, m)
                seen += len(msgs)
                if done():
                    break
        return seen
    cursors = await _start_offsets(cluster, topic, targets, options)
    on_start()
    while not done():
        found = False
        for (name, qid), offset in list(cursors.items()):
            address = next(a for n, a, _ in targets if n == name)
            res = await cluster.broker(name, address).pull(BROWSE_GROUP, topic, qid, offset, TAIL_BATCH, FilterSpec())
            cursors[(name, qid)] = max(offset, res.next_offset)
            for m in res.messages:
                if done():
                    break
                emit(name, m)
                seen += 1
                found = True
        if not found and not done():
            await asyncio.sleep(min(TAIL_IDLE_S, max(0.0, deadline - time.monotonic())))
    return seen


async def _start_offsets(
    cluster: Cluster, topic: str, targets: Sequence[tuple[str, str, int]], options: TailOptions
) -> dict[tuple[str, int], int]:
    cursors: dict[tuple[str, int], int] = {}
    for name, address, count in targets:
        b = cluster.broker(name, address)
        if options.start == "group":
            assert options.group is not None
            status = await b.group_status(options.group, [topic])
            consumed = {q.queue_id: q.consumed_offset for q in status.queues if q.topic == topic}
        for qid in range(count):
            if options.start == "group":
                cursors[(name, qid)] = consumed.get(qid, 0)
            elif options.start == "earliest":
                cursors[(name, qid)] = await b.query_offset(topic, qid, OffsetPolicy.BEGINNING)
            elif options.start == "time":
                cursors[(name, qid)] = await b.query_offset(topic, qid, OffsetPolicy.TIMESTAMP, options.start_ms)
            else:
                cursors[(name, qid)] = await b.query_offset(topic, qid, OffsetPolicy.END)
    return cursors


# Column widths of `message tail`'s rows, printed before any message is known: a cell as wide as
# the widest usual value (a message id is 34 characters, a stored time 24); a longer cell pushes
# the rest of its row only.
TAIL_WIDTHS = {"broker": 10, "queue": 5, "offset": 8, "message_id": 34, "tag": 10, "keys": 12, "stored": 24,
               "bytes": 6}  # fmt: skip


def tail_header() -> str:
    return _tail_cells({c: c.upper() for c in MESSAGE_COLUMNS})


def tail_line(broker: str, m: StoredMessage, as_json: bool) -> str:
    """One printed line per message: JSON (every field) or the row of the table tail_header heads."""
    if as_json:
        return json.dumps(message_json(broker, m))
    row = message_row(broker, m)
    return _tail_cells({c: cell(row[c]) for c in MESSAGE_COLUMNS})


def _tail_cells(cells: dict[str, str]) -> str:
    return "  ".join(cells[c].ljust(TAIL_WIDTHS.get(c, 0)) for c in MESSAGE_COLUMNS).rstrip()


def tail_start(topic: str, options: TailOptions) -> str:
    """What `message tail` is about to do, in one line (it may wait a long time before a row)."""
    where = {
        "latest": "messages arriving from now on",
        "earliest": "from the first stored message",
        "time": f"from {format_time_ms(options.start_ms)}",
        "group": f"from group {options.group}'s consumed offsets",
    }[options.start]
    how = f"consuming as group {options.group} (acknowledging)" if options.ack else where
    stop = [f"{options.count} message(s)"] if options.count else []
    stop += [f"{options.for_s:g} s"] if options.for_s else []
    until = f"stops after {' or '.join(stop)}" if stop else "Ctrl-C stops"
    hint = "; --from earliest shows what is stored" if options.start == "latest" and not options.ack else ""
    return f"tailing {topic}: {how}; {until}{hint}"
