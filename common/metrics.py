"""Every Prometheus metric family of Sluice, defined once (names, types, labels, help); see docs/metrics.md.

Two kinds of families:

- **Hot-path tallies** (counters, histograms) updated where the work happens, through the helpers
  below: one update per batch or per RPC, never per message. A tally is a plain dict from label
  values to numbers (`_Tally`, `_TallyHistogram`), exposed at scrape time: every helper and every
  scrape runs on the event loop's thread, so the update needs no lock, where a prometheus-client
  child takes one per `inc()` and walks its buckets in Python per `observe()`.
- **Scrape-time families** (`ScrapeFamily`): values that already exist somewhere (lag, backlog,
  disk usage, connected clients) are computed when Prometheus scrapes, by sources that components
  register with `register_source(fn)` and remove with the function it returns. A source yields
  `(family, label values, value)` samples; every family is exposed even while it has no sample, so
  a dashboard never sees a family disappear. Scrapes run on the event loop's thread (the ops HTTP
  server, ops/endpoint.py), so sources may read state that only that thread may touch.

`configure(MetricsConfig(enabled=False))` turns the hot-path helpers into no-ops (the produce-path
benchmark compares both settings in one run); scrape-time families cost nothing between scrapes.

This module is the one part of `common` that imports a third-party package (prometheus-client): the
families must be defined in one place that every process imports.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate

import prometheus_client
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

prometheus_client.disable_created_metrics()  # `_created` series would double every counter's output

# Latency buckets in seconds: sub-millisecond for in-process calls up to the 30 s long poll.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FLUSH_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class MetricsConfig:
    """The `[broker.metrics]` / `[proxy.metrics]` table."""

    # Off: hot-path counters and histograms are not updated (scrape-time gauges still work).
    enabled: bool = True
    # Label sets one scrape-time family may expose at most (consumer lag per group and topic...);
    # beyond it the remaining samples are dropped and `sluice_metrics_series_dropped_total` counts them.
    max_series_per_family: int = 10_000


_config = MetricsConfig()


def configure(config: MetricsConfig) -> None:
    """Apply a process's metrics settings (call once at start, before serving)."""
    global _config
    _config = config


def enabled() -> bool:
    return _config.enabled


# -- hot-path tallies ------------------------------------------------------------------------------

# Every tally, in the order defined: each adds itself, so none can be left out of the exposition.
_TALLIES: list[_Tally | _TallyHistogram] = []


class _Tally:
    """A counter family kept as label values -> total in a plain dict, updated on the event loop's
    thread only (the helpers below are called there) and exposed at scrape time (`_TallyCollector`,
    also on that thread): no lock and no child object per update."""

    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help: str, labels: tuple[str, ...]) -> None:
        self.name, self.help, self.labels = name, help, labels  # `name` without `_total`
        self.values: dict[tuple[str, ...], float] = {}
        _TALLIES.append(self)

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


class _TallyHistogram:
    """A histogram family as a `_Tally` is a counter: per label values, the observations of each
    bucket (not cumulative; the last is +Inf) and then their sum, in one list."""

    __slots__ = ("bounds", "help", "labels", "name", "values")

    def __init__(self, name: str, help: str, labels: tuple[str, ...], bounds: tuple[float, ...]) -> None:
        self.name, self.help, self.labels, self.bounds = name, help, labels, bounds
        self.values: dict[tuple[str, ...], list[float]] = {}
        _TALLIES.append(self)

    def observe(self, labels: tuple[str, ...], amount: float) -> None:
        row = self.values.get(labels)
        if row is None:
            row = self.values[labels] = [0.0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, amount)] += 1  # the first bucket whose bound is >= amount
        row[-1] += amount

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        edges = [*map(floatToGoString, self.bounds), "+Inf"]
        for labels, row in self.values.items():
            family.add_metric(labels, list(zip(edges, accumulate(row[:-1]), strict=True)), row[-1])
        return family


