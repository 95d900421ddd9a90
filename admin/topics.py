"""`sluice admin topic create|list|describe|delete`.

A topic's queues are spread over brokers (`parse.spread_queues`): each chosen broker holds queue
ids 0..share-1. Create and delete return only once the NameServer route shows the change.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Awaitable

from admin.cluster import Cluster
from admin.output import Report, format_types
from admin.parse import spread_queues
from broker.client.api import TopicSpec, TopicStatus
from broker.client.remote import RemoteBroker
from common.errors import BadRequest, PreconditionFailed, TopicNotFound
from common.model import MessageType, Permission
from nameserver.model import TopicRoute

LARGEST_LITE_TOPICS = 10


async def create_topic(
    cluster: Cluster,
    name: str,
    message_types: frozenset[MessageType],
    queue_count: int,
    broker_names: list[str] | None = None,
    attributes: dict[str, int] | None = None,
    *,
    update: bool = False,
) -> Report:
    """Create `name` with `queue_count` queues over `broker_names` (default: every registered broker).

    A topic that exists is refused (PRECONDITION_FAILED, saying what it is now) unless `update`:
    then it is changed to the spec given (queues only grow; permissions stay) and the note says what
    changed. A broker that holds a copy of another definition although the route showed none (a
    proxy created the topic on first use meanwhile) refuses too, naming both definitions.
    """
    try:
        existing: TopicRoute | None = await cluster.route(name)
    except TopicNotFound:
        existing = None
    if existing is not None and not update:
        raise PreconditionFailed(
            f"topic {name} already exists ({_describe_route(existing)}); give --update to change it to "
            f"{queue_count} queue(s) of {format_types(message_types)}"
        )
    registered = {b.broker_name: b.address for b in await cluster.brokers()}
    chosen = sorted(registered) if broker_names is None else broker_names
    unknown = [n for n in chosen if n not in registered]
    if unknown:
        raise BadRequest(
            f"broker(s) {', '.join(unknown)} not registered with the NameServer; registered: {', '.join(registered)}"
        )
    shares = spread_queues(queue_count, chosen)
    kept = {b.broker_name: b.permission for b in existing.brokers} if existing is not None else {}
    attrs = attributes or {}  # max_priority, lite_expiration_s, max_lite_topics
    specs = {n: TopicSpec(name, shares[n], message_types, kept.get(n, Permission.READ_WRITE), **attrs)
             for n in chosen}  # fmt: skip

    def save(b: RemoteBroker) -> Awaitable[TopicSpec]:
        # A creation never changes a copy a broker holds (it refuses one of another definition: a
        # proxy may have created the topic on first use since the check above); an update does.
        return b.update_topic(specs[b.name]) if b.name in kept else b.create_topic(specs[b.name])

    await cluster.on_each([(n, registered[n]) for n in chosen], save)

    def shown(route: TopicRoute | None) -> bool:
        held = {b.broker_name: b.queue_count for b in route.brokers} if route else {}
        return all(held.get(n) == shares[n] for n in chosen)

    await cluster.wait_for_route(name, shown, f"topic {name} was created on {', '.join(chosen)}")
    rows = [
        {
            "broker": n,
            "address": registered[n],
            "queues": shares[n],
            "queue_ids": f"0..{shares[n] - 1}",
            "types": format_types(message_types),
        }
        for n in chosen
    ]
    return Report(
        columns=["broker", "address", "queues", "queue_ids", "types"],
        rows=rows,
        data={"topic": name, "queue_count": queue_count, "message_types": format_types(message_types), "brokers": rows},
        note=f"topic {name} created: {queue_count} queue(s) on {len(chosen)} broker(s)"
        if existing is None
        else f"topic {name} updated: {_changes(existing, shares, message_types)}",
    )


def _describe_route(route: TopicRoute) -> str:
    queues = sum(b.queue_count for b in route.brokers)
    types = format_types({t for b in route.brokers for t in b.message_types})
    return f"{queues} queue(s) of {types} on {', '.join(b.broker_name for b in route.brokers)}"


def _changes(before: TopicRoute, shares: dict[str, int], types: frozenset[MessageType]) -> str:
    old_queues = sum(b.queue_count for b in before.brokers)
    old_types = format_types({t for b in before.brokers for t in b.message_types})
    changes = []
    if old_queues != sum(shares.values()):
        changes.append(f"queues {old_queues} -> {sum(shares.values())}")
    if old_types != format_types(types):
        changes.append(f"types {old_types} -> {format_types(types)}")
    added = sorted(set(shares) - {b.broker_name for b in before.brokers})
    if added:
        changes.append(f"now also on {', '.join(added)}")
    return ", ".join(changes) or "nothing changed"


async def update_permission(
    cluster: Cluster, name: str, permission: Permission, broker_names: list[str] | None = None
) -> Report:
    """Make `name` readable and/or writable (on `broker_names`, default every broker holding it);
    returns once the route shows it (clients see it at their next route refresh, within 30 s)."""
    route = await cluster.route(name)
    holders = {b.broker_name: b for b in route.brokers}
    chosen = sorted(holders) if broker_names is None else broker_names
    unknown = [n for n in chosen if n not in holders]
    if unknown:
        raise BadRequest(f"topic {name} is not on broker(s) {', '.join(unknown)}; it is on {', '.join(holders)}")

    async def change(b: RemoteBroker) -> TopicSpec:
        spec = await b.get_topic(name)
        return await b.update_topic(dataclasses.replace(spec, permission=permission))

    await cluster.on_each([(n, holders[n].address) for n in chosen], change)

    def shown(r: TopicRoute | None) -> bool:
        now = {b.broker_name: b.permission for b in r.brokers} if r else {}
        return all(now.get(n) is permission for n in chosen)

    await cluster.wait_for_route(name, shown, f"topic {name} was made {permission_name(permission)}")
    rows = [{"broker": n, "before": permission_name(holders[n].permission), "after": permission_name(permission)}
            for n in chosen]  # fmt: skip
    return Report(
        columns=["broker", "before", "after"],
        rows=rows,
        data={"topic": name, "permission": permission_name(permission), "brokers": rows},
        note=f"topic {name}: {permission_name(permission)} on {len(chosen)} broker(s)",
    )


PERMISSIONS = {"rw": Permission.READ_WRITE, "r": Permission.READ, "w": Permission.WRITE, "none": Permission.NONE}


def permission_name(permission: Permission) -> str:
    return {v: k for k, v in PERMISSIONS.items()}[permission]


async def list_topics(cluster: Cluster) -> Report:
    rows = [
        {
            "topic": t.name,
            "queues": t.queue_count,
            "brokers": list(t.broker_names),
            "types": format_types(t.message_types),
        }
        for t in await cluster.topics()
    ]
    return Report(columns=["topic", "queues", "brokers", "types"], rows=rows)


async def describe_topic(cluster: Cluster, name: str) -> Report:
    """Per broker and queue: offsets, permission and accepted types, as the brokers report them."""
    route = await cluster.route(name)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    statuses: list[TopicStatus] = await cluster.on_each(targets, lambda b: b.topic_status(name))
    rows = [
        {
            "broker": broker_name,
            "queue": q.queue_id,
            "min_offset": q.min_offset,
            "max_offset": q.max_offset,
            "messages": q.max_offset - q.min_offset,
            "permission": status.spec.permission.name.lower(),
            "types": format_types(status.spec.message_types),
            "half_messages": status.half_messages,  # per broker: transactions awaiting commit or rollback
            "broker_pending_timers": status.pending_timers,  # JSON only: per broker, not per queue
            "broker_local_bytes": status.local_bytes,  # JSON only, per broker: estimated bytes on its disk
            "broker_delivered": status.delivered,  # JSON only, per broker: deliveries since it started
        }
        for (broker_name, _), status in zip(targets, statuses, strict=True)
        for q in status.queues
    ]
    note = (f"topic {name}: {len(rows)} queue(s) on {len(targets)} broker(s), "
            f"{sum(s.pending_timers for s in statuses)} pending timer(s), "
            f"about {sum(s.local_bytes for s in statuses)} byte(s) on local disk"
            f"{_stored_shares(targets, statuses)}")  # fmt: skip
    data: dict[str, object] | None = None
    if statuses and MessageType.LITE in statuses[0].spec.message_types:
        lists = await cluster.on_each(targets, lambda b: b.list_lite_topics(name, "", LARGEST_LITE_TOPICS))
        largest = sorted((t for lst in lists for t in lst.topics), key=lambda t: -t.backlog)[:LARGEST_LITE_TOPICS]
        note += f", {sum(lst.count for lst in lists)} lite topic(s); largest: " + (
            ", ".join(f"{t.name} ({t.backlog})" for t in largest) or "none"
        )
        data = {"queues": rows, "lite_topics": sum(lst.count for lst in lists),
                "largest_lite_topics": [{"name": t.name, "backlog": t.backlog} for t in largest]}  # fmt: skip
    return Report(
        columns=["broker", "queue", "min_offset", "max_offset", "messages", "permission", "types", "half_messages"],
        rows=rows,
        data=data,
        note=note,
    )


def _stored_shares(targets: list[tuple[str, str]], statuses: list[TopicStatus]) -> str:
    """Messages stored on each broker (every send it took since the topic was created) and its
    share: a skew of the producers' traffic between brokers shows here."""
    if len(targets) < 2:
        return ""
    stored = [sum(q.max_offset for q in s.queues) for s in statuses]
    total = sum(stored) or 1
    return "; stored per broker: " + ", ".join(
        f"{name} {n} ({100 * n / total:.0f}%)" for (name, _), n in zip(targets, stored, strict=True)
    )


