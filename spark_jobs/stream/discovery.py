"""The driver's calls to the cluster: every queue of the wanted topics on every broker now, and
the `group` option's offset commits.

The NameServers name the brokers of each topic (`get_route`); each broker's `topic_status` gives
its queues' oldest readable offset, newest offset and acknowledged end (`acked_offset`: what can
never change, so what the source may read up to). A topic without a route is skipped (it may not
exist yet); a broker that does not answer fails the call (`Unavailable`), so a micro-batch is never
planned from a partial picture.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from broker.client.api import OffsetPolicy
from broker.client.remote import RemoteBroker
from common.errors import TopicNotFound
from nameserver.client import NameServerClient
from spark_jobs.stream.offsets import QueueKey
from spark_jobs.stream.options import StreamOptions

DEFAULT_MESSAGE_BYTES = 1024  # maxBytesPerTrigger's guess for a broker that holds no local copy


@dataclass(frozen=True, slots=True)
class QueueRange:
    key: QueueKey
    cluster: str
    address: str  # the broker's internal service, host:port
    min_offset: int  # the oldest message still readable (tiered copies included)
    max_offset: int  # one past the newest stored message
    acked_offset: int  # one past the newest message that can never change
    # Mean stored size of the (topic, broker)'s messages, estimated by the broker from its local copy
    # (TopicStatus.local_bytes over the messages it lists); DEFAULT_MESSAGE_BYTES when it has none.
    message_bytes: int = 0


async def _discover(opts: StreamOptions) -> dict[QueueKey, QueueRange]:
    ns = NameServerClient(list(opts.namesrv), timeout_s=opts.timeout_s)
    brokers: dict[str, RemoteBroker] = {}
    try:
        topics = set(opts.topics)
        if opts.topic_pattern:
            topics |= {t.name for t in await ns.list_topics() if opts.wants_topic(t.name)}
        found: dict[QueueKey, QueueRange] = {}
        for topic in sorted(topics):
            try:
                route = await ns.get_route(topic)
            except TopicNotFound:
                continue
            for b in route.brokers:
                remote = brokers.get(b.address)
                if remote is None:
                    remote = brokers[b.address] = RemoteBroker(b.broker_name, b.address, timeout_s=opts.timeout_s)
                try:
                    status = await remote.topic_status(topic)
                except TopicNotFound:  # deleted since the route was read
                    continue
                stored = sum(q.max_offset - q.min_offset for q in status.queues)
                size = status.local_bytes // stored if status.local_bytes > 0 and stored > 0 else DEFAULT_MESSAGE_BYTES
                for q in status.queues:
                    key = QueueKey(topic, b.broker_name, q.queue_id)
                    found[key] = QueueRange(key, b.cluster_name, b.address, q.min_offset, q.max_offset,
                                            q.acked_offset, max(1, size))  # fmt: skip
        return found
    finally:
        for remote in brokers.values():
            with contextlib.suppress(Exception):
                await remote.close()
        with contextlib.suppress(Exception):
            await ns.close()


async def _commit_group(opts: StreamOptions, group: str, offsets: dict[QueueKey, tuple[str, int]]) -> None:
    brokers: dict[str, RemoteBroker] = {}
    try:
        for key, (address, offset) in sorted(offsets.items()):
            remote = brokers.get(address)
            if remote is None:
                remote = brokers[address] = RemoteBroker(key.broker, address, timeout_s=opts.timeout_s)
            await remote.reset_offset(group, key.topic, key.queue_id, offset)
    finally:
        for remote in brokers.values():
            with contextlib.suppress(Exception):
                await remote.close()


def commit_group(opts: StreamOptions, group: str, offsets: dict[QueueKey, tuple[str, int]]) -> None:
    """Make `offsets` (queue -> (broker address, offset)) the consumer offsets of `group` (blocking)."""
    if offsets:
        asyncio.run(_commit_group(opts, group, offsets))


async def _offsets_for_time(ranges: list[QueueRange], timestamp_ms: int, timeout_s: float) -> dict[QueueKey, int]:
    brokers: dict[str, RemoteBroker] = {}
    try:
        found: dict[QueueKey, int] = {}
        for r in sorted(ranges, key=lambda r: r.key):
            remote = brokers.get(r.address)
            if remote is None:
                remote = brokers[r.address] = RemoteBroker(r.key.broker, r.address, timeout_s=timeout_s)
            at = await remote.query_offset(r.key.topic, r.key.queue_id, OffsetPolicy.TIMESTAMP, timestamp_ms)
            found[r.key] = min(max(at, r.min_offset), r.max_offset)
        return found
    finally:
        for remote in brokers.values():
            with contextlib.suppress(Exception):
                await remote.close()


def offsets_for_time(opts: StreamOptions, ranges: list[QueueRange], timestamp_ms: int) -> dict[QueueKey, int]:
    """Per queue, its first message stored at or after `timestamp_ms` (its end if none is; blocking).
    The brokers search their own index and, below it, the tiering manifests' store-time ranges."""
    return asyncio.run(_offsets_for_time(ranges, timestamp_ms, opts.timeout_s)) if ranges else {}


def discover(opts: StreamOptions) -> dict[QueueKey, QueueRange]:
    """Every queue of the wanted topics now (blocking; for the driver's calls from Spark)."""
    return asyncio.run(_discover(opts))
