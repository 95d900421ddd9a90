"""`sluice admin message get|find`: look messages up by id or key on every broker holding the topic.

The table shows a short preview of each body; `--json` gives every field, the body as base64 and,
when it is valid UTF-8, as text.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from broker.client.api import StoredMessage
from broker.client.remote import RemoteBroker
from common.errors import MessageNotFound
from deploy.admin.cluster import Cluster
from deploy.admin.output import Report, format_time_ms, preview

MESSAGE_COLUMNS = ["broker", "queue", "offset", "message_id", "tag", "keys", "stored", "bytes", "body"]


async def get_message(cluster: Cluster, topic: str, message_id: str) -> Report:
    found = await _ask_every_broker(cluster, topic, lambda b: b.get_message(topic, message_id))
    if not found:
        raise MessageNotFound(f"no message with id {message_id} in topic {topic}")
    return _report(found)


async def find_messages(cluster: Cluster, topic: str, key: str, limit: int) -> Report:
    return _report(await _ask_every_broker(cluster, topic, lambda b: b.find_messages_by_key(topic, key, limit)))


async def _ask_every_broker(
    cluster: Cluster, topic: str, lookup: Callable[[RemoteBroker], Awaitable[list[StoredMessage]]]
) -> list[tuple[str, StoredMessage]]:
    """`lookup` on every broker of the topic's route; (broker name, message) pairs in route order."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    answers = await cluster.on_each(targets, lookup)
    return [(name, m) for (name, _), messages in zip(targets, answers, strict=True) for m in messages]


def _report(found: list[tuple[str, StoredMessage]]) -> Report:
    rows = [
        {
            "broker": broker_name,
            "queue": m.queue_id,
            "offset": m.queue_offset,
            "message_id": m.message_id,
            "tag": m.tag,
            "keys": list(m.keys),
            "stored": format_time_ms(m.store_timestamp_ms),
            "bytes": len(m.body),
            "body": preview(m.body),
        }
        for broker_name, m in found
    ]
    return Report(columns=MESSAGE_COLUMNS, rows=rows, data=[_message_json(n, m) for n, m in found])


def _message_json(broker_name: str, m: StoredMessage) -> dict[str, Any]:
    try:
        text: str | None = m.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "broker": broker_name,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "message_id": m.message_id,
        "message_type": m.message_type.name.lower(),
        "tag": m.tag,
        "keys": list(m.keys),
        "message_group": m.message_group,
        "properties": m.properties,
        "system_properties": m.system_properties,
        "born_timestamp_ms": m.born_timestamp_ms,
        "born_host": m.born_host,
        "store_timestamp_ms": m.store_timestamp_ms,
        "store_host": m.store_host,
        "delivery_timestamp_ms": m.delivery_timestamp_ms,
        "body_gzip": m.body_gzip,
        "body_bytes": len(m.body),
        "body_base64": base64.b64encode(m.body).decode("ascii"),
        "body_text": text,
    }
