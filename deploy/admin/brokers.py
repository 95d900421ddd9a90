"""`sluice admin broker list`: the brokers the NameServers know, and with `--etcd` every member of
every broker group (docs/replication.md) with its role, epoch, in-sync state and lag."""

from __future__ import annotations

from typing import Any

from broker.replication.coordinator import read_groups
from deploy.admin.cluster import Cluster
from deploy.admin.output import Report

COLUMNS = ["name", "group", "role", "epoch", "in_sync", "lag_bytes", "lag_s", "address", "topics", "last_heartbeat_s"]


async def list_brokers(cluster: Cluster, etcd: str | None) -> Report:
    registered = await cluster.brokers()
    groups = await read_groups(etcd, registered[0].cluster_name if registered else "sluice") if etcd else {}
    rows: list[dict[str, Any]] = []
    for b in registered:
        row = {
            "name": b.broker_name, "broker": b.broker_name, "cluster": b.cluster_name, "address": b.address,
            "topics": b.topic_count, "last_heartbeat_s": round(b.last_heartbeat_age_s, 1),
        }  # fmt: skip
        if b.broker_name in groups:
            continue  # a group's route: its members are listed below
        rows.append({**row, "group": "", "role": "standalone", "epoch": 0, "in_sync": True, "lag_bytes": 0})
    for group, view in sorted(groups.items()):
        rows.extend(member_rows(group, view))
    return Report(columns=COLUMNS, rows=rows)


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
