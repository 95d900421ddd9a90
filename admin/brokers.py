"""`sluice admin broker list`: the brokers the NameServers know, and with `--etcd` every member of
every broker group (docs/replication.md) with its role, epoch, in-sync state and lag.

Each registered broker is also asked what it runs and how its store keeps up (`BrokerApi.broker_info`):
version, uptime, disk use of its data filesystem, bytes in its store, bytes written but not yet
flushed (the store's lag) or not yet indexed (the dispatch lag, with the delay of the last dispatch
round). A broker that cannot answer keeps its row, with the reason in `error`. The table shows the
main figures; `--json` every field (the console's cluster page shows the same).

`sluice admin broker switchover GROUP --to NAME --etcd URL`: a planned switchover with zero loss
(broker/replication/switchover.py).

The replication modules (etcd's client, the broker's state machine) are imported only by the
commands given `--etcd`: `broker list` without it, and the console, never load them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from admin.cluster import Cluster
from admin.output import Report, format_time_ms
from broker.client.api import BrokerInfo
from common.errors import SluiceError

SWITCHOVER_COLUMNS = ["group", "from", "to", "epoch"]
DEFAULT_CLUSTER = "sluice"  # [broker] cluster's default, for a group the NameServers do not list (yet)
COLUMNS = ["name", "group", "role", "epoch", "in_sync", "lag_bytes", "lag_s", "address", "topics", "last_heartbeat_s",
           "version", "uptime_s", "disk_used_pct", "store_bytes", "unflushed_bytes", "dispatch_lag_bytes",
           "error"]  # fmt: skip
_MS_PER_S = 1000
_PERCENT = 100


async def list_brokers(cluster: Cluster, etcd: str | None) -> Report:
    registered = await cluster.brokers()
    groups: dict[str, dict[str, Any]] = {}
    if etcd:
        from broker.replication.coordinator import read_groups  # etcd's client: only with --etcd

        groups = await read_groups(etcd, registered[0].cluster_name if registered else "sluice")
    infos = await asyncio.gather(*(cluster.broker(b.broker_name, b.address).broker_info() for b in registered),
                                 return_exceptions=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for b, info in zip(registered, infos, strict=True):
        row = {
            "name": b.broker_name, "broker": b.broker_name, "cluster": b.cluster_name, "address": b.address,
            "topics": b.topic_count, "last_heartbeat_s": round(b.last_heartbeat_age_s, 1), **info_fields(info),
        }  # fmt: skip
        if b.broker_name in groups:
            continue  # a group's route: its members are listed below
        rows.append({**row, "group": "", "role": "standalone", "epoch": 0, "in_sync": True, "lag_bytes": 0})
    for group, view in sorted(groups.items()):
        rows.extend(member_rows(group, view))
    return Report(columns=COLUMNS, rows=rows)


def info_fields(info: BrokerInfo | BaseException) -> dict[str, Any]:
    """The columns of a broker's `broker_info` answer, or its error."""
    if isinstance(info, SluiceError):
        return {"error": str(info)}
    if isinstance(info, BaseException):
        raise info
    return {
        "version": info.version,
        "started": format_time_ms(info.started_ms),
        "uptime_s": round(max(0.0, time.time() - info.started_ms / _MS_PER_S)) if info.started_ms else None,
        "disk_used_bytes": info.disk_used_bytes,
        "disk_total_bytes": info.disk_total_bytes,
        "disk_used_pct": _percent(info.disk_used_bytes, info.disk_total_bytes),
        "store_bytes": info.store_bytes,
        "unflushed_bytes": info.unflushed_bytes,
        "dispatch_lag_bytes": info.dispatch_lag_bytes,
        "dispatch_lag_ms": info.dispatch_lag_ms,
        "error": "",
    }


def _percent(part: int, whole: int) -> float | None:
    return round(_PERCENT * part / whole, 1) if whole else None


def member_rows(group: str, view: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per live member of a group, from what etcd holds (coordinator.read_groups)."""
    leader, status, insync = view["leader"], view["status"] or {}, view["insync"] or {}
    replicas = status.get("replicas", {})
    rows = []
    for name, info in sorted(view["members"].items()):
        primary = leader is not None and leader["name"] == name
        seen = replicas.get(name, {})
        rows.append({
            "name": name, "group": group, "role": "primary" if primary else "replica",
            "epoch": leader["epoch"] if leader is not None else insync.get("epoch", 0),
            "in_sync": primary or bool(seen.get("in_sync", name in insync.get("members", ()))),
            "lag_bytes": 0 if primary else int(seen.get("lag_bytes", 0)),
            "lag_s": 0.0 if primary else float(seen.get("lag_s", 0.0)),
            "address": info["address"],
        })  # fmt: skip
    return rows


async def switchover(cluster: Cluster, etcd: str, group: str, target: str, timeout_s: float) -> Report:
    """Hand `group` over to its member `target`; returns once `target` is its primary."""
    registered = await cluster.brokers()
    name = next((b.cluster_name for b in registered if b.broker_name == group), DEFAULT_CLUSTER)
    from broker.replication.switchover import switch_over  # the replication modules: only here

    done = await switch_over(etcd, name, group, target, timeout_s)
    return Report(columns=SWITCHOVER_COLUMNS, rows=[done])
