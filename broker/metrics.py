"""The broker's scrape-time metrics: store, dispatch, consumer groups (families in common/metrics.py).

`broker_samples(broker)` is registered as a scrape source while the broker runs. It reads what the
store and the pop engine already keep (positions, counters, pop state) and maintains nothing per
message. It runs on the event loop's thread (the ops HTTP server), as the pop state requires; its
cost grows with the consumer groups and the queues they consumed, which is why consumer samples
are bounded by `MetricsConfig.max_series_per_family`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.lite.service import is_lite
from broker.priority import is_priority, level_of, pop_queues
from common import metrics as m

if TYPE_CHECKING:
    from broker.local import LocalBroker

_MS_PER_S = 1000.0


def broker_samples(broker: LocalBroker) -> list[m.Sample]:
    if not broker.running:
        return []
    name = broker.name
    labels = (name,)
    store = broker.store
    stats = store.stats()
    used, total = store.disk_usage()
    out: list[m.Sample] = [
        (m.DISPATCH_LAG_BYTES, labels, float(max(0, stats.written_position - stats.dispatched_position))),
        (m.DISPATCH_LAG_SECONDS, labels, stats.dispatch_last_lag_ms / _MS_PER_S),
        (m.UNFLUSHED_BYTES, labels, float(max(0, stats.written_position - stats.flushed_position))),
        (m.COMMITLOG_BYTES, labels, float(max(0, stats.commitlog_end - stats.commitlog_min))),
        (m.COMMITLOG_SEGMENTS, labels, float(stats.segments)),
        (m.ROCKSDB_BYTES, labels, float(stats.index_bytes)),
        (m.DISK_USED_BYTES, labels, float(used)),
        (m.DISK_TOTAL_BYTES, labels, float(total)),
        (m.DEAD_LETTERED, labels, float(broker.engine.dead_lettered)),
        (m.TRACE_PENDING, labels, float(broker.trace.pending)),
        (m.TRANSACTION_HALF, labels, float(broker.half_message_backlog())),
        (m.TIMER_PENDING, labels, float(broker.timers.pending_count())),
    ]
    out.extend(lite_and_priority_samples(broker))
    out.extend(consumer_samples(broker))
    tiering = broker.tiering
    if tiering is not None:
        from broker.tiering.uploader import tier_metric_samples  # pyarrow: loaded by a broker that tiers

        out.extend(tier_metric_samples(name, tiering.uploader))
    return out


def lite_and_priority_samples(broker: LocalBroker) -> list[m.Sample]:
    """Lite topics per bind topic, subscriptions, expirations; stored messages per priority level."""
    name = broker.name
    lite = broker.lite
    out: list[m.Sample] = [
        (m.LITE_SUBSCRIPTIONS, (name,), float(lite.subscriptions())),
        (m.LITE_EXPIRED, (name,), float(lite.expired)),
    ]
    for spec in list(broker.metadata.topics.values()):
        if is_lite(spec):
            out.append((m.LITE_TOPICS, (name, spec.name), float(lite.count(spec.name))))
        elif is_priority(spec):
            for qid in pop_queues(spec):
                low, high = broker.store.queue_bounds(spec.name, qid)
                out.append((m.PRIORITY_MESSAGES, (name, spec.name, str(level_of(qid))), float(high - low)))
    return out


def consumer_samples(broker: LocalBroker) -> list[m.Sample]:
    """Lag and in-flight messages per (group, topic), summed over the broker's queues: of the topics
    the group consumed here and of those its connected consumers subscribe to (as the proxies
    report them), so a topic the group consumes on other brokers only is not left out here."""
    out: list[m.Sample] = []
    limit = broker.config.metrics.max_series_per_family
    subscribed: dict[str, set[str]] = {}
    for client in broker.clients.clients():
        if client.group:
            subscribed.setdefault(client.group, set()).update(client.topics)
    for info in list(broker.metadata.groups.values()):
        lag: dict[str, int] = {}
        inflight: dict[str, int] = {}
        for q in broker.engine.group_queues(info, sorted(subscribed.get(info.spec.name, ()))):
            lag[q.topic] = lag.get(q.topic, 0) + q.lag
            inflight[q.topic] = inflight.get(q.topic, 0) + q.in_flight
        for topic, n in lag.items():
            labels = (broker.name, info.spec.name, topic)
            out.append((m.CONSUMER_LAG, labels, float(n)))
            out.append((m.CONSUMER_IN_FLIGHT, labels, float(inflight[topic])))
        if len(out) >= 2 * limit:
            break
    return out
