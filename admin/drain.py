"""`sluice admin broker drain|undrain NAME`: take a broker out of the write path for maintenance.

Drain makes every user topic on the broker read-only there (READ_WRITE -> READ, WRITE -> NONE):
producers move to the topic's other brokers at their next route refresh (the broker refuses writes
meanwhile, which the clients retry elsewhere), while consumers keep receiving what is stored there.
The report shows the backlog still waiting on the broker (every group's lag there), and `--wait-s`
waits, printing progress, until it is consumed: then the broker can be stopped without stranding
messages. Undrain makes the broker's read-only topics writable again. Drain keeps no record of
topics that were read-only before it: undrain makes those writable too (give them `topic update
--perm r` again afterwards).

`drain_broker`, `undrain_broker` and `broker_backlog` are what the web console calls too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from typing import Any

from admin.cluster import Cluster
from admin.output import Report
from broker.client.api import TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import BadRequest
from common.model import SYSTEM_PREFIX, Permission

PROGRESS_INTERVAL_S = 2.0
_DRAINED = {Permission.READ_WRITE: Permission.READ, Permission.WRITE: Permission.NONE}
_UNDRAINED = {Permission.READ: Permission.READ_WRITE, Permission.NONE: Permission.WRITE}


async def _broker(cluster: Cluster, name: str) -> RemoteBroker:
    registered = {b.broker_name: b.address for b in await cluster.brokers()}
    if name not in registered:
        raise BadRequest(f"broker {name} is not registered with the NameServer; registered: {', '.join(registered)}")
    return cluster.broker(name, registered[name])


async def broker_backlog(broker: RemoteBroker) -> dict[str, int]:
    """Messages stored on the broker that each consumer group has not consumed yet (groups with lag)."""
    topics = [t.name for t in await broker.list_topics() if not t.name.startswith(SYSTEM_PREFIX)]
    backlog: dict[str, int] = {}
    for info in await broker.list_groups():
        status = await broker.group_status(info.spec.name, topics)
        lag = sum(q.lag for q in status.queues if not q.topic.startswith(SYSTEM_PREFIX))
        if lag:
            backlog[info.spec.name] = lag
    return backlog


async def _set_permissions(broker: RemoteBroker, mapping: dict[Permission, Permission]) -> list[dict[str, Any]]:
    rows = []
    for spec in await broker.list_topics():
        new = mapping.get(spec.permission)
        if spec.name.startswith(SYSTEM_PREFIX) or new is None:
            continue
        changed: TopicSpec = await broker.update_topic(dataclasses.replace(spec, permission=new))
        rows.append(
            {"topic": spec.name, "before": spec.permission.name.lower(), "after": changed.permission.name.lower()}
        )
    return rows


async def drain_broker(cluster: Cluster, name: str, *, wait_s: float = 0.0) -> Report:
    """Stop writes to `name`; with `wait_s`, wait until its backlog is consumed (progress on stderr)."""
    broker = await _broker(cluster, name)
    rows = await _set_permissions(broker, _DRAINED)
    backlog = await broker_backlog(broker)
    deadline = time.monotonic() + wait_s
    while backlog and time.monotonic() < deadline:
        print(f"draining {name}: {sum(backlog.values())} message(s) left for {len(backlog)} group(s)",
              file=sys.stderr, flush=True)  # fmt: skip
        await asyncio.sleep(min(PROGRESS_INTERVAL_S, max(0.0, deadline - time.monotonic())))
        backlog = await broker_backlog(broker)
    left = sum(backlog.values())
    state = "drained: nothing left to consume" if not left else f"{left} message(s) left for {len(backlog)} group(s)"
    return Report(
        columns=["topic", "before", "after"],
        rows=rows,
        data={"broker": name, "topics": rows, "backlog": backlog, "drained": not left},
        note=f"broker {name} takes no new writes ({len(rows)} topic(s) made read-only); {state}",
    )


async def undrain_broker(cluster: Cluster, name: str) -> Report:
    broker = await _broker(cluster, name)
    rows = await _set_permissions(broker, _UNDRAINED)
    return Report(
        columns=["topic", "before", "after"],
        rows=rows,
        data={"broker": name, "topics": rows},
        note=f"broker {name} takes writes again ({len(rows)} topic(s) made writable)",
    )
