"""`sluice admin message get|find|list`: look messages up by id, by key, or by store time.

`get` and `find` ask every broker holding the topic. `list` reads each queue of the topic from the
first offset stored at or after `begin_ms` (the brokers' time index) up to `end_ms`, at most
`limit` messages in all, with `pull` (which moves no group's offset).

The table shows a short preview of each body; `--json` gives every field, the body as base64 and,
when it is valid UTF-8, as text.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from admin.cluster import Cluster
from admin.output import Report, format_time_ms, preview
from broker.client.api import FilterSpec, OffsetPolicy, StoredMessage
from broker.client.remote import RemoteBroker
from common.errors import BadRequest, MessageNotFound

MESSAGE_COLUMNS = ["broker", "queue", "offset", "message_id", "tag", "keys", "stored", "bytes", "body"]


async def get_message(cluster: Cluster, topic: str, message_id: str) -> Report:
    found = await _ask_every_broker(cluster, topic, lambda b: b.get_message(topic, message_id))
    if not found:
        raise MessageNotFound(f"no message with id {message_id} in topic {topic}")
    return _report(found)


async def find_messages(cluster: Cluster, topic: str, key: str, limit: int) -> Report:
    return _report(await _ask_every_broker(cluster, topic, lambda b: b.find_messages_by_key(topic, key, limit)))


# The pull of a time range names a group (the RPC needs one); it is never created, no offset is stored.
BROWSE_GROUP = "sluice-admin-browse"
LIST_LIMIT_MAX = 1000


async def list_messages(cluster: Cluster, topic: str, begin_ms: int, end_ms: int, limit: int) -> Report:
    """Messages of `topic` stored in [begin_ms, end_ms), at most `limit`, oldest first per queue."""
    if end_ms <= begin_ms:
        raise BadRequest(f"the time range is empty: its end ({format_time_ms(end_ms) or end_ms}) is not after "
                         f"its beginning ({format_time_ms(begin_ms) or begin_ms})")  # fmt: skip
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise BadRequest(f"limit must be 1..{LIST_LIMIT_MAX}, got {limit}")
    route = await cluster.route(topic)
    found: list[tuple[str, StoredMessage]] = []
    for b in route.brokers:
        remote = cluster.broker(b.broker_name, b.address)
        for queue_id in range(b.queue_count):
            offset = await remote.query_offset(topic, queue_id, OffsetPolicy.TIMESTAMP, begin_ms)
            while len(found) < limit:
                result = await remote.pull(BROWSE_GROUP, topic, queue_id, offset, limit - len(found), FilterSpec())
                inside = [m for m in result.messages if begin_ms <= m.store_timestamp_ms < end_ms]
                found.extend((b.broker_name, m) for m in inside)
                past_end = any(m.store_timestamp_ms >= end_ms for m in result.messages)
                if not result.messages or past_end or result.next_offset <= offset:
                    break
                offset = result.next_offset
    found.sort(key=lambda pair: pair[1].store_timestamp_ms)
    return _report(found[:limit])


async def _ask_every_broker(
    cluster: Cluster, topic: str, lookup: Callable[[RemoteBroker], Awaitable[list[StoredMessage]]]
) -> list[tuple[str, StoredMessage]]:
    """`lookup` on every broker of the topic's route; (broker name, message) pairs in route order."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    answers = await cluster.on_each(targets, lookup)
    return [(name, m) for (name, _), messages in zip(targets, answers, strict=True) for m in messages]


def _report(found: list[tuple[str, StoredMessage]]) -> Report:
    return Report(
        columns=MESSAGE_COLUMNS,
        rows=[message_row(n, m) for n, m in found],
        data=[message_json(n, m) for n, m in found],
    )


def message_row(broker_name: str, m: StoredMessage) -> dict[str, Any]:
    return {
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


def message_json(broker_name: str, m: StoredMessage) -> dict[str, Any]:
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
