"""Configuration of a broker process (`[broker]` table of the TOML file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from broker.replication.config import ReplicationConfig
from broker.store.config import StoreConfig
from broker.tiering.config import TieringConfig
from common.served import ServedConfig

# What a record holds besides its body, at most: user properties (`max_properties_bytes`), an AMQP
# message's content header (up to a frame, 128 KiB), keys, ids, tag and hosts, with room to spare.
RECORD_HEADROOM_BYTES = 1 << 20


@dataclass(frozen=True)
class PopConfig:
    min_invisible_ms: int = 1_000
    max_invisible_ms: int = 12 * 3600 * 1000
    max_long_poll_ms: int = 30_000
    max_batch_messages: int = 32
    # Compiled subscription filters kept (by kind and expression); a full cache starts over.
    filter_cache_max: int = 10_000
    # How often due (invisible-expired) messages are looked for, for redelivery and dead-lettering.
    redelivery_scan_interval_ms: int = 200
    # Entries of the store one pop may scan past the filter before it returns what it has.
    max_scan_entries: int = 2_000
    # Group cursors the pop state keeps in memory (~150 bytes each; write-through), so that a lite
    # pop's cursors of up to 32 lite topics need no RocksDB read; a full cache starts over.
    cursor_cache_size: int = 200_000

    def __post_init__(self) -> None:
        if self.cursor_cache_size < 0:
            raise ValueError(f"cursor_cache_size is {self.cursor_cache_size}; it must be at least 0")


@dataclass(frozen=True)
class LimitsConfig:
    # The largest body the store takes: an AMQP publish up to the gateway's max_body_bytes (16 MiB,
    # RabbitMQ's default). RocketMQ clients are held to less by their proxy ([proxy.settings]
    # max_body_bytes, a little under 4 MiB: what their gRPC channels can receive).
    max_body_bytes: int = 16 * 1024 * 1024
    max_property_count: int = 128
    max_properties_bytes: int = 16 * 1024
    max_key_count: int = 32
    max_key_chars: int = 128
    max_tag_chars: int = 128
    max_message_group_chars: int = 128
    max_message_id_chars: int = 128
    max_queues_per_topic: int = 1024
    max_batch_messages: int = 1024


@dataclass(frozen=True)
class TransactionConfig:
    """Transactional (half) messages and their orphan check-back (docs/transactions.md)."""

    # First check-back of an unresolved half message this long after it was stored, unless its
    # producer set `orphaned_transaction_recovery_duration`; that value is clamped to the bounds.
    default_recovery_ms: int = 6_000
    min_recovery_ms: int = 1_000
    max_recovery_ms: int = 12 * 3600 * 1000
    # Between two check-backs of the same half message.
    check_interval_ms: int = 30_000
    # After this many unanswered check-backs the half message is rolled back (and logged).
    max_checks: int = 15
    # Half messages pending at once on this broker; more TRANSACTION sends get TOO_MANY_REQUESTS.
    max_pending: int = 1_000_000
    # How often the broker rolls back half messages whose last check went unanswered.
    sweep_interval_ms: int = 1_000


@dataclass(frozen=True)
class TraceConfig:
    """Message trace (broker/trace.py): events of every message, kept `max_age_s`."""

    enabled: bool = True
    max_age_s: float = 72 * 3600.0
    # Events are grouped by time bucket; retention drops whole buckets, a lookup seeks once per bucket.
    bucket_s: float = 3600.0
    flush_interval_ms: int = 200
    # Events waiting for the next flush; beyond it they are dropped (and counted), sends never wait.
    max_pending_events: int = 200_000
    expire_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.bucket_s <= 0 or self.max_age_s <= 0 or self.flush_interval_ms <= 0 or self.max_pending_events <= 0:
            raise ValueError("trace: bucket_s, max_age_s, flush_interval_ms and max_pending_events must be positive")


@dataclass(frozen=True)
class TimerConfig:
    """DELAY messages (docs/timers.md)."""

    # Furthest delivery time a producer may ask for, from now (7 days).
    max_delay_ms: int = 7 * 24 * 3600 * 1000
    # Delivery times are rounded up to a multiple of this: timers of one tick are delivered together.
    precision_ms: int = 1_000
    # Timers moved into their topics per store append.
    batch_messages: int = 1_000
    # A tick's timers are read and encoded this long before it (never delivered early), so a burst
    # due in one tick costs only the append at its time; at most `prefetch_bytes` of copies are held.
    prefetch_ms: int = 2_000
    prefetch_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class LiteConfig:
    """Lite topics (docs/lite-topics.md)."""

    # Lite topics one bind topic may hold on this broker when the topic sets no `max_lite_topics`.
    max_lite_topics: int = 1_000_000
    # Lite topics one client may subscribe to when its proxy announces no smaller quota.
    max_subscriptions: int = 20_000
    max_name_chars: int = 64
    # How often expired lite topics are removed, and at most how many per run (bounded work).
    sweep_interval_ms: int = 1_000
    sweep_batch: int = 10_000
    # Lite topics whose name -> id mapping stays cached (the most recently used; at most twice this).
    cache_size: int = 100_000
    # A client with no pop or sync for this long is forgotten in memory (its subscriptions stay stored).
    idle_client_s: float = 600.0


@dataclass(frozen=True)
class BrokerConfig(ServedConfig):
    """The `[broker]` table: the keys every served process states (common/served.py), then the broker's own."""

    # The internal gRPC service (proxies, admin, other brokers); 0 picks a free port.
    port: int = 10911
    name: str = "broker-a"
    cluster: str = "sluice"
    # A merged node (docs/shards.md): host:port of the proxy in this process, registered with the
    # NameServer so every node can route clients straight to the node owning a queue; "" if none.
    client_endpoint: str = ""
    data_dir: Path = Path("data/broker")
    heartbeat_interval_s: float = 5.0
    # Create topics and groups on first use (merged mode default; auto-created topics accept every type).
    auto_create: bool = False
    auto_create_queue_count: int = 8
    store: StoreConfig = field(default_factory=StoreConfig)
    pop: PopConfig = field(default_factory=PopConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    transaction: TransactionConfig = field(default_factory=TransactionConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    # Tiered storage (`[broker.tiering]`): off unless `bucket` is set; see docs/tiered-format.md.
    tiering: TieringConfig = field(default_factory=TieringConfig)
    timer: TimerConfig = field(default_factory=TimerConfig)
    # Broker groups (`[broker.replication]`, docs/replication.md): off unless `group` is set.
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    lite: LiteConfig = field(default_factory=LiteConfig)
    # A message sent with `dedup` (the Spark sink) whose id this broker stored in the topic within
    # this many seconds is not stored again (broker/dedup.py); 0 stores every copy.
    dedup_window_s: float = 600.0

    def __post_init__(self) -> None:
        super().__post_init__()  # the served keys' checks (an advertise others can dial)
        room = self.store.commitlog.max_record_bytes - self.limits.max_body_bytes
        if room < RECORD_HEADROOM_BYTES:
            raise ValueError(f"store.commitlog.max_record_bytes ({self.store.commitlog.max_record_bytes}) must leave "
                             f"{RECORD_HEADROOM_BYTES} bytes over limits.max_body_bytes ({self.limits.max_body_bytes}) "
                             "for a message's properties, keys and ids")  # fmt: skip
