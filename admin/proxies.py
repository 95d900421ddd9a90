"""`sluice admin proxy list --navigation HOST:PORT`: the proxies a navigation server knows.

One row per live proxy (draining ones included): its zone, endpoints, whether it drains, its load as
it reported it (connected clients, requests in flight, and the score navigation ranks proxies by,
lower is less loaded) and the age of its last heartbeat. The console's cluster page shows the same.
"""

from __future__ import annotations

from typing import Any

from admin.output import Report
from navigation.client import NavigationClient

COLUMNS = ["proxy", "zone", "endpoints", "draining", "clients", "in_flight", "load", "last_heartbeat_s"]


async def list_proxies(navigation: NavigationClient) -> Report:
    rows: list[dict[str, Any]] = [
        {
            "proxy": p.proxy_id,
            "zone": p.zone,
            "endpoints": dict(p.endpoints),
            "namespaces": sorted(p.namespaces),
            "draining": p.draining,
            "clients": p.load.connected_clients,
            "in_flight": p.load.in_flight_requests,
            "load": p.load.score,
            "last_heartbeat_s": round(p.last_heartbeat_age_s, 1),
        }
        for p in sorted(await navigation.list_proxies(), key=lambda p: p.proxy_id)
    ]
    draining = sum(1 for r in rows if r["draining"])
    return Report(columns=COLUMNS, rows=rows, note=f"{len(rows)} proxy(ies), {draining} draining")
