"""`sluice admin tier status|upload-now|evict-local`: tiered storage of every broker, or of one topic.

`status` asks every registered broker (a broker without tiering shows `enabled: false`); the table
has one row per (broker, topic) with the local and tiered offset ranges summed over queues, the
upload lag, bytes and objects in the bucket and the last upload error; `--json` adds per-queue
ranges and the object store request counters. `upload-now` and `evict-local` act on every broker
holding the topic (its NameServer route). `upload-now` returns once everything dispatched before the
call is safely in the bucket (or fails with HA_NOT_AVAILABLE after `--wait-s`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.client.api import TierStatus, TierTopicStatus
from deploy.admin.cluster import Cluster
from deploy.admin.output import Report, format_time_ms

STATUS_COLUMNS = ["broker", "topic", "local", "tiered", "lag_messages", "lag_s", "bytes", "objects", "error"]


def _ranges(st: TierTopicStatus) -> tuple[str, str]:
    local = ",".join(f"{q.queue_id}:{q.local_min}-{q.local_max}" for q in st.queues)
    tiered = ",".join(f"{q.queue_id}:{q.tiered_min}-{q.tiered_end}" for q in st.queues)
    return local, tiered


def _row(broker: str, st: TierTopicStatus) -> dict[str, Any]:
    local, tiered = _ranges(st)
    return {
        "broker": broker,
        "topic": st.topic,
        "local": local,
        "tiered": tiered,
        "lag_messages": st.lag_messages,
        "lag_s": round(st.lag_s, 1),
        "bytes": st.bytes,
        "objects": st.objects,
        "error": st.last_error,
    }


def _topic_json(broker: str, st: TierTopicStatus) -> dict[str, Any]:
    doc = dataclasses.asdict(st)
    doc["broker"] = broker
    doc["last_upload"] = format_time_ms(st.last_upload_ms)
    return doc


async def status(cluster: Cluster) -> Report:
    brokers = await cluster.brokers()
    answers: list[TierStatus] = await cluster.on_each(
        [(b.broker_name, b.address) for b in brokers], lambda b: b.tier_status()
    )
    rows: list[dict[str, Any]] = []
    data: list[dict[str, Any]] = []
    for b, st in zip(brokers, answers, strict=True):
        rows.extend(_row(b.broker_name, t) for t in st.topics)
        data.append({
            "broker": b.broker_name, "enabled": st.enabled, "store": st.store,
            "requests": {"puts": st.puts, "put_bytes": st.put_bytes, "gets": st.gets, "get_bytes": st.get_bytes},
            "topics": [_topic_json(b.broker_name, t) for t in st.topics],
        })  # fmt: skip
    off = [b.broker_name for b, st in zip(brokers, answers, strict=True) if not st.enabled]
    note = f"tiering not configured on: {', '.join(off)}" if off else ""
    return Report(columns=STATUS_COLUMNS, rows=rows, data=data, note=note)


async def upload_now(cluster: Cluster, topic: str, wait_s: float) -> Report:
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    answers = await cluster.on_each(targets, lambda b: b.tier_upload_now(topic, wait_s))
    return Report(
        columns=STATUS_COLUMNS,
        rows=[_row(name, st) for (name, _), st in zip(targets, answers, strict=True)],
        data=[_topic_json(name, st) for (name, _), st in zip(targets, answers, strict=True)],
        note=f"topic {topic}: everything dispatched before the call is tiered on {len(targets)} broker(s)",
    )


async def evict_local(cluster: Cluster, topic: str) -> Report:
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    answers = await cluster.on_each(targets, lambda b: b.tier_evict_local(topic))
    rows = [
        {"broker": name, "topic": r.topic, "messages": r.messages, "segments": r.segments}
        for (name, _), r in zip(targets, answers, strict=True)
    ]
    return Report(columns=["broker", "topic", "messages", "segments"], rows=rows)
