"""`sluice admin group create|list|describe|delete`.

Consumer groups live on every broker (a group consumes whatever topics it subscribes to, wherever
their queues are), so create and delete go to every registered broker, and list and describe
merge what the brokers report.
"""

from __future__ import annotations

from typing import Any

from admin.clients import connected_clients
from admin.cluster import Cluster
from admin.dlq import dead_letter_count
from admin.output import Report, format_time_ms
from broker.client.api import BackoffKind, ConsumeFrom, GroupInfo, GroupSpec, GroupStatus, RetryPolicy
from broker.client.remote import RemoteBroker
from common.errors import ConsumerGroupNotFound

GROUP_COLUMNS = ["group", "fifo", "max_attempts", "retry_policy", "consume_from", "brokers"]


def format_retry_policy(policy: RetryPolicy) -> str:
    if policy.kind is BackoffKind.CUSTOMIZED:
        return f"customized:{','.join(str(d) for d in policy.customized_ms)}"
    return f"exponential:{policy.initial_ms}:{policy.max_ms}:{policy.multiplier:g}"


def format_consume_from(spec: GroupSpec) -> str:
    if spec.consume_from is ConsumeFrom.TIMESTAMP:
        return format_time_ms(spec.consume_from_timestamp_ms) or str(spec.consume_from_timestamp_ms)
    return spec.consume_from.value


def group_row(spec: GroupSpec, brokers: list[str]) -> dict[str, Any]:
    return {
        "group": spec.name,
        "fifo": spec.fifo,
        "max_attempts": spec.max_delivery_attempts,
        "retry_policy": format_retry_policy(spec.retry_policy),
        "consume_from": format_consume_from(spec),
        "brokers": brokers,
    }


async def create_group(cluster: Cluster, spec: GroupSpec) -> Report:
    targets = [(b.broker_name, b.address) for b in await cluster.brokers()]
    infos: list[GroupInfo] = await cluster.on_each(targets, lambda b: b.create_group(spec))
    row = group_row(infos[0].spec, [n for n, _ in targets])
    return Report(columns=GROUP_COLUMNS, rows=[row], note=f"group {spec.name} created on {len(targets)} broker(s)")


async def list_groups(cluster: Cluster) -> Report:
    targets = [(b.broker_name, b.address) for b in await cluster.brokers()]
    listings: list[list[GroupInfo]] = await cluster.on_each(targets, lambda b: b.list_groups())
    merged: dict[str, tuple[GroupSpec, list[str]]] = {}
    for (broker_name, _), infos in zip(targets, listings, strict=True):
        for info in infos:
            merged.setdefault(info.spec.name, (info.spec, []))[1].append(broker_name)
    rows = [group_row(spec, brokers) for spec, brokers in (merged[name] for name in sorted(merged))]
    return Report(columns=GROUP_COLUMNS, rows=rows)


async def describe_group(cluster: Cluster, name: str) -> Report:
    """Per broker, topic and queue: consumed offset, max offset, lag and messages in flight.

    A broker reports the topics the group consumed on it; a topic the group consumes elsewhere (or
    that a connected member subscribes to) but never consumed on this broker is asked for by name,
    so its queues count from the group's start position instead of being left out.
    """
    targets = [(b.broker_name, b.address) for b in await cluster.brokers()]
    subscribed = {t for c in await connected_clients(cluster) if c.group == name for t in c.topics}
    statuses = await cluster.on_each(targets, lambda b: _status_or_none(b, name, sorted(subscribed)))
    consumed = subscribed | {q.topic for s in statuses if s is not None for q in s.queues}
    if consumed != subscribed:  # ask again for the topics some broker reported and others may hold
        statuses = await cluster.on_each(targets, lambda b: _status_or_none(b, name, sorted(consumed)))
    found = [(n, s) for (n, _), s in zip(targets, statuses, strict=True) if s is not None]
    if not found:
        raise ConsumerGroupNotFound(f"consumer group {name} does not exist on any registered broker")
    rows = [
        {
            "broker": broker_name,
            "topic": q.topic,
            "queue": q.queue_id,
            "consumed_offset": q.consumed_offset,
            "max_offset": q.max_offset,
            "lag": q.lag,
            "in_flight": q.in_flight,
            "retrying": q.retrying,
        }
        for broker_name, status in found
        for q in sorted(status.queues, key=lambda q: (q.topic, q.queue_id))
    ]
    lag = sum(q.lag for _, status in found for q in status.queues)
    in_flight = sum(q.in_flight for _, status in found for q in status.queues)
    retrying = sum(q.retrying for _, status in found for q in status.queues)
    dead_letters = await dead_letter_count(cluster, name)
    return Report(
        columns=["broker", "topic", "queue", "consumed_offset", "max_offset", "lag", "in_flight", "retrying"],
        rows=rows,
        data={
            "group": group_row(found[0][1].info.spec, [n for n, _ in found]),
            "queues": rows,
            "lag": lag,
            "in_flight": in_flight,
            "retrying": retrying,
            "dead_letters": dead_letters,
        },
        note=f"group {name}: lag {lag}, in flight {in_flight}, retrying {retrying}, dead letters {dead_letters}, "
        f"on {len(found)} broker(s)",
    )


async def delete_group(cluster: Cluster, name: str) -> Report:
    targets = [(b.broker_name, b.address) for b in await cluster.brokers()]
    deleted = await cluster.on_each(targets, lambda b: _delete_if_present(b, name))
    brokers = [n for (n, _), was_there in zip(targets, deleted, strict=True) if was_there]
    if not brokers:
        raise ConsumerGroupNotFound(f"consumer group {name} does not exist on any registered broker")
    return Report(
        columns=["broker"],
        rows=[{"broker": n} for n in brokers],
        data={"group": name, "deleted_on": brokers},
        note=f"group {name} deleted from {len(brokers)} broker(s)",
    )


async def _status_or_none(broker: RemoteBroker, name: str, topics: list[str]) -> GroupStatus | None:
    try:
        return await broker.group_status(name, topics)
    except ConsumerGroupNotFound:
        return None


async def _delete_if_present(broker: RemoteBroker, name: str) -> bool:
    try:
        await broker.delete_group(name)
    except ConsumerGroupNotFound:
        return False
    return True
