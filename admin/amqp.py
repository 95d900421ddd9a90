"""`sluice admin amqp vhosts|exchanges|queues|bindings|connections|channels`: the AMQP gateway's metadata
(docs/amqp.md).

The document is read from the metadata home broker, the first registered broker by name (the
proxies' rule, proxy/amqp/server.py); each queue's counts come from its broker's group status
(ready: what a consumer would get now; unacked: delivered and not acknowledged yet; ready_bytes:
the ready messages' body bytes, of queues with x-max-length-bytes).
`connections|channels` come from the proxies' client reports (AMQP connections are reported with
the RocketMQ clients, type `AMQP`, their vhost, user and channels as JSON in `detail`).
"""

from __future__ import annotations

import json
from typing import Any

from admin.clients import connected_clients
from admin.cluster import Cluster
from admin.output import Report, format_time_ms
from broker.client.api import ConnectedClient
from common.errors import NotFound, Unavailable
from common.security import Effect, SecurityDoc
from proxy.amqp.meta import AMQP_CLIENT_TYPE, BUILTIN_EXCHANGES, DEFAULT_VHOST, MetaDoc, QueueMeta, decode, queue_counts

EXCHANGE_COLUMNS = ["vhost", "name", "type", "durable", "auto_delete", "internal", "arguments"]
QUEUE_COLUMNS = ["vhost", "name", "ready", "unacked", "consumers", "ready_bytes", "durable", "exclusive",
                 "auto_delete", "topic", "broker", "arguments"]  # fmt: skip
BINDING_COLUMNS = ["vhost", "source", "destination", "destination_type", "routing_key", "arguments"]


async def metadata(cluster: Cluster) -> MetaDoc:
    brokers = sorted(await cluster.brokers(), key=lambda b: b.broker_name)
    if not brokers:
        raise Unavailable("no broker is registered: the AMQP metadata lives on the first one by name")
    home = brokers[0]
    version, data = await cluster.broker(home.broker_name, home.address).get_amqp_meta(0)
    return decode(version, data)


VHOST_COLUMNS = ["vhost", "namespace", "exchanges", "queues", "bindings", "users"]


def list_vhosts(doc: MetaDoc, security: SecurityDoc) -> Report:
    """Every vhost: those of the metadata, `/`, and the namespaces of access rules (each namespace
    is a vhost); its own exchanges, queues, bindings, and the users with an allow rule in it
    (who may open it when the proxies require authentication)."""
    users: dict[str, set[str]] = {}
    for r in security.rules:
        if r.effect is Effect.ALLOW:
            users.setdefault(r.namespace, set()).add(r.access_key)
    names = {DEFAULT_VHOST, *doc.vhosts, *(ns or DEFAULT_VHOST for ns in users)}
    rows: list[dict[str, Any]] = []
    for name in sorted(names):
        v = doc.vhosts.get(name)
        ns = "" if name == DEFAULT_VHOST else name
        rows.append({"vhost": name, "namespace": ns or "(default)", "exchanges": len(v.exchanges) if v else 0,
                     "queues": len(v.queues) if v else 0, "bindings": len(v.bindings) if v else 0,
                     "users": ",".join(sorted(users.get(ns, ())))})  # fmt: skip
    return Report(VHOST_COLUMNS, rows, note=f"{len(rows)} vhost(s), metadata version {doc.version}")


async def list_exchanges(cluster: Cluster, vhost: str | None) -> Report:
    doc = await metadata(cluster)
    rows: list[dict[str, Any]] = []
    for name, v in sorted(doc.vhosts.items()):
        if vhost is not None and name != vhost:
            continue
        for ex_name, kind in BUILTIN_EXCHANGES.items():
            rows.append({"vhost": name, "name": ex_name or "(default)", "type": kind, "durable": True,
                         "auto_delete": False, "internal": False, "arguments": {}})  # fmt: skip
        for e in sorted(v.exchanges.values(), key=lambda e: e.name):
            rows.append({"vhost": name, "name": e.name, "type": e.type, "durable": e.durable,
                         "auto_delete": e.auto_delete, "internal": e.internal, "arguments": e.arguments})  # fmt: skip
    return Report(EXCHANGE_COLUMNS, rows, note=f"metadata version {doc.version}")


async def _counts(cluster: Cluster, address: str, q: QueueMeta) -> tuple[int, int, int | None] | None:
    """(ready, unacked, body bytes of the ready messages) of the queue from its broker (the bytes
    of a queue with x-max-length-bytes only: the broker keeps those); None when its group or topic
    is not there."""
    limited = q.max_length_bytes is not None
    try:
        status = await cluster.broker(q.broker, address).group_status(q.group, [q.topic], ready_bytes=limited)
    except NotFound:
        return None
    ready, unacked, size = queue_counts(status, q)
    return ready, unacked, size if limited else None


async def consumer_counts(cluster: Cluster, vhost: str | None) -> dict[tuple[str, str], int]:
    """(vhost, queue) -> consumers, as the proxies last reported their AMQP channels."""
    counts: dict[tuple[str, str], int] = {}
    for _, detail in await _connections(cluster, vhost):
        for ch in detail.get("channels") or []:
            for queue in (ch.get("queues") or []) if isinstance(ch, dict) else []:
                key = (str(detail.get("vhost", "")), str(queue))
                counts[key] = counts.get(key, 0) + 1
    return counts


