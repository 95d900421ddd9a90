"""Cluster page (message rates, NameServers, brokers, proxies, tiering at a glance) and login/logout.

Health at a glance: a NameServer is "ok" when it answers on its own; a broker is "ok" while its
last heartbeat is younger than `STALE_HEARTBEAT_S` and it answers, "disk" when its data filesystem
is fuller than `DISK_WARN_PCT`; a proxy is "ok" while navigation lists it and it is not draining
(without navigation: while its port accepts connections).
Every figure comes from the admin functions: `nameservers.list_nameservers` (`sluice admin
nameserver list`), `brokers.list_brokers` (`broker list --json`: version, uptime, disk, store and
dispatch lag), `tier.status` and `proxies.list_proxies` (`proxy list`: zone, load, draining). The
message rates, of the cluster and per broker, come from the console's samples of every topic while
the page is watched (console/history.py), or from Prometheus for the plots when it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from admin import brokers, clients, nameservers, proxies, security, tier
from common.errors import SluiceError
from console.app import SESSION_KEY, console_of, log_action, render, session_of
from console.charts import line_chart
from console.sessions import check_login
from console.units import human_bytes, human_duration

STALE_HEARTBEAT_S = 30.0  # the NameServer drops a broker after 120 s without heartbeat
DISK_WARN_PCT = 85.0  # below the store's default `max_disk_used_ratio` (90 %), where retention deletes
FLEET_COLUMNS = ["health", "proxy", "zone", "workers", "clients", "in_flight", "load", "last_heartbeat_s"]
DIRECT_COLUMNS = ["health", "proxy", "clients"]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/", _to_cluster)
    router.add_get("/cluster", cluster_page)
    router.add_get("/login", login_page)
    router.add_post("/login", login)
    router.add_post("/logout", logout)


async def _to_cluster(request: web.Request) -> web.StreamResponse:
    raise web.HTTPSeeOther("/cluster")


async def cluster_page(request: web.Request) -> web.Response:
    console = console_of(request)
    console.history.watch_cluster()
    listed, tiering, proxies, nameserver_report, rate_in, rate_out = await asyncio.gather(
        brokers.list_brokers(console.cluster, None), _tiering(console.cluster), _proxies(request),
        nameservers.list_nameservers(console.config.namesrv, console.config.timeout_s),
        console.plots.cluster_rate_in(), console.plots.cluster_rate_out(),
    )  # fmt: skip
    client_count = await _client_count(console.cluster)  # the client list `_proxies` read, reused
    history = console.history
    broker_rows = [
        {
            "broker": b["name"],
            "health": _broker_health(b),
            "role": b["role"],
            "cluster": b.get("cluster", ""),
            "address": b["address"],
            "version": b.get("version", ""),
            "uptime": human_duration(b.get("uptime_s")),
            "rate_in_per_s": _last(history.cluster_rate_in(b["name"])),
            "rate_out_per_s": _last(history.cluster_rate_out(b["name"])),
            "disk_used": _disk_used(b),
            "disk_free": human_bytes(
                None if b.get("disk_total_bytes") is None else max(0, b["disk_total_bytes"] - b["disk_used_bytes"])
            ),
            "store": human_bytes(b.get("store_bytes")),
            "store_lag": human_bytes(b.get("unflushed_bytes")),
            "dispatch_lag": _dispatch_lag(b),
            "topics": b.get("topics"),
            "tiering": tiering.get(b["name"], "unknown"),
            "last_heartbeat_s": b.get("last_heartbeat_s"),
            "error": b.get("error", ""),
        }
        for b in listed.rows
    ]
    charts = [
        line_chart(rate_in.points, title="messages in per second, all topics", unit="msg/s", source=rate_in.source),
        line_chart(rate_out.points, title="messages out per second (every delivery), all topics", unit="msg/s",
                   source=rate_out.source),
    ]  # fmt: skip
    too_many = history.cluster_too_large
    return render(request, "cluster.html", brokers=broker_rows, nameservers=nameserver_report.rows, proxies=proxies,
                  client_count=client_count,
                  proxy_columns=FLEET_COLUMNS if console.navigation else DIRECT_COLUMNS, charts=charts,
                  rate_in=_last(rate_in.points), rate_out=_last(rate_out.points),
                  sample_interval_s=f"{console.config.sample_interval_s:g}",
                  rates_note=f"{too_many} topics: more than cluster_topics_max ({history.cluster_topics_max}); the "
                             "console does not sample the cluster's rates (give it --prometheus)" if too_many else "",
                  )  # fmt: skip


def _last(points: list[tuple[float, float]]) -> float | None:
    """The latest rate, rounded for a table; None before there are two samples."""
    return round(points[-1][1], 1) if points else None


def _broker_health(row: dict[str, Any]) -> str:
    if row.get("error") or row.get("last_heartbeat_s", 0) >= STALE_HEARTBEAT_S:
        return "stale"
    pct = row.get("disk_used_pct")
    return "disk" if pct is not None and pct > DISK_WARN_PCT else "ok"


def _disk_used(row: dict[str, Any]) -> str:
    """ "4.2 GiB of 50.0 GiB (8.4 %)" of the broker's data filesystem; "" when it did not answer."""
    if row.get("disk_total_bytes") is None:
        return ""
    pct = row["disk_used_pct"]
    share = "" if pct is None else f" ({pct} %)"
    return f"{human_bytes(row['disk_used_bytes'])} of {human_bytes(row['disk_total_bytes'])}{share}"


