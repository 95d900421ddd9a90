"""`sluice admin amqp exchanges|queues|bindings`: the AMQP gateway's metadata (docs/amqp.md).

The document is read from the metadata home broker, the first registered broker by name (the
proxies' rule, proxy/amqp/server.py); each queue's counts come from its broker's group status
(ready: what a consumer would get now; unacked: delivered and not acknowledged yet).
"""

from __future__ import annotations

from typing import Any

from common.errors import NotFound, Unavailable
from deploy.admin.cluster import Cluster
from deploy.admin.output import Report
from proxy.amqp.meta import BUILTIN_EXCHANGES, MetaDoc, QueueMeta, decode

EXCHANGE_COLUMNS = ["vhost", "name", "type", "durable", "auto_delete", "internal", "arguments"]
QUEUE_COLUMNS = ["vhost", "name", "ready", "unacked", "durable", "exclusive", "auto_delete", "topic", "broker",
                 "arguments"]  # fmt: skip
BINDING_COLUMNS = ["vhost", "source", "destination", "destination_type", "routing_key", "arguments"]


async def metadata(cluster: Cluster) -> MetaDoc:
    brokers = sorted(await cluster.brokers(), key=lambda b: b.broker_name)
    if not brokers:
        raise Unavailable("no broker is registered: the AMQP metadata lives on the first one by name")
    home = brokers[0]
    version, data = await cluster.broker(home.broker_name, home.address).get_amqp_meta(0)
    return decode(version, data)


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


async def _counts(cluster: Cluster, address: str, q: QueueMeta) -> tuple[int, int] | None:
    """(ready, unacked) of the queue from its broker; None when its group or topic is not there."""
    try:
        status = await cluster.broker(q.broker, address).group_status(q.group, [q.topic])
    except NotFound:
        return None
    mine = [s for s in status.queues if s.topic == q.topic]
    return sum(s.ready for s in mine), sum(s.in_flight - s.due for s in mine)


async def list_queues(cluster: Cluster, vhost: str | None) -> Report:
    """The queues with their counts. The document and the counts are not read at one instant: a
    queue whose group is missing is looked up again in a newer document, and left out when that
    no longer holds it (it was deleted meanwhile: a proxy removes the metadata entry first, then
    the group and topic); when it still holds it (declared, group not created yet) its counts
    are unknown."""
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
        ready, unacked = counts[(name, q.id)] or (None, None)
        rows.append({"vhost": name, "name": q.name, "ready": ready, "unacked": unacked, "durable": q.durable,
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