PROXY_RPC_REQUESTS = _Tally(
    "sluice_proxy_rpc_requests",
    "RPCs of apache.rocketmq.v2.MessagingService answered by the proxy, by RPC and the Code of the response status",
    ("rpc", "code"),
)
PROXY_RPC_DURATION = _TallyHistogram(
    "sluice_proxy_rpc_duration_seconds",
    "Time the proxy took to answer an RPC (ReceiveMessage includes its long poll)",
    ("rpc",),
    LATENCY_BUCKETS_S,
)
PROXY_UNDECODABLE = _Tally(
    "sluice_proxy_undecodable_requests",
    "MessagingService requests (or Telemetry commands) whose bytes were not a valid protobuf, by RPC",
    ("rpc",),
)
PROXY_FORWARDED = _Tally(
    "sluice_proxy_forwarded_calls",
    "Data-plane calls a merged node's proxy passed to another node's broker (the queue was not its own), by call",
    ("call",),
)
PROXY_BALANCED = _Tally(
    "sluice_proxy_balanced_messages",
    "Messages a receive was served by a broker other than the one the client named (it had none for the group), "
    "by the broker that delivered them",
    ("broker",),
)
MESSAGES_IN = _Tally("sluice_messages_in", "Messages stored for producers, by topic", ("topic",))
MESSAGE_BYTES_IN = _Tally("sluice_message_bytes_in", "Body bytes of the messages stored for producers", ("topic",))
PROXY_BROKER_SENDS = _Tally(
    "sluice_proxy_broker_sends", "Messages a proxy stored through each broker, by topic and broker", ("topic", "broker")
)
MESSAGES_OUT = _Tally(
    "sluice_messages_out", "Messages delivered to consumers (every delivery attempt), by topic and group",
    ("topic", "group"),
)  # fmt: skip
MESSAGE_BYTES_OUT = _Tally(
    "sluice_message_bytes_out", "Body bytes of the messages delivered to consumers", ("topic", "group")
)
MESSAGES_ACKED = _Tally("sluice_messages_acked", "Messages acknowledged by consumers", ("topic", "group"))
AMQP_PUBLISHES_REFUSED = _Tally(
    "sluice_amqp_publishes_refused",
    "AMQP publishes the gateway did not store, by vhost and reason: max_size (body over max_body_bytes), refused "
    "(a broker refused the message), not_stored (a broker failed), queue_full (x-overflow reject-publish)",
    ("vhost", "reason"),
)
INTERNAL_RPC_REQUESTS = _Tally(
    "sluice_internal_rpc_requests",
    "Calls served by Sluice's internal gRPC services (broker, nameserver, navigation), by result code",
    ("service", "method", "code"),
)
INTERNAL_RPC_DURATION = _TallyHistogram(
    "sluice_internal_rpc_duration_seconds",
    "Time an internal gRPC service took to answer (Pop and Pull include their long poll)",
    ("service", "method"),
    LATENCY_BUCKETS_S,
)


class _TallyCollector:
    def collect(self) -> Iterator[Metric]:
        for tally in _TALLIES:
            yield tally.metric()


REGISTRY.register(_TallyCollector())

# Updated off the event loop too (the writer thread, S3 calls): prometheus-client's locked instruments.
STORE_FLUSH_DURATION = Histogram(
    "sluice_store_flush_duration_seconds",
    "Duration of one fdatasync of the CommitLog (one per group commit under sync flush)",
    buckets=FLUSH_BUCKETS_S,
)
TIER_S3_ERRORS = Counter(
    "sluice_tier_s3_errors", "Failed object store calls of tiered storage, by operation", ["broker", "operation"]
)
TRACE_EVENTS_DROPPED = Counter(
    "sluice_trace_events_dropped", "Message trace events dropped because the trace buffer was full", ["broker"]
)


def observe_rpc(rpc: str, code: str, seconds: float) -> None:
    """One answered MessagingService RPC (`code`: the apache.rocketmq.v2 Code name of its status)."""
    if _config.enabled:
        PROXY_RPC_REQUESTS.inc((rpc, code))
        PROXY_RPC_DURATION.observe((rpc,), seconds)


