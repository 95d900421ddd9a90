"""AMQP: the gateway's vhosts, exchanges, queues (ready, unacked, consumers, ready bytes), bindings, connections
and channels, read as `sluice admin amqp ...` reads them (admin/amqp.py): the metadata from
its home broker, each queue's counts from its broker, connections and channels from the proxies'
client reports (every 5 s). `?vhost=V` shows one vhost."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from admin import amqp, security
from console.app import console_of, render

# The columns each table shows (the admin reports have more; these keep a table within the page).
EXCHANGE_COLUMNS = ["vhost", "name", "type", "durable", "auto_delete", "internal", "arguments"]
QUEUE_COLUMNS = ["vhost", "name", "ready", "unacked", "consumers", "ready_bytes", "durable", "exclusive",
                 "auto_delete", "topic", "arguments"]  # fmt: skip
BINDING_COLUMNS = ["vhost", "source", "destination", "destination_type", "routing_key", "arguments"]
CONNECTION_COLUMNS = ["connection", "vhost", "user", "client", "address", "channels", "opened"]
CHANNEL_COLUMNS = ["connection", "channel", "consumers", "unacked", "prefetch", "global_prefetch", "confirm",
                   "transactional"]  # fmt: skip


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/amqp", amqp_page)


def _declared(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The exchanges of the listing without the built-in ones (the page names those once)."""
    return [r for r in rows if not str(r.get("name", "")).startswith(("amq.", "(default)"))]


async def amqp_page(request: web.Request) -> web.Response:
    cluster = console_of(request).cluster
    vhost = request.query.get("vhost") or None
    doc = await amqp.metadata(cluster)
    vhosts = amqp.list_vhosts(doc, await security.read(cluster))
    exchanges = await amqp.list_exchanges(cluster, vhost)
    queues = await amqp.list_queues(cluster, vhost, await amqp.consumer_counts(cluster, vhost))
    return render(request, "amqp.html", vhost=vhost, vhosts=vhosts, exchanges=_declared(exchanges.rows),
                  queues=queues.rows, bindings=(await amqp.list_bindings(cluster, vhost)).rows,
                  connections=(await amqp.list_connections(cluster, vhost)).rows,
                  channels=(await amqp.list_channels(cluster, vhost)).rows, exchange_columns=EXCHANGE_COLUMNS,
                  queue_columns=QUEUE_COLUMNS, binding_columns=BINDING_COLUMNS, connection_columns=CONNECTION_COLUMNS,
                  channel_columns=CHANNEL_COLUMNS)  # fmt: skip
