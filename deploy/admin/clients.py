"""`sluice admin client list`: the clients connected to the proxies, as the brokers last heard.

Every proxy (every worker) reports its sessions to every broker it knows every few seconds
(proxy/core/clientreport.py); this asks every registered broker and merges the reports, so it
works the same in the merged and the separated topology. A client connected to two proxies
shows once per proxy. `connected_clients` and `list_clients` are what the web console calls too;
keep their signatures stable.
"""

from __future__ import annotations

import time
from typing import Any

from broker.client.api import ConnectedClient
from deploy.admin.cluster import Cluster
from deploy.admin.output import Report, format_time_ms

CLIENT_COLUMNS = ["client_id", "type", "language", "version", "address", "proxy", "group", "topics", "last_seen_s"]


async def connected_clients(cluster: Cluster) -> list[ConnectedClient]:
    """Every client some proxy reported, once per (proxy, client id), sorted by group, then client id.
    Reused for the Cluster's cache time (the console's `group describe` of 50 groups asks once)."""
    return await cluster.reuse("clients", lambda: _ask_clients(cluster))


async def _ask_clients(cluster: Cluster) -> list[ConnectedClient]:
    targets = [(b.broker_name, b.address) for b in await cluster.brokers()]
    reports: list[list[ConnectedClient]] = await cluster.on_each(targets, lambda b: b.list_clients())
    merged: dict[tuple[str, str], ConnectedClient] = {}
    for clients in reports:
        for c in clients:
            key = (c.proxy, c.client_id)
            known = merged.get(key)
            if known is None or c.last_seen_ms > known.last_seen_ms:
                merged[key] = c
    return sorted(merged.values(), key=lambda c: (c.group, c.client_id, c.proxy))


def client_row(c: ConnectedClient, now_ms: int) -> dict[str, Any]:
    return {
        "client_id": c.client_id,
        "type": c.client_type,
        "language": c.language,
        "version": c.version,
        "address": c.address,
        "proxy": c.proxy,
        "group": c.group,
        "topics": list(c.topics),
        "last_seen_s": round(max(0, now_ms - c.last_seen_ms) / 1000, 1),
        "last_seen": format_time_ms(c.last_seen_ms),
    }


async def list_clients(cluster: Cluster, *, group: str | None = None, topic: str | None = None) -> Report:
    """Connected clients, of one consumer group or publishing/subscribing one topic when asked."""
    clients = [
        c
        for c in await connected_clients(cluster)
        if (group is None or c.group == group) and (topic is None or topic in c.topics)
    ]
    now_ms = int(time.time() * 1000)
    rows = [client_row(c, now_ms) for c in clients]
    which = f" of group {group}" if group else f" of topic {topic}" if topic else ""
    return Report(columns=CLIENT_COLUMNS, rows=rows, note=f"{len(rows)} client connection(s){which}")