def count_undecodable(rpc: str) -> None:
    if _config.enabled:
        PROXY_UNDECODABLE.inc((rpc,))


def count_forwarded(call: str) -> None:
    """One data-plane call (send, pop, ack...) a merged node forwarded to another node's broker."""
    if _config.enabled:
        PROXY_FORWARDED.inc((call,))


def count_balanced(broker: str, messages: int) -> None:
    """`messages` a receive got from `broker`, not the broker the client named (proxy/core/gather.py)."""
    if _config.enabled:
        PROXY_BALANCED.inc((broker,), messages)


def observe_internal_rpc(service: str, method: str, code: str, seconds: float) -> None:
    if _config.enabled:
        INTERNAL_RPC_REQUESTS.inc((service, method, code))
        INTERNAL_RPC_DURATION.observe((service, method), seconds)


def count_in(topic: str, messages: int, body_bytes: int) -> None:
    """Messages of one topic stored by one send (one call per topic and request)."""
    if _config.enabled:
        key = (topic,)
        MESSAGES_IN.inc(key, messages)
        MESSAGE_BYTES_IN.inc(key, body_bytes)


def count_broker_sends(topic: str, broker: str, messages: int) -> None:
    """Messages of one topic stored through one broker (a skew between brokers shows here)."""
    if _config.enabled:
        PROXY_BROKER_SENDS.inc((topic, broker), messages)


def count_out(topic: str, group: str, messages: int, body_bytes: int) -> None:
    if _config.enabled:
        key = (topic, group)
        MESSAGES_OUT.inc(key, messages)
        MESSAGE_BYTES_OUT.inc(key, body_bytes)


def count_acked(topic: str, group: str, messages: int) -> None:
    if _config.enabled and messages:
        MESSAGES_ACKED.inc((topic, group), messages)


def count_amqp_refused(vhost: str, reason: str) -> None:
    """One AMQP publish not stored (proxy/amqp/channel.py names the reasons)."""
    if _config.enabled:
        AMQP_PUBLISHES_REFUSED.inc((vhost, reason))


def observe_flush(seconds: float) -> None:
    if _config.enabled:
        STORE_FLUSH_DURATION.observe(seconds)


# -- scrape-time families -------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeFamily:
    name: str  # counters end in _total, as the exposition shows them
    help: str
    labels: tuple[str, ...]
    kind: str = "gauge"  # or "counter"


