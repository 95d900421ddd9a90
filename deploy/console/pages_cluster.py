"""Cluster page (NameServers, brokers, proxies, tiering at a glance) and login/logout.

Health at a glance: a broker is "ok" while its last heartbeat is younger than `STALE_HEARTBEAT_S`,
a proxy while navigation lists it and it is not draining. Every figure comes from the admin
functions (`Cluster.brokers`, `tier.status`) and the navigation client's proxy list.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from common.errors import SluiceError
from deploy.admin import security, tier
from deploy.console.app import SESSION_KEY, console_of, log_action, render, session_of
from deploy.console.sessions import check_login

STALE_HEARTBEAT_S = 30.0  # the NameServer drops a broker after 120 s without heartbeat


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
    brokers, tiering, proxies = await asyncio.gather(
        console.cluster.brokers(), _tiering(console.cluster), _proxies(request), return_exceptions=False
    )
    broker_rows = [
        {
            "broker": b.broker_name,
            "health": "ok" if b.last_heartbeat_age_s < STALE_HEARTBEAT_S else "stale",
            "role": "broker",
            "cluster": b.cluster_name,
            "address": b.address,
            "topics": b.topic_count,
            "tiering": tiering.get(b.broker_name, "unknown"),
            "last_heartbeat_s": round(b.last_heartbeat_age_s, 1),
        }
        for b in brokers
    ]
    nameservers = [{"nameserver": a, "health": "ok"} for a in console.config.namesrv.split(";") if a]
    return render(request, "cluster.html", brokers=broker_rows, nameservers=nameservers, proxies=proxies,
                  navigation=console.config.navigation)  # fmt: skip


async def _tiering(cluster: Any) -> dict[str, str]:
    report = await tier.status(cluster)
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
    navigation = console_of(request).navigation
    if navigation is None:
        return []
    try:
        listed = await navigation.list_proxies()
    except SluiceError as exc:
        return f"navigation server unreachable: {exc}"
    return [
        {
            "proxy": p.proxy_id,
            "health": "draining" if p.draining else "ok",
            "zone": p.zone,
            "endpoints": dict(p.endpoints),
            "clients": p.load.connected_clients,
            "in_flight": p.load.in_flight_requests,
            "last_heartbeat_s": round(p.last_heartbeat_age_s, 1),
        }
        for p in sorted(listed, key=lambda p: p.proxy_id)
    ]


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
