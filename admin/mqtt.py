"""`sluice admin mqtt clients|sessions|subscriptions|retained|kick|drop-session|delete-retained`: the
MQTT gateway's clients and durable state (docs/mqtt.md, "Operators").

Clients come from the proxies' client reports (MQTT connections are reported with the RocketMQ
clients, type `MQTT`, their namespace, user and subscriptions as JSON in `detail`). Sessions,
subscriptions and retained messages are read from the MQTT state store on the home broker (the
first registered broker by name, the proxies' rule). A kick is a request the connection's proxy
reads within its `kick_poll_ms` (it closes the connection with DISCONNECT 0x98, as the server
would); dropping a session also marks it expired, so the janitor of any proxy removes it with its
filters and group within `janitor_interval_s`.
"""

from __future__ import annotations

import json
from typing import Any

from admin.clients import connected_clients
from admin.cluster import Cluster
from admin.output import Report, format_time_ms
from broker.client.remote import RemoteBroker
from common import record
from common.errors import NotFound, Unavailable
from common.litefilter import matches
from proxy.mqtt import state

CLIENT_COLUMNS = ["client_id", "namespace", "user", "version", "address", "proxy", "transport", "keep_alive_s",
                  "inflight", "subscriptions"]  # fmt: skip
SESSION_COLUMNS = ["client_id", "namespace", "version", "connected", "expiry_s", "subscriptions", "disconnected_at"]
SUBSCRIPTION_COLUMNS = ["client_id", "namespace", "filter", "qos", "no_local", "retain_as_published",
                        "retain_handling", "identifier", "shared_group"]  # fmt: skip
RETAINED_COLUMNS = ["namespace", "topic", "bytes", "qos", "stored_at"]
MAX_ROWS = 100_000


async def home(cluster: Cluster) -> RemoteBroker:
    brokers = sorted(await cluster.brokers(), key=lambda b: b.broker_name)
    if not brokers:
        raise Unavailable("no broker is registered: the MQTT state lives on the first one by name")
    return cluster.broker(brokers[0].broker_name, brokers[0].address)


async def _scan(cluster: Cluster, prefix: bytes, limit: int = MAX_ROWS) -> list[tuple[bytes, bytes]]:
    broker = await home(cluster)
    out: list[tuple[bytes, bytes]] = []
    after = b""
    while len(out) < limit:
        page = await broker.mqtt_scan(prefix, after, min(1000, limit - len(out)))
        if not page:
            break
        out.extend(page)
        after = page[-1][0]
    return out


async def list_clients(cluster: Cluster, namespace: str | None) -> Report:
    rows: list[dict[str, Any]] = []
    for c in await connected_clients(cluster):
        if c.client_type != "MQTT":
            continue
        detail = json.loads(c.detail or "{}")
        if namespace is not None and detail.get("namespace", "") != namespace:
            continue
        transport = ("websocket" if detail.get("websocket") else "tcp") + ("+tls" if detail.get("tls") else "")
        rows.append({"client_id": c.client_id, "namespace": detail.get("namespace", ""), "user": detail.get("user", ""),
                     "version": c.version, "address": c.address, "proxy": c.proxy, "transport": transport,
                     "keep_alive_s": detail.get("keep_alive_s", 0), "inflight": detail.get("inflight", 0),
                     "subscriptions": len(detail.get("subscriptions", []))})  # fmt: skip
    return Report(CLIENT_COLUMNS, rows, note=f"{len(rows)} MQTT client(s) (reported by the proxies every 5 s)")


async def _sessions(cluster: Cluster, namespace: str | None) -> list[tuple[str, str, state.SessionRecord]]:
    prefix = state.SESSION + (namespace.encode() + state.SEP if namespace is not None else b"")
    out = []
    for key, raw in await _scan(cluster, prefix):
        ns, client_id = state.parse_session_key(key)
        out.append((ns, client_id, state.SessionRecord.decode(raw)))
    return out


async def list_sessions(cluster: Cluster, namespace: str | None) -> Report:
    rows = [{"client_id": cid, "namespace": ns, "version": "5.0" if rec.version == 5 else "3.1.1",
             "connected": bool(rec.owner), "expiry_s": rec.expiry_s, "subscriptions": len(rec.subs),
             "disconnected_at": format_time_ms(rec.gone_ms) if rec.gone_ms and not rec.owner else ""}
            for ns, cid, rec in await _sessions(cluster, namespace)]  # fmt: skip
    return Report(SESSION_COLUMNS, rows, note=f"{len(rows)} MQTT session(s)")