def _dispatch_lag(row: dict[str, Any]) -> str:
    """Bytes written but not indexed yet, and the delay of the last dispatch round."""
    if row.get("dispatch_lag_bytes") is None:
        return ""
    return f"{human_bytes(row['dispatch_lag_bytes'])}, {row['dispatch_lag_ms']} ms"


async def _tiering(cluster: Any) -> dict[str, str]:
    """Per broker: off, on (with what is left to upload), or failing; {} when a broker does not answer
    (its row says why; tiering shows "unknown")."""
    try:
        report = await tier.status(cluster)
    except SluiceError:
        return {}
    states = {}
    for broker in report.data:
        if not broker["enabled"]:
            states[broker["broker"]] = "off"
            continue
        failing = [t["topic"] for t in broker["topics"] if t["failures"]]
        lag = sum(t["lag_messages"] for t in broker["topics"])
        states[broker["broker"]] = (f"failing: {', '.join(failing)}" if failing
                                    else f"on ({broker['store']}), {lag} message(s) to upload")  # fmt: skip
    return states


async def _proxies(request: web.Request) -> list[dict[str, Any]] | str:
    """One row per proxy endpoint (its worker processes together): from navigation when the console
    has one, else the proxies configured (`sluice up`'s own) and those the client reports name."""
    console = console_of(request)
    clients_of: dict[str, set[str]] = {}
    try:
        for c in await clients.connected_clients(console.cluster):
            clients_of.setdefault(c.proxy, set()).add(c.client_id)
    except SluiceError:
        pass  # the brokers' rows say why; the proxies are still listed
    if console.navigation is None:
        addresses = sorted(set(console.config.proxies) | set(clients_of))
        answers = await asyncio.gather(*(_answers(a, console.config.timeout_s) for a in addresses))
        return [{"health": "ok" if ok else "unreachable", "proxy": address, "clients": len(clients_of.get(address, ()))}
                for address, ok in zip(addresses, answers, strict=True)]  # fmt: skip
    try:
        listed = await proxies.list_proxies(console.navigation)
    except SluiceError as exc:
        return f"navigation server unreachable: {exc}"
    return fleet_rows(listed.rows, clients_of)


async def _client_count(cluster: Any) -> int | None:
    """Clients connected to any proxy, by client id: one talking to several proxies (every shard of
    `sluice up --shards N`) counts once, where the proxies' rows count it in each. None: unknown."""
    try:
        return len({c.client_id for c in await clients.connected_clients(cluster)})
    except SluiceError:
        return None


def fleet_rows(registrations: list[dict[str, Any]], clients_of: dict[str, set[str]]) -> list[dict[str, Any]]:
    """Navigation lists every worker process (`proxy list`); a proxy is an endpoint: its workers'
    rows become one, with their count, in-flight requests summed and the highest load score."""
    by_endpoint: dict[str, list[dict[str, Any]]] = {}
    for r in registrations:
        endpoints = r["endpoints"]
        key = endpoints.get("default") or next(iter(sorted(endpoints.values())), "") or r["proxy"]
        by_endpoint.setdefault(key, []).append(r)
    rows = []
    for endpoint, workers in sorted(by_endpoint.items()):
        draining = all(w["draining"] for w in workers)
        rows.append({
            "health": "draining" if draining else "ok",
            "proxy": endpoint,
            "zone": ", ".join(sorted({w["zone"] for w in workers if w["zone"]})),
            "workers": len(workers),
            "clients": len(clients_of.get(endpoint, ())),
            "in_flight": sum(w["in_flight"] for w in workers),
            "load": max(w["load"] for w in workers),
            "draining": draining,
            "last_heartbeat_s": min(w["last_heartbeat_s"] for w in workers),
        })  # fmt: skip
    return rows


async def _answers(address: str, timeout_s: float) -> bool:
    """Whether `HOST:PORT` accepts a connection."""
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def login_page(request: web.Request) -> web.Response:
    if not console_of(request).config.auth_required:
        raise web.HTTPSeeOther("/cluster")
    return render(request, "login.html", error="", next=_safe_next(request.query.get("next", "")))


async def login(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    if not console.config.auth_required:
        raise web.HTTPSeeOther("/cluster")
    form = await request.post()
    access_key, secret = str(form.get("access_key", "")), str(form.get("secret", ""))
    refusal = check_login(await security.read(console.cluster), access_key, secret)
    next_page = _safe_next(str(form.get("next", "")))
    if refusal:
        log_action(request, f"login as {access_key[:128]!r}", f"refused: {refusal}")
        return render(request, "login.html", status=403, error=f"login refused: {refusal}", next=next_page)
    request[SESSION_KEY] = console.sessions.renew(session_of(request), access_key)
    log_action(request, "login", "done")
    raise web.HTTPSeeOther(next_page or "/cluster")


async def logout(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    log_action(request, "logout", "done")
    console.sessions.end(session_of(request))
    request[SESSION_KEY] = console.sessions.new()
    raise web.HTTPSeeOther("/login" if console.config.auth_required else "/cluster")


def _safe_next(text: str) -> str:
    """Only a path of this console (no scheme, no host): a login must not redirect elsewhere."""
    return text if text.startswith("/") and not text.startswith("//") and "\\" not in text else ""
