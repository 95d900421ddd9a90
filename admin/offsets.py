"""`sluice admin group reset-offset`: move where a consumer group consumes a topic from.

For every queue of the topic (or one `--queue`, or the queues of one `--broker`) the target offset
is resolved on the broker holding it (earliest, latest, the first message stored at or after a
time, or a given offset clamped to what is stored), then set with `BrokerApi.reset_offset`. Safe
while consumers are connected: the broker applies each reset in one write between pops, messages
in flight of the queue are forgotten (their acks fail harmlessly), and the next receive starts at
the new offset. `--dry-run` shows the same table without changing anything.

`reset_offsets` is what the web console calls too; keep its signature stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from admin.cluster import Cluster
from admin.output import Report
from admin.parse import ResetTarget
from broker.client.api import GroupQueueStatus, OffsetPolicy
from broker.client.remote import RemoteBroker
from common.errors import BadRequest

RESET_COLUMNS = ["broker", "topic", "queue", "previous", "offset", "max_offset", "lag_after"]


@dataclass(frozen=True)
class _Plan:
    broker: str
    address: str
    queue: int
    previous: int
    offset: int
    max_offset: int


async def reset_offsets(
    cluster: Cluster,
    group: str,
    topic: str,
    target: ResetTarget,
    *,
    queue: int | None = None,
    broker: str | None = None,
    dry_run: bool = False,
) -> Report:
    """Reset `group`'s offsets of `topic` to `target`; with `dry_run`, only say what would change."""
    route = await cluster.route(topic)
    holders = [(b.broker_name, b.address, b.queue_count) for b in route.brokers]
    if broker is not None:
        holders = [h for h in holders if h[0] == broker]
        if not holders:
            names = ", ".join(b.broker_name for b in route.brokers)
            raise BadRequest(f"broker {broker} holds no queue of topic {topic}; its brokers: {names}")
    if queue is not None:
        if queue < 0 or all(queue >= count for _, _, count in holders):
            most = max(count for _, _, count in holders)
            raise BadRequest(f"topic {topic} has queues 0..{most - 1} per broker, not queue {queue}")
        holders = [h for h in holders if queue < h[2]]
    targets = [(name, address) for name, address, _ in holders]

    async def plan(b: RemoteBroker) -> list[_Plan]:
        count = next(c for n, _, c in holders if n == b.name)
        status = await b.group_status(group, [topic])
        current: dict[int, GroupQueueStatus] = {q.queue_id: q for q in status.queues if q.topic == topic}
        out = []
        for qid in [queue] if queue is not None else range(count):
            low = await b.query_offset(topic, qid, OffsetPolicy.BEGINNING)
            high = await b.query_offset(topic, qid, OffsetPolicy.END)
            wanted = await _resolve(b, topic, qid, target, low, high)
            q = current.get(qid)
            out.append(_Plan(b.name, b.address, qid, q.consumed_offset if q else low, wanted, high))
        return out

    plans = [p for per_broker in await cluster.on_each(targets, plan) for p in per_broker]
    if not dry_run:
        addresses = {p.broker: p.address for p in plans}

        async def apply(b: RemoteBroker) -> list[_Plan]:
            done = []
            for p in (p for p in plans if p.broker == b.name):
                reset = await b.reset_offset(group, topic, p.queue, p.offset)
                done.append(_Plan(p.broker, p.address, p.queue, reset.previous, reset.offset, p.max_offset))
            return done

        plans = [p for done in await cluster.on_each(list(addresses.items()), apply) for p in done]
    rows: list[dict[str, Any]] = [
        {"broker": p.broker, "topic": topic, "queue": p.queue, "previous": p.previous, "offset": p.offset,
         "max_offset": p.max_offset, "lag_after": max(0, p.max_offset - p.offset)}
        for p in plans
    ]  # fmt: skip
    moved = sum(1 for p in plans if p.previous != p.offset)
    verb = "would move" if dry_run else "moved"
    lag = sum(r["lag_after"] for r in rows)
    return Report(
        columns=RESET_COLUMNS,
        rows=rows,
        data={"group": group, "topic": topic, "to": target.kind, "dry_run": dry_run, "queues": rows, "lag_after": lag},
        note=f"group {group}, topic {topic}: {verb} {moved} of {len(rows)} queue(s); lag afterwards {lag}"
        + (" (dry run: nothing changed)" if dry_run else ""),
    )


async def _resolve(b: RemoteBroker, topic: str, qid: int, target: ResetTarget, low: int, high: int) -> int:
    if target.kind == "earliest":
        return low
    if target.kind == "latest":
        return high
    if target.kind == "time":
        return await b.query_offset(topic, qid, OffsetPolicy.TIMESTAMP, target.value)
    return max(low, min(target.value, high))
