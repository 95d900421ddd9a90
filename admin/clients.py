"""`sluice admin client list`: the clients connected to the proxies, as the brokers last heard.

Every proxy (every worker, every shard of `sluice up --shards N`) reports its sessions to every
broker it knows every few seconds (proxy/core/clientreport.py); this asks every registered broker
and merges the reports, so it works the same in the merged and the separated topology. A client
connected to several proxies (the official clients talk to every shard that owns one of their
queues) is one row: the proxies it is connected to are listed in that row, and `--json` also gives
each connection (proxy, address, last seen). `connected_clients` (one entry per proxy and client)
and `list_clients` are what the web console calls too; keep their signatures stable.
"""

from __future__ import annotations

import time
from typing import Any

from admin.cluster import Cluster
from admin.output import Report, format_time_ms
from broker.client.api import ConnectedClient

CLIENT_COLUMNS = ["client_id", "type", "language", "version", "address", "proxies", "group", "topics", "last_seen_s"]


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


def client_rows(connections: list[ConnectedClient], now_ms: int) -> list[dict[str, Any]]:
    """One row per client id, its connections (one per proxy) folded in: the fields the client
    tells (type, language, version, group) from its most recently seen connection that has them,
    topics of all of them, and the most recent sighting. Rows keep the order of `connections`."""
    by_id: dict[str, list[ConnectedClient]] = {}
    for c in connections:
        by_id.setdefault(c.client_id, []).append(c)
    return [_folded(sorted(group, key=lambda c: -c.last_seen_ms), now_ms) for group in by_id.values()]


def _folded(connections: list[ConnectedClient], now_ms: int) -> dict[str, Any]:
    """`connections` of one client id, most recently seen first."""
    latest = connections[0]

    def told(field: str) -> str:  # a session's language and version are "" until its Settings arrive
        return next((v for c in connections if (v := getattr(c, field))), "")

    topics = dict.fromkeys(t for c in connections for t in c.topics)
    return {
        "client_id": latest.client_id,
        "type": told("client_type"),
        "language": told("language"),
        "version": told("version"),
        "address": latest.address,
        "proxies": sorted({c.proxy for c in connections}),
        "group": told("group"),
        "topics": list(topics),
        "last_seen_s": _age_s(latest.last_seen_ms, now_ms),
        "last_seen": format_time_ms(latest.last_seen_ms),
        "connections": [_connection(c, now_ms) for c in sorted(connections, key=lambda c: c.proxy)],
    }


def _connection(c: ConnectedClient, now_ms: int) -> dict[str, Any]:
    return {"proxy": c.proxy, "address": c.address, "last_seen_s": _age_s(c.last_seen_ms, now_ms)}


def _age_s(last_seen_ms: int, now_ms: int) -> float:
    return round(max(0, now_ms - last_seen_ms) / 1000, 1)


async def list_clients(cluster: Cluster, *, group: str | None = None, topic: str | None = None) -> Report:
    """Connected clients, of one consumer group or publishing/subscribing one topic when asked."""
    connections = [
        c
        for c in await connected_clients(cluster)
        if (group is None or c.group == group) and (topic is None or topic in c.topics)
    ]
    rows = client_rows(connections, int(time.time() * 1000))
    which = f" of group {group}" if group else f" of topic {topic}" if topic else ""
    return Report(columns=CLIENT_COLUMNS, rows=rows,
                  note=f"{len(rows)} client(s){which} over {len(connections)} proxy connection(s)")  # fmt: skip