PROXY_CLIENTS = ScrapeFamily(
    "sluice_proxy_connected_clients", "Client sessions the proxy knows, by client language and version",
    ("language", "version"),
)  # fmt: skip
PROXY_IN_FLIGHT = ScrapeFamily("sluice_proxy_in_flight_requests", "RPCs the proxy is serving right now", ())
PROXY_IN_FLIGHT_BYTES = ScrapeFamily(
    "sluice_proxy_in_flight_bytes", "Request bytes held by the RPCs the proxy is serving right now", ()
)
CONSUMER_LAG = ScrapeFamily(
    "sluice_consumer_lag_messages", "Messages of a topic not yet acknowledged by a consumer group, on one broker",
    ("broker", "group", "topic"),
)  # fmt: skip
CONSUMER_IN_FLIGHT = ScrapeFamily(
    "sluice_consumer_inflight_messages", "Messages delivered to a consumer group and not yet acknowledged",
    ("broker", "group", "topic"),
)  # fmt: skip
DEAD_LETTERED = ScrapeFamily(
    "sluice_dead_lettered_messages_total", "Messages moved to a dead-letter topic since the broker started",
    ("broker",), "counter",
)  # fmt: skip
DISPATCH_LAG_BYTES = ScrapeFamily(
    "sluice_store_dispatch_lag_bytes", "CommitLog bytes written but not yet indexed (invisible to consumers)",
    ("broker",),
)  # fmt: skip
DISPATCH_LAG_SECONDS = ScrapeFamily(
    "sluice_store_dispatch_lag_seconds", "Store-to-index delay of the last dispatched round", ("broker",)
)
UNFLUSHED_BYTES = ScrapeFamily(
    "sluice_store_unflushed_bytes", "CommitLog bytes written but not yet fsynced (async flush)", ("broker",)
)
COMMITLOG_BYTES = ScrapeFamily("sluice_store_commitlog_bytes", "Bytes held by CommitLog segments", ("broker",))
COMMITLOG_SEGMENTS = ScrapeFamily("sluice_store_commitlog_segments", "CommitLog segment files", ("broker",))
ROCKSDB_BYTES = ScrapeFamily(
    "sluice_store_rocksdb_bytes", "Live SST files and memtables of the broker's RocksDB (indexes, pop state, trace)",
    ("broker",),
)  # fmt: skip
DISK_USED_BYTES = ScrapeFamily(
    "sluice_store_disk_used_bytes", "Used bytes of the filesystem holding the broker's data", ("broker",)
)
DISK_TOTAL_BYTES = ScrapeFamily(
    "sluice_store_disk_total_bytes", "Size of the filesystem holding the broker's data", ("broker",)
)
TIMER_PENDING = ScrapeFamily(
    "sluice_timer_pending_messages", "Delay (timer) messages waiting for their delivery time", ("broker",)
)
LITE_TOPICS = ScrapeFamily("sluice_lite_topics", "Lite topics held, per bind topic", ("broker", "topic"))
LITE_SUBSCRIPTIONS = ScrapeFamily(
    "sluice_lite_subscriptions", "Lite subscriptions of the lite consumers active on the broker", ("broker",)
)
LITE_EXPIRED = ScrapeFamily(
    "sluice_lite_topics_expired_total", "Lite topics removed after their expiration since the broker started",
    ("broker",), "counter",
)  # fmt: skip
PRIORITY_MESSAGES = ScrapeFamily(
    "sluice_priority_messages", "Messages stored per priority level of a priority topic", ("broker", "topic", "level")
)
TRANSACTION_HALF = ScrapeFamily(
    "sluice_transaction_half_messages", "Transactional half messages waiting for commit or rollback", ("broker",)
)
TIER_UPLOAD_LAG = ScrapeFamily(
    "sluice_tier_upload_lag_messages", "Messages of a topic stored locally and not yet uploaded to the tier",
    ("broker", "topic"),
)  # fmt: skip
TRACE_PENDING = ScrapeFamily(
    "sluice_trace_pending_events", "Message trace events buffered and not yet written", ("broker",)
)
SERIES_DROPPED = ScrapeFamily(
    "sluice_metrics_series_dropped_total",
    "Samples a scrape-time family dropped because it reached max_series_per_family",
    ("family",), "counter",
)  # fmt: skip

# Broker groups (docs/replication.md).
REPLICATION_PRIMARY = ScrapeFamily(
    "sluice_replication_is_primary", "1 while this member is its group's primary, else 0", ("broker", "group")
)
REPLICATION_EPOCH = ScrapeFamily(
    "sluice_replication_epoch", "The epoch (term) this member last held data of", ("broker", "group")
)
REPLICATION_LAG_BYTES = ScrapeFamily(
    "sluice_replication_lag_bytes", "CommitLog bytes a replica has not yet acknowledged (on the primary)",
    ("group", "replica"),
)  # fmt: skip
REPLICATION_INSYNC = ScrapeFamily(
    "sluice_replication_insync_members", "Members of the in-sync set, the primary included (on the primary)",
    ("group",),
)  # fmt: skip
REPLICATION_FAILOVERS = ScrapeFamily(
    "sluice_replication_failovers_total", "Terms this member won after the group's first", ("broker", "group"),
    "counter",
)  # fmt: skip
REPLICATION_FENCED = ScrapeFamily(
    "sluice_replication_fenced_writes_total", "Writes refused because this member's term was over",
    ("broker", "group"), "counter",
)  # fmt: skip