async def list_subscriptions(cluster: Cluster, namespace: str | None) -> Report:
    rows: list[dict[str, Any]] = []
    for ns, cid, rec in await _sessions(cluster, namespace):
        for text, (qos, nl, rap, rh, sid) in sorted(rec.subs.items()):
            share = text.split("/", 2)[1] if text.startswith("$share/") else ""
            rows.append({"client_id": cid, "namespace": ns, "filter": text, "qos": qos, "no_local": bool(nl),
                         "retain_as_published": bool(rap), "retain_handling": rh, "identifier": sid or "",
                         "shared_group": share})  # fmt: skip
    return Report(SUBSCRIPTION_COLUMNS, rows, note=f"{len(rows)} subscription(s)")


async def list_retained(cluster: Cluster, namespace: str, topic_filter: str, limit: int) -> Report:
    rows: list[dict[str, Any]] = []
    for key, raw in await _scan(cluster, state.retained_prefix(namespace)):
        topic = state.topic_of_retained(key, namespace)
        if topic_filter and not matches(topic_filter, topic):
            continue
        rec = record.decode(raw)
        rows.append({"namespace": namespace, "topic": topic, "bytes": len(rec.body),
                     "qos": int(rec.system_properties.get(record.SYSPROP_MQTT_QOS, "1")),
                     "stored_at": format_time_ms(rec.born_timestamp_ms)})  # fmt: skip
        if len(rows) >= limit:
            break
    return Report(RETAINED_COLUMNS, rows, note=f"{len(rows)} retained message(s)")


async def delete_retained(cluster: Cluster, namespace: str, topic: str) -> Report:
    broker = await home(cluster)
    key = state.retained_key(namespace, topic)
    if (await broker.mqtt_get([key]))[0] is None:
        raise NotFound(f"no retained message on topic {topic!r} in namespace {namespace or '(default)'}")
    await broker.mqtt_write([], [key])
    return Report(["namespace", "topic", "deleted"], [{"namespace": namespace, "topic": topic, "deleted": True}])


async def _record(cluster: Cluster, namespace: str, client_id: str) -> tuple[RemoteBroker, bytes, bytes]:
    broker = await home(cluster)
    key = state.session_key(namespace, client_id)
    raw = (await broker.mqtt_get([key]))[0]
    if raw is None:
        raise NotFound(f"no MQTT session of client {client_id!r} in namespace {namespace or '(default)'}")
    return broker, key, raw


async def kick(cluster: Cluster, namespace: str, client_id: str) -> Report:
    broker, _, raw = await _record(cluster, namespace, client_id)
    rec = state.SessionRecord.decode(raw)
    if not rec.owner:
        raise NotFound(f"MQTT client {client_id!r} is not connected (its session is kept)")
    await broker.mqtt_write([(state.kick_key(rec.owner, namespace, client_id), b"0")])
    return Report(["client_id", "namespace", "kicked"], [{"client_id": client_id, "namespace": namespace,
                                                          "kicked": True}])  # fmt: skip


async def drop_session(cluster: Cluster, namespace: str, client_id: str) -> Report:
    broker, key, raw = await _record(cluster, namespace, client_id)
    rec = state.SessionRecord.decode(raw)
    owner = rec.owner
    before = state.index_keys(namespace, client_id, rec)
    # Expired, and of a new epoch: the next janitor removes it (its expiry entry is due), and its
    # connection (told by a kick of that epoch) ends without writing the record back.
    rec.owner, rec.expiry_s, rec.gone_ms, rec.will, rec.epoch = "", 0, 0, None, rec.epoch + 1
    puts, deletes = state.record_write(namespace, client_id, before, rec)
    if owner:
        puts.append((state.kick_key(owner, namespace, client_id), str(rec.epoch).encode()))
    await broker.mqtt_write(puts, deletes, expect=[(key, raw)])
    row = {"client_id": client_id, "namespace": namespace, "dropped": True}
    return Report(["client_id", "namespace", "dropped"], [row],
                  note="its connection is closed, its filters and group removed by a proxy within seconds")  # fmt: skip