async def list_queues(
    cluster: Cluster, vhost: str | None, consumers: dict[tuple[str, str], int] | None = None
) -> Report:
    """The queues with their counts. The document and the counts are not read at one instant: a
    queue whose group is missing is looked up again in a newer document, and left out when that
    no longer holds it (it was deleted meanwhile: a proxy removes the metadata entry first, then
    the group and topic); when it still holds it (declared, group not created yet) its counts
    are unknown. `consumers`: the consumer counts (`consumer_counts`), else the column is empty."""
    doc = await metadata(cluster)
    addresses = {b.broker_name: b.address for b in await cluster.brokers()}
    listed = [(name, q) for name, v in sorted(doc.vhosts.items()) if vhost is None or name == vhost
              for q in sorted(v.queues.values(), key=lambda q: q.name)]  # fmt: skip
    counts = {(name, q.id): await _counts(cluster, addresses[q.broker], q) if q.broker in addresses else None
              for name, q in listed}  # fmt: skip
    if any(c is None and q.broker in addresses for (_, q), c in zip(listed, counts.values(), strict=True)):
        newer = await metadata(cluster)
        listed = [(name, q) for name, q in listed
                  if q.broker not in addresses or counts[(name, q.id)] is not None
                  or _same_queue(newer, name, q)]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for name, q in listed:
        ready, unacked, size = counts[(name, q.id)] or (None, None, None)
        rows.append({"vhost": name, "name": q.name, "ready": ready, "unacked": unacked, "ready_bytes": size,
                     "consumers": None if consumers is None else consumers.get((name, q.name), 0), "durable": q.durable,
                     "exclusive": bool(q.exclusive_owner), "auto_delete": q.auto_delete, "topic": q.topic,
                     "broker": q.broker, "arguments": q.arguments})  # fmt: skip
    return Report(QUEUE_COLUMNS, rows, note=f"{len(rows)} queue(s), metadata version {doc.version}")


def _same_queue(doc: MetaDoc, vhost: str, q: QueueMeta) -> bool:
    now = doc.vhosts.get(vhost)
    found = None if now is None else now.queues.get(q.name)
    return found is not None and found.id == q.id


async def list_bindings(cluster: Cluster, vhost: str | None) -> Report:
    doc = await metadata(cluster)
    rows = [
        {"vhost": name, "source": b.exchange, "destination": b.queue,
         "destination_type": "exchange" if b.to_exchange else "queue", "routing_key": b.routing_key,
         "arguments": b.arguments}
        for name, v in sorted(doc.vhosts.items()) if vhost is None or name == vhost
        for b in v.bindings
    ]  # fmt: skip
    return Report(BINDING_COLUMNS, rows, note=f"{len(rows)} binding(s), metadata version {doc.version}")


CONNECTION_COLUMNS = ["connection", "vhost", "user", "client", "address", "proxy", "channels", "opened"]
CHANNEL_COLUMNS = ["connection", "channel", "vhost", "user", "consumers", "unacked", "prefetch", "global_prefetch",
                   "confirm", "transactional", "proxy"]  # fmt: skip


async def _connections(cluster: Cluster, vhost: str | None) -> list[tuple[ConnectedClient, dict[str, Any]]]:
    """The AMQP connections the proxies last reported (with the RocketMQ clients:
    admin/clients.py), with their decoded detail, oldest first."""
    found = []
    for c in await connected_clients(cluster):
        if c.client_type != AMQP_CLIENT_TYPE:
            continue
        try:
            detail = json.loads(c.detail) if c.detail else {}
        except ValueError:
            detail = {}
        if isinstance(detail, dict) and (vhost is None or detail.get("vhost") == vhost):
            found.append((c, detail))
    return sorted(found, key=lambda cd: (cd[1].get("opened_ms", 0), cd[0].client_id))


async def list_connections(cluster: Cluster, vhost: str | None) -> Report:
    rows: list[dict[str, Any]] = [
        {"connection": c.client_id, "vhost": d.get("vhost", ""), "user": d.get("user", ""),
         "client": f"{c.language} {c.version}".strip(), "address": c.address, "proxy": c.proxy,
         "channels": len(d.get("channels") or []), "opened": format_time_ms(int(d.get("opened_ms", 0)))}
        for c, d in await _connections(cluster, vhost)
    ]  # fmt: skip
    return Report(CONNECTION_COLUMNS, rows, note=f"{len(rows)} connection(s), as the proxies last reported")


async def list_channels(cluster: Cluster, vhost: str | None) -> Report:
    rows: list[dict[str, Any]] = []
    for c, d in await _connections(cluster, vhost):
        for ch in d.get("channels") or []:
            if isinstance(ch, dict):
                rows.append({"connection": c.client_id, "channel": ch.get("channel"), "vhost": d.get("vhost", ""),
                             "user": d.get("user", ""), "consumers": ch.get("consumers"),
                             "unacked": ch.get("unacked"), "prefetch": ch.get("prefetch"),
                             "global_prefetch": ch.get("global_prefetch"), "confirm": ch.get("confirm"),
                             "transactional": ch.get("transactional"), "proxy": c.proxy})  # fmt: skip
    return Report(CHANNEL_COLUMNS, rows, note=f"{len(rows)} channel(s), as the proxies last reported")