_AMQP_QUEUE = ("vhost", "queue")
AMQP_QUEUE_READY = ScrapeFamily(
    "sluice_amqp_queue_ready_messages",
    "Messages of an AMQP queue a consumer would get now (as of the previous scrape)", _AMQP_QUEUE,
)  # fmt: skip
AMQP_QUEUE_UNACKED = ScrapeFamily(
    "sluice_amqp_queue_unacked_messages",
    "Messages of an AMQP queue delivered and not yet acknowledged (as of the previous scrape)", _AMQP_QUEUE,
)  # fmt: skip
AMQP_QUEUE_CONSUMERS = ScrapeFamily(
    "sluice_amqp_queue_consumers", "Consumers of an AMQP queue on this proxy", _AMQP_QUEUE
)
AMQP_QUEUE_PUBLISHED = ScrapeFamily(
    "sluice_amqp_queue_published_total", "Messages this proxy stored into an AMQP queue", _AMQP_QUEUE, "counter"
)
AMQP_QUEUE_DELIVERED = ScrapeFamily(
    "sluice_amqp_queue_delivered_total", "Deliveries (redeliveries too) this proxy made from an AMQP queue",
    _AMQP_QUEUE, "counter",
)  # fmt: skip
AMQP_QUEUE_ACKED = ScrapeFamily(
    "sluice_amqp_queue_acked_total", "Messages of an AMQP queue acknowledged through this proxy", _AMQP_QUEUE,
    "counter",
)  # fmt: skip

MQTT_CONNECTIONS = ScrapeFamily(
    "sluice_mqtt_connections", "MQTT connections open on this proxy, by protocol version and transport",
    ("version", "transport"),
)  # fmt: skip
MQTT_SUBSCRIPTIONS = ScrapeFamily(
    "sluice_mqtt_subscriptions", "Subscriptions of the MQTT sessions connected to this proxy", ()
)
MQTT_INFLIGHT = ScrapeFamily(
    "sluice_mqtt_inflight_messages", "QoS 1 and 2 deliveries this proxy sent and the clients have not completed", ()
)
MQTT_MESSAGES = ScrapeFamily(
    "sluice_mqtt_messages_total", "MQTT PUBLISHes received from clients (in) and sent to them (out)",
    ("direction",), "counter",
)  # fmt: skip
MQTT_BYTES = ScrapeFamily(
    "sluice_mqtt_payload_bytes_total", "Payload bytes of the MQTT PUBLISHes received (in) and sent (out)",
    ("direction",), "counter",
)  # fmt: skip
MQTT_CONNECTS = ScrapeFamily(
    "sluice_mqtt_connects_total", "MQTT sessions opened on this proxy (CONNECTs accepted)", (), "counter"
)
MQTT_REFUSED = ScrapeFamily(
    "sluice_mqtt_refused_total",
    "MQTT packets refused and connections closed for cause, by reason code name (MALFORMED_PACKET, ...)",
    ("reason",), "counter",
)  # fmt: skip

SCRAPE_FAMILIES: tuple[ScrapeFamily, ...] = (
    PROXY_CLIENTS, PROXY_IN_FLIGHT, PROXY_IN_FLIGHT_BYTES, CONSUMER_LAG, CONSUMER_IN_FLIGHT, DEAD_LETTERED,
    DISPATCH_LAG_BYTES, DISPATCH_LAG_SECONDS, UNFLUSHED_BYTES, COMMITLOG_BYTES, COMMITLOG_SEGMENTS, ROCKSDB_BYTES,
    DISK_USED_BYTES, DISK_TOTAL_BYTES, TIMER_PENDING, TRANSACTION_HALF, TIER_UPLOAD_LAG, TRACE_PENDING, SERIES_DROPPED,
    REPLICATION_PRIMARY, REPLICATION_EPOCH, REPLICATION_LAG_BYTES, REPLICATION_INSYNC, REPLICATION_FAILOVERS,
    REPLICATION_FENCED,
    LITE_TOPICS, LITE_SUBSCRIPTIONS, LITE_EXPIRED, PRIORITY_MESSAGES,
    AMQP_QUEUE_READY, AMQP_QUEUE_UNACKED, AMQP_QUEUE_CONSUMERS, AMQP_QUEUE_PUBLISHED, AMQP_QUEUE_DELIVERED,
    AMQP_QUEUE_ACKED,
    MQTT_CONNECTIONS, MQTT_SUBSCRIPTIONS, MQTT_INFLIGHT, MQTT_MESSAGES, MQTT_BYTES, MQTT_CONNECTS, MQTT_REFUSED,
)  # fmt: skip

