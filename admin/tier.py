"""`sluice admin tier status|upload-now|evict-local`: tiered storage of every broker, or of one topic.

`status` asks every registered broker (a broker without tiering shows `enabled: false`); the table
has one row per (broker, topic) with the local and tiered offset ranges summed over queues, the
upload lag, bytes and objects in the bucket and the last upload error; `--json` adds per-queue
ranges and the object store request counters. `upload-now` and `evict-local` act on every broker
holding the topic (its NameServer route). `upload-now` returns once everything dispatched before the
call is safely in the bucket (or fails with HA_NOT_AVAILABLE after `--wait-s`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from admin.cluster import Cluster
from admin.output import Report, format_bytes, format_time_ms
from broker.client.api import TierEvictResult, TierStatus, TierTopicStatus
from broker.client.remote import RemoteBroker
from common.errors import SluiceError

PROGRESS_INTERVAL_S = 2.0
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


async def upload_now(
    cluster: Cluster, topic: str, wait_s: float, progress: Callable[[str], None] | None = None
) -> Report:
    """Tier everything of `topic` stored so far on every broker holding it; while the brokers work,
    `progress` gets a line every PROGRESS_INTERVAL_S with the messages still waiting for upload."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]
    work = asyncio.ensure_future(cluster.on_each(targets, lambda b: b.tier_upload_now(topic, wait_s)))
    started = time.monotonic()
    while progress is not None and not work.done():
        await asyncio.wait([work], timeout=PROGRESS_INTERVAL_S)
        if work.done():
            break
        try:
            statuses = await cluster.on_each(targets, lambda b: b.tier_status())
        except SluiceError:
            continue  # progress is best effort; the upload's own outcome decides
        left = sum(t.lag_messages for st in statuses for t in st.topics if t.topic == topic)
        progress(f"tiering {topic}: {left} message(s) still to upload after {time.monotonic() - started:.0f} s")
    answers = await work
    return Report(
        columns=STATUS_COLUMNS,
        rows=[_row(name, st) for (name, _), st in zip(targets, answers, strict=True)],
        data=[_topic_json(name, st) for (name, _), st in zip(targets, answers, strict=True)],
        note=f"topic {topic}: everything dispatched before the call is tiered on {len(targets)} broker(s)",
    )


EVICT_COLUMNS = ["broker", "topic", "messages", "segments", "freed", "store"]


async def evict_local(cluster: Cluster, topic: str) -> Report:
    """Each broker of the topic drops its local copy of what is tiered; the row says how much disk
    that freed (the broker's store size before and after: other writes meanwhile count too)."""
    route = await cluster.route(topic)
    targets = [(b.broker_name, b.address) for b in route.brokers]

    async def evict(b: RemoteBroker) -> tuple[int, TierEvictResult, int]:
        before = (await b.broker_info()).store_bytes
        result = await b.tier_evict_local(topic)
        return before, result, (await b.broker_info()).store_bytes

    answers = await cluster.on_each(targets, evict)
    rows = [
        {"broker": name, "topic": r.topic, "messages": r.messages, "segments": r.segments,
         "freed": format_bytes(max(0, before - after)), "store": format_bytes(after),
         "freed_bytes": max(0, before - after), "store_bytes": after}
        for (name, _), (before, r, after) in zip(targets, answers, strict=True)
    ]  # fmt: skip
    kept = sum(1 for r in rows if not r["segments"])
    why = (
        f"; {kept} broker(s) deleted no CommitLog segment (freed: index entries only): the messages stay on disk "
        "until their segment goes, once everything in it (of any topic) is tiered and a newer segment exists"
        if kept else ""
    )  # fmt: skip
    note = f"topic {topic}: reads of evicted messages now come from the bucket{why}"
    return Report(columns=EVICT_COLUMNS, rows=rows, note=note)
