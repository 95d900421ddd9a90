"""MQTT: the gateway's clients, sessions, subscriptions and retained messages, read as `sluice admin mqtt ...`
reads them (admin/mqtt.py): clients from the proxies' client reports (every 5 s), sessions,
subscriptions and retained messages from the MQTT state store on the home broker. `?namespace=NS`
shows one namespace."""

from __future__ import annotations

from aiohttp import web

from admin import mqtt
from console.app import console_of, render

RETAINED_ROWS = 200  # retained messages listed at most (the admin tool lists more)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/mqtt", mqtt_page)


async def mqtt_page(request: web.Request) -> web.Response:
    cluster = console_of(request).cluster
    namespace = request.query.get("namespace")
    clients = await mqtt.list_clients(cluster, namespace)
    sessions = await mqtt.list_sessions(cluster, namespace)
    subscriptions = await mqtt.list_subscriptions(cluster, namespace)
    retained = await mqtt.list_retained(cluster, namespace or "", "", RETAINED_ROWS)
    return render(request, "mqtt.html", namespace=namespace, clients=clients, sessions=sessions,
                  subscriptions=subscriptions, retained=retained)  # fmt: skip
