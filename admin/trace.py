"""`sluice admin message trace --id ID`: the life of a message, from the trace every broker records.

Every registered broker is asked (a message id names no broker; its dead-letter copy stays on the
broker that held it). The table is a timeline, oldest first: sent (client, queue, offset), each
delivery to a consumer group with its attempt, invisible-duration changes, acks, the move to the
dead-letter topic, tiering. `--json` prints the events with every field, plus a per-group summary.
"""

from __future__ import annotations

from typing import Any

from admin.cluster import Cluster
from admin.output import Report, format_time_ms
from broker.client.api import TraceEvent, TraceKind
from common.errors import MessageNotFound

TRACE_COLUMNS = ["time", "event", "broker", "topic", "queue", "offset", "group", "attempt", "client", "detail"]


async def trace_message(cluster: Cluster, message_id: str) -> Report:
    brokers = await cluster.brokers()
    targets = [(b.broker_name, b.address) for b in brokers]
    answers = await cluster.on_each(targets, lambda remote: remote.message_trace(message_id))
    events = sorted(
        ((name, e) for (name, _), found in zip(targets, answers, strict=True) for e in found),
        key=lambda pair: pair[1].time_ms,
    )
    if not events:
        raise MessageNotFound(
            f"no trace of message {message_id} on any broker (unknown id, tracing off, "
            "or older than the trace's max age)"
        )
    rows = [_row(name, e) for name, e in events]
    summary = summarise([e for _, e in events])
    note = "; ".join(
        f"group {g}: delivered {s['deliveries']}x, " + ("acked" if s["acked"] else "dead-lettered" if s["dead_lettered"]
                                                      else "not acked")
        for g, s in summary.items()
    )  # fmt: skip
    data = {"message_id": message_id, "events": [_json(n, e) for n, e in events], "groups": summary}
    return Report(columns=TRACE_COLUMNS, rows=rows, data=data, note=note)


def summarise(events: list[TraceEvent]) -> dict[str, dict[str, Any]]:
    """Per consumer group: deliveries, whether it was acked or dead-lettered."""
    groups: dict[str, dict[str, Any]] = {}
    for e in events:
        if not e.group:
            continue
        g = groups.setdefault(e.group, {"deliveries": 0, "acked": False, "dead_lettered": False, "dlq_topic": ""})
        if e.kind is TraceKind.DELIVERED:
            g["deliveries"] += 1
        elif e.kind is TraceKind.ACKED:
            g["acked"] = True
        elif e.kind is TraceKind.DEAD_LETTERED:
            g["dead_lettered"] = True
            g["dlq_topic"] = e.detail.get("dlq_topic", "")
    return groups


def _row(broker: str, e: TraceEvent) -> dict[str, Any]:
    return {
        "time": format_time_ms(e.time_ms),
        "event": e.kind.value,
        "broker": broker,
        "topic": e.topic,
        "queue": e.queue_id,
        "offset": e.queue_offset,
        "group": e.group,
        "attempt": e.attempt or "",
        "client": e.client_id,
        "detail": e.detail,
    }


def _json(broker: str, e: TraceEvent) -> dict[str, Any]:
    return {
        "broker": broker,
        "event": e.kind.value,
        "time_ms": e.time_ms,
        "time": format_time_ms(e.time_ms),
        "topic": e.topic,
        "queue_id": e.queue_id,
        "queue_offset": e.queue_offset,
        "message_id": e.message_id,
        "group": e.group,
        "attempt": e.attempt,
        "client_id": e.client_id,
        "detail": e.detail,
    }