async def list_lite_topics(cluster: Cluster, topic: str, group: str, limit: int) -> Report:
    """The lite topics of a bind topic, largest backlog first, with their last write."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    lists = await cluster.on_each(targets, lambda b: b.list_lite_topics(topic, group, limit))
    rows = sorted(
        (
            {
                "lite_topic": t.name,
                "broker": broker_name,
                "backlog": t.backlog,
                "last_write": _when(t.last_write_ms),
                "subscribers": t.subscribers,
            }
            for (broker_name, _), lst in zip(targets, lists, strict=True)
            for t in lst.topics
        ),
        key=lambda r: (-int(r["backlog"]), str(r["lite_topic"])),  # type: ignore[call-overload]
    )[:limit]
    count = sum(lst.count for lst in lists)
    scope = f" (backlog of group {group})" if group else ""
    return Report(
        columns=["lite_topic", "broker", "backlog", "last_write", "subscribers"],
        rows=rows,
        data={"topic": topic, "lite_topics": count, "group": group, "largest": rows},
        note=f"topic {topic}: {count} lite topic(s){scope}; {len(rows)} shown, largest backlog first",
    )


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z" if ms else ""


async def delete_topic(cluster: Cluster, name: str) -> Report:
    """Delete `name` from every broker that holds it; returns once no route shows it."""
    route = await cluster.route(name)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    await cluster.on_each(targets, lambda b: b.delete_topic(name))
    deleted_on = ", ".join(n for n, _ in targets)
    await cluster.wait_for_route(name, lambda r: r is None, f"topic {name} was deleted on {deleted_on}")
    rows = [{"broker": n, "address": a} for n, a in targets]
    return Report(
        columns=["broker", "address"],
        rows=rows,
        data={"topic": name, "deleted_on": rows},
        note=f"topic {name} deleted from {len(targets)} broker(s)",
    )