Sample = tuple[ScrapeFamily, tuple[str, ...], float]
Source = Callable[[], Iterable[Sample]]


class _ScrapeCollector:
    """Asks every registered source at scrape time; exposes every scrape family, empty or not."""

    def __init__(self) -> None:
        self._sources: dict[int, Source] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._dropped: dict[str, int] = {}

    def add(self, source: Source) -> Callable[[], None]:
        with self._lock:
            key = self._next
            self._next += 1
            self._sources[key] = source

        def remove() -> None:
            with self._lock:
                self._sources.pop(key, None)

        return remove

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sources = list(self._sources.values())
        # Samples with the same labels (two components of one process, e.g. in tests) are summed:
        # a duplicate series would make the whole scrape invalid.
        samples: dict[str, dict[tuple[str, ...], float]] = {f.name: {} for f in SCRAPE_FAMILIES}
        limit = _config.max_series_per_family
        for source in sources:
            for family, labels, value in source():
                bucket = samples.setdefault(family.name, {})
                if labels not in bucket and len(bucket) >= limit:
                    self._dropped[family.name] = self._dropped.get(family.name, 0) + 1
                    continue
                bucket[labels] = bucket.get(labels, 0.0) + value
        samples[SERIES_DROPPED.name] = {(name,): float(n) for name, n in sorted(self._dropped.items())}
        for family in SCRAPE_FAMILIES:
            yield _family(family, samples[family.name])


def _family(family: ScrapeFamily, samples: dict[tuple[str, ...], float]) -> Metric:
    metric: GaugeMetricFamily | CounterMetricFamily
    if family.kind == "counter":
        metric = CounterMetricFamily(family.name.removesuffix("_total"), family.help, labels=family.labels)
    else:
        metric = GaugeMetricFamily(family.name, family.help, labels=family.labels)
    for labels, value in samples.items():
        metric.add_metric(list(labels), value)
    return metric


_collector = _ScrapeCollector()
REGISTRY.register(_collector)


def register_source(source: Source) -> Callable[[], None]:
    """Add a scrape-time source; returns the function that removes it (call it on close)."""
    return _collector.add(source)


def register_gauge_source(family: ScrapeFamily, fn: Callable[[], float], *labels: str) -> Callable[[], None]:
    """The simplest source: one sample of `family` read from `fn()` at each scrape.

    E.g. the timer wheel: `register_gauge_source(TIMER_PENDING, wheel.pending, broker_name)`.
    """
    if len(labels) != len(family.labels):
        raise ValueError(f"{family.name} takes labels {family.labels}, got {labels}")
    return register_source(lambda: [(family, labels, float(fn()))])


def family_names() -> list[str]:
    """Every family name as it appears in the exposition (counters with `_total`)."""
    names = [f.name for f in SCRAPE_FAMILIES]
    names += (f"{t.name}_total" if isinstance(t, _Tally) else t.name for t in _TALLIES)
    for inst in (STORE_FLUSH_DURATION, TIER_S3_ERRORS, TRACE_EVENTS_DROPPED):
        name = inst.describe()[0].name
        names.append(f"{name}_total" if isinstance(inst, Counter) else name)
    return sorted(names)
