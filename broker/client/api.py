"""`BrokerApi`: what the proxy (and the admin tool) can ask of one broker.

Two implementations pass one contract suite (tests/contract): `LocalBroker` (broker/local.py, the
broker in this process; plain awaits) and `RemoteBroker` (broker/client/remote.py, a gRPC client of the
broker's internal service). A proxy talks to several brokers through a directory of BrokerApi
objects keyed by broker name; everything here concerns the one broker it is called on.

All types are protocol-free dataclasses. Errors are `common.errors.SluiceError`s, identical in both
implementations (the internal RPC carries their codes). Every call is safe to retry except `send`
(which may store a message twice if its reply is lost: at-least-once, as in the public protocol).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import NamedTuple, Protocol, runtime_checkable

from common.errors import SluiceError
from common.model import MESSAGE_TYPES, MessageType, Permission
from common.record import FLAG_BODY_GZIP, MessageRecord

# -- the call ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallContext:
    """Whom a call serves and until when: built once at the proxy's edge from the client's request
    (proxy/grpc/status.py) and passed through the proxy's core to `BrokerApi`. A `RemoteBroker`
    sends the ids as call metadata and the deadline as the gRPC timeout; the broker's service
    rebuilds the context on its side. Calls made for no client (admin, background work) pass
    `NO_CONTEXT`."""

    request_id: str = ""
    client_id: str = ""
    namespace: str = ""
    deadline: float | None = None  # a time.monotonic() value; None: no deadline

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def expired(self) -> bool:
        return self.deadline is not None and self.deadline <= time.monotonic()


NO_CONTEXT = CallContext()


# -- metadata -------------------------------------------------------------------------------------


class ConsumeFrom(Enum):
    LATEST = "latest"  # messages stored after the group was created
    EARLIEST = "earliest"  # the oldest message still stored
    TIMESTAMP = "timestamp"  # messages stored at or after `consume_from_timestamp_ms`


class BackoffKind(Enum):
    EXPONENTIAL = "exponential"
    CUSTOMIZED = "customized"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a failed message stays invisible before its next attempt."""

    kind: BackoffKind = BackoffKind.EXPONENTIAL
    initial_ms: int = 1_000
    max_ms: int = 60_000
    multiplier: float = 2.0
    customized_ms: tuple[int, ...] = ()

    def delay_ms(self, attempt: int) -> int:
        """Delay after the `attempt`-th failed delivery (attempt >= 1)."""
        n = max(attempt, 1)
        if self.kind is BackoffKind.CUSTOMIZED and self.customized_ms:
            return self.customized_ms[min(n, len(self.customized_ms)) - 1]
        return int(min(self.max_ms, self.initial_ms * self.multiplier ** (n - 1)))


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    queue_count: int = 8
    message_types: frozenset[MessageType] = frozenset({MessageType.NORMAL})
    permission: Permission = Permission.READ_WRITE
    max_priority: int = 9  # PRIORITY topics: priorities 0..max_priority (larger is more urgent)
    lite_expiration_s: int = 600  # LITE topics: a lite topic without a new message this long is removed
    max_lite_topics: int = 0  # LITE topics: lite topics per broker (0: the broker's limit)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    name: str
    fifo: bool = False
    max_delivery_attempts: int = 16
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    consume_from: ConsumeFrom = ConsumeFrom.LATEST
    consume_from_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class GroupInfo:
    spec: GroupSpec
    created_ms: int


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue_id: int
    min_offset: int
    max_offset: int  # one past the newest message
    # One past the newest message that can never change: every offset below it survives a failover
    # (a replicated primary: every in-sync member holds it); standalone, max_offset. Readers that must
    # not see a message replaced (the Spark streaming source) read no further.
    acked_offset: int


@dataclass(frozen=True, slots=True)
class TopicStatus:
    spec: TopicSpec
    queues: tuple[QueueStatus, ...]
    half_messages: int = 0  # transactional messages of this topic awaiting commit or rollback
    pending_timers: int = 0  # DELAY messages of the topic not delivered yet
    # Bytes of the topic's messages on this broker's local disk, estimated: the messages stored
    # locally times the mean size of each queue's newest ConsumeQueue block (exact sums would read
    # every entry). Tiered bytes are in `tier_status`.
    local_bytes: int = 0
    delivered: int = 0  # messages handed to consumers since the broker started (every attempt, pop and pull)


@dataclass(frozen=True, slots=True)
class GroupQueueStatus:
    topic: str
    queue_id: int
    consumed_offset: int  # everything below is acknowledged (or dead-lettered)
    max_offset: int
    lag: int  # messages not yet acknowledged (max_offset - consumed_offset)
    in_flight: int  # delivered, not yet acknowledged
    retrying: int = 0  # not yet done and delivered more than once (nacked or timed out before)
    # What a pop would hand out now, exactly: never delivered (max_offset less the group's read
    # position) plus delivered ones whose invisibility ended (an AMQP queue's ready count).
    ready: int = 0
    due: int = 0  # of `in_flight`, those whose invisibility ended (requeued, or timed out): in `ready` too
    ready_bytes: int = 0  # body bytes of the `ready` messages, when asked for (else 0)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    info: GroupInfo
    queues: tuple[GroupQueueStatus, ...]


# -- messages -------------------------------------------------------------------------------------


class SendResult(NamedTuple):
    """Where one sent message was stored. A NamedTuple (immutable like the frozen dataclasses
    here): one is built per produced message, and it costs a third of a frozen dataclass."""

    message_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str = ""
    recall_handle: str = ""


class StoredMessage:
    """A message as a consumer gets it: its stored record, decoded once (`record`; its fields are
    read through, never copied), and what this delivery adds: the attempt (1 on first delivery),
    the receipt handle and invisibility deadline a pop sets, and the store host (the record's, or
    the broker's address given here when the record names none). A `RemoteBroker` gets the record's
    bytes unchanged and decodes them into the same shape (broker/client/grpc_convert.py)."""

    __slots__ = ("delivery_attempt", "invisible_until_ms", "receipt_handle", "record", "store_host")

    def __init__(
        self, record: MessageRecord, delivery_attempt: int = 1, receipt_handle: str = "", invisible_until_ms: int = 0,
        store_host: str = "",
    ) -> None:  # fmt: skip
        self.record = record
        self.delivery_attempt = delivery_attempt
        self.receipt_handle = receipt_handle
        self.invisible_until_ms = invisible_until_ms
        self.store_host = record.store_host or store_host

    @property
    def topic(self) -> str:
        return self.record.topic

    @property
    def queue_id(self) -> int:
        return self.record.queue_id

    @property
    def queue_offset(self) -> int:
        return self.record.queue_offset

    @property
    def body(self) -> bytes:
        return self.record.body

    @property
    def message_id(self) -> str:
        return self.record.message_id

    @property
    def message_type(self) -> MessageType:
        return MESSAGE_TYPES.get(self.record.message_type, MessageType.NORMAL)  # unknown numbers: NORMAL

    @property
    def tag(self) -> str | None:
        return self.record.tag

    @property
    def keys(self) -> tuple[str, ...]:
        return self.record.keys

    @property
    def message_group(self) -> str | None:
        return self.record.message_group

    @property
    def properties(self) -> dict[str, str]:
        return self.record.properties

    @property
    def system_properties(self) -> dict[str, str]:
        return self.record.system_properties

    @property
    def born_timestamp_ms(self) -> int:
        return self.record.born_timestamp_ms

    @property
    def born_host(self) -> str:
        return self.record.born_host

    @property
    def store_timestamp_ms(self) -> int:
        return self.record.store_timestamp_ms

    @property
    def delivery_timestamp_ms(self) -> int:
        return self.record.delivery_timestamp_ms

    @property
    def body_gzip(self) -> bool:
        return bool(self.record.flags & FLAG_BODY_GZIP)

    def _seen(self) -> tuple[object, ...]:
        """Everything a consumer sees of this delivery."""
        r = self.record
        return (
            r.topic, r.queue_id, r.queue_offset, r.body, r.message_id, self.message_type, r.tag, r.keys,
            r.message_group, r.properties, r.system_properties, r.born_timestamp_ms, r.born_host,
            r.store_timestamp_ms, self.store_host, r.delivery_timestamp_ms, self.delivery_attempt, self.body_gzip,
            self.receipt_handle, self.invisible_until_ms,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredMessage) and self._seen() == other._seen()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaced

    def __repr__(self) -> str:
        r = self.record
        return (
            f"StoredMessage(topic={r.topic!r}, queue_id={r.queue_id}, queue_offset={r.queue_offset}, "
            f"message_id={r.message_id!r}, delivery_attempt={self.delivery_attempt}, "
            f"receipt_handle={self.receipt_handle!r})"
        )


class FilterKind(IntEnum):
    """The protocol's `FilterType` numbers."""

    TAG = 1
    SQL = 2


@dataclass(frozen=True, slots=True)
class FilterSpec:
    kind: FilterKind = FilterKind.TAG
    expression: str = "*"


@dataclass(frozen=True, slots=True)
class PopRequest:
    group: str
    topic: str
    queue_id: int | None = None  # None: any queue of the topic on this broker
    max_messages: int = 32
    invisible_ms: int = 30_000
    filter: FilterSpec = field(default_factory=FilterSpec)
    long_poll_ms: int = 0
    lite_client: str = ""  # a lite consumer's client id: pop from the lite topics it subscribes to
    # Messages of one lite topic in flight to the group at once: 1 keeps the lite order (the next
    # after the previous is settled); the MQTT gateway asks for its session's window (docs/mqtt.md).
    lite_window: int = 1


@dataclass(frozen=True, slots=True)
class AckResult:
    """One handle's outcome: `error` None when it was done, else why not (each edge maps it to
    its wire code in its one error function)."""

    receipt_handle: str
    error: SluiceError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class PullResult:
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueRows:
    """A run of one queue's messages, each as the tiered archive holds it (`BrokerApi.read_rows`)."""

    # An Arrow IPC stream of rows in the tiered segment schema (docs/tiered-format.md), offsets
    # `offset`, `offset + 1`, ... in order; b"" when count is 0.
    rows: bytes
    count: int
    next_offset: int  # one past the last row; the requested offset when there is none
    min_offset: int  # the oldest offset the broker can still read (tiered copies included)
    max_offset: int  # one past the newest stored message


READ_ROWS_MAX_MESSAGES = 10_000  # the most rows one read_rows returns
READ_ROWS_MAX_BYTES = 16 << 20  # and about the most bytes of records (at least one row)


class OffsetPolicy(Enum):
    BEGINNING = "beginning"
    END = "end"
    TIMESTAMP = "timestamp"


class TransactionResolution(Enum):
    """How a producer ends a transaction (numbers as apache.rocketmq.v2.TransactionResolution)."""

    UNSPECIFIED = 0  # undecided yet: the half message stays pending and is checked again
    COMMIT = 1
    ROLLBACK = 2


class TransactionSource(Enum):
    UNSPECIFIED = 0
    CLIENT = 1  # the producer's commit() / rollback()
    SERVER_CHECK = 2  # the producer's answer to a check-back


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """A check-back handed to a proxy: ask a producer of `message.topic` how the transaction ended."""

    transaction_id: str
    message: StoredMessage  # as it will be delivered once committed (topic, queue, id, type TRANSACTION)
    check: int  # 1 for the first check-back of this half message


# The broker contract by role: each role is one Protocol, and `BrokerApi` is all of them (a
# `LocalBroker` or a `RemoteBroker`). Code that needs one role names that role: the proxy's core
# services hold `MessagingApi`s; the admin tool and console, every role.


@runtime_checkable
class MessagingApi(Protocol):
    """What a client's messaging needs of one broker: produce, consume (pop and pull), transactions,
    timers, and the topic and group lookups that route them. Every method may raise a SluiceError;
    `ctx` is the client request a call serves (docs/architecture.md, the call context)."""

    @property
    def name(self) -> str: ...

    async def get_topic(self, name: str, *, auto_create: bool = False, like: TopicSpec | None = None) -> TopicSpec:
        """The topic; with `auto_create`, created first where the broker auto-creates topics.
        `like`: the cluster's definition of a topic created on first use (docs/shards.md): created
        as `like` (with `auto_create`), and a copy whose types its first message has not decided
        yet takes like's; a topic that exists otherwise is never changed."""
        ...

    async def get_group(self, name: str, *, auto_create: bool = False, like: GroupSpec | None = None) -> GroupInfo:
        """The group; with `auto_create`, created first where the broker auto-creates groups: as
        `like` (the cluster's definition, another broker's copy) when given, else with defaults."""
        ...

    # produce
    async def send(
        self, topic: str, queue_id: int, records: Sequence[bytes], *, ctx: CallContext = NO_CONTEXT
    ) -> list[SendResult]: ...  # `records` by common.record.outgoing; past ctx's deadline RequestTimeout, none stored

    # pop consumption
    async def pop(self, request: PopRequest, *, ctx: CallContext = NO_CONTEXT) -> list[StoredMessage]: ...
    async def ack(
        self, group: str, topic: str, receipt_handles: list[str], *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]: ...
    async def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> str: ...
    async def nack(self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str: ...
    async def renew(
        self, group: str, topic: str, receipt_handles: list[str], invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]: ...  # extend invisibility, handles stay valid (auto renew)
    async def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT
    ) -> None: ...

    # pull consumption and offsets
    async def pull(
        self, group: str, topic: str, queue_id: int, offset: int, max_messages: int,
        filter: FilterSpec, long_poll_ms: int = 0, *, ctx: CallContext = NO_CONTEXT,
    ) -> PullResult: ...  # fmt: skip
    async def get_offset(self, group: str, topic: str, queue_id: int, *, ctx: CallContext = NO_CONTEXT) -> int: ...
    async def update_offset(
        self, group: str, topic: str, queue_id: int, offset: int, *, ctx: CallContext = NO_CONTEXT
    ) -> None: ...
    async def query_offset(
        self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0, *, ctx: CallContext = NO_CONTEXT
    ) -> int: ...
    async def read_rows(
        self, topic: str, queue_id: int, offset: int, end_offset: int, max_messages: int, max_bytes: int
    ) -> QueueRows: ...  # [offset, end_offset) of a queue, local or tiered, many per call (Spark's source)

    # transactions (docs/transactions.md)
    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource, *, ctx: CallContext = NO_CONTEXT,
    ) -> None: ...  # fmt: skip
    async def claim_transaction_checks(self, topics: list[str], max_checks: int) -> list[TransactionCheck]:
        """Due check-backs of half messages of `topics` (those with a live producer on the caller).

        Each returned check counts as made: the half message is next due one check interval later.
        """
        ...

    # timers
    async def recall(
        self, topic: str, recall_handle: str, *, ctx: CallContext = NO_CONTEXT
    ) -> str: ...  # cancels a pending DELAY message


@runtime_checkable
class AdminApi(Protocol):
    """Topics and groups, their status, lookups and traces of messages, offsets reset, what the
    broker runs (`sluice admin`, the console, the AMQP gateway's queues)."""

    async def create_topic(self, spec: TopicSpec) -> TopicSpec: ...
    async def update_topic(self, spec: TopicSpec) -> TopicSpec: ...
    async def delete_topic(self, name: str) -> None: ...
    async def list_topics(self) -> list[TopicSpec]: ...
    async def topic_status(self, name: str) -> TopicStatus: ...
    async def create_group(self, spec: GroupSpec) -> GroupInfo: ...
    async def update_group(self, spec: GroupSpec) -> GroupInfo: ...
    async def delete_group(self, name: str) -> None: ...
    async def list_groups(self) -> list[GroupInfo]: ...
    async def group_status(self, name: str, topics: Sequence[str] = (), *, ready_bytes: bool = False) -> GroupStatus:
        """Every queue here of the topics the group consumed here, and of `topics` (counted from the
        group's start position where it never consumed). `ready_bytes`: each queue's
        `ready_bytes` filled in (the broker then tracks the queue's body sizes: broker/readybytes.py)."""
        ...

    # lookups
    async def get_message(self, topic: str, message_id: str) -> list[StoredMessage]: ...
    async def find_messages_by_key(self, topic: str, key: str, limit: int = 64) -> list[StoredMessage]: ...

    # observability
    async def message_trace(self, message_id: str) -> list[TraceEvent]: ...  # oldest first

    # operations (`sluice admin group reset-offset`)
    async def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> OffsetReset:
        """Consume the queue from `offset` on (clamped to the stored range): messages in flight are
        forgotten (their receipt handles stop working) and the pull offset moves too."""
        ...

    # what the broker runs and how its store keeps up (`sluice admin broker list`, the console)
    async def broker_info(self) -> BrokerInfo: ...


@runtime_checkable
class TieringApi(Protocol):
    """Tiered storage (`sluice admin tier ...`); PreconditionFailed where tiering is not configured."""

    async def tier_status(self) -> TierStatus: ...
    async def tier_upload_now(
        self, topic: str, timeout_s: float
    ) -> TierTopicStatus: ...  # tier everything dispatched so far; returns once it is safely uploaded
    async def tier_evict_local(self, topic: str) -> TierEvictResult: ...  # drop local copies of tiered data now


@runtime_checkable
class LiteApi(Protocol):
    """Lite topic subscriptions (docs/lite-topics.md)."""

    async def sync_lite_subscription(self, sync: LiteSync) -> int:
        """Apply a client's subscription change on this broker; how many lite topics of the bind
        topic the client then holds here."""
        ...

    async def list_lite_topics(self, topic: str, group: str = "", limit: int = 100) -> LiteTopicList: ...
    async def claim_lite_removals(
        self, client_ids: list[str]
    ) -> list[LiteRemoval]: ...  # unsubscribed by the broker (expired, deleted): tell these clients


@runtime_checkable
class ReportsApi(Protocol):
    """The proxies' reports of their connected clients (`sluice admin client list`)."""

    async def report_clients(self, proxy: str, clients: list[ConnectedClient], ttl_ms: int) -> None:
        """A proxy's connected clients, replacing its previous report; forgotten after `ttl_ms`."""
        ...

    async def list_clients(self) -> list[ConnectedClient]: ...  # as the proxies last reported them


@runtime_checkable
class BrokerApi(MessagingApi, AdminApi, TieringApi, LiteApi, ReportsApi, Protocol):
    """One broker, local (`broker.local.LocalBroker`) or remote (`RemoteBroker`), in every role."""


# -- message trace (appended: see broker/trace.py and docs/observability.md) -----------------------


class TraceKind(Enum):
    SENT = "sent"  # stored for a producer
    DELIVERED = "delivered"  # handed to a consumer group (attempt counts deliveries)
    ACKED = "acked"
    INVISIBLE = "invisible"  # a consumer changed its invisible duration (a nack, a retry later)
    DEAD_LETTERED = "dead_lettered"  # copied to the group's dead-letter topic
    TIERED = "tiered"  # its queue range was uploaded to the object store


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One event in the life of a message on one broker."""

    kind: TraceKind
    time_ms: int
    topic: str
    queue_id: int
    queue_offset: int
    message_id: str = ""
    group: str = ""
    attempt: int = 0
    client_id: str = ""
    detail: dict[str, str] = field(default_factory=dict)  # born_host, dlq_topic, invisible_ms, object...


# -- tiered storage -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierQueueStatus:
    queue_id: int
    local_min: int
    local_max: int  # one past the newest message on local disk
    tiered_min: int  # the oldest offset still in the bucket
    tiered_end: int  # one past the newest tiered message (tiered_min == tiered_end: none)


@dataclass(frozen=True, slots=True)
class TierTopicStatus:
    topic: str
    queues: tuple[TierQueueStatus, ...]
    lag_messages: int  # stored locally, not yet tiered
    lag_s: float  # age of the oldest message not yet tiered
    bytes: int  # in the bucket
    objects: int
    last_error: str  # of the last failed upload; "" once one succeeds
    failures: int  # consecutive failed upload rounds
    last_upload_ms: int


@dataclass(frozen=True, slots=True)
class TierStatus:
    enabled: bool
    store: str  # endpoint and bucket (never credentials); "" when disabled
    topics: tuple[TierTopicStatus, ...] = ()
    # Object store requests since the broker started (metrics read these).
    puts: int = 0
    put_bytes: int = 0
    gets: int = 0
    get_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TierEvictResult:
    topic: str
    messages: int  # local index entries dropped: reads of them now come from the bucket
    segments: int  # whole CommitLog segments deleted because everything in them is tiered


# -- operations -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetReset:
    topic: str
    queue_id: int
    previous: int  # the group's consumed offset before the reset
    offset: int  # where it consumes from now (the requested offset clamped to the stored range)


@dataclass(frozen=True, slots=True)
class ConnectedClient:
    """A client connected to a proxy, as the proxy knows it from Settings and Heartbeats."""

    client_id: str
    language: str  # JAVA, PYTHON, NODE_JS, ... ("" until its Settings arrive)
    version: str
    client_type: str  # PRODUCER, PUSH_CONSUMER, SIMPLE_CONSUMER, ...
    address: str  # host:port the client connects from
    proxy: str  # the proxy it is connected to (its advertised address)
    group: str  # consumers only
    topics: tuple[str, ...]  # published or subscribed
    last_seen_ms: int  # epoch ms of its last heartbeat, settings or stream activity
    detail: str = ""  # JSON: an AMQP connection's vhost, user and channels ("" for RocketMQ clients)


# -- lite topics (appended: see broker/lite/ and docs/lite-topics.md) -------------------------------


class LiteAction(Enum):
    """How a SyncLiteSubscription changes a client's set (numbers as apache.rocketmq.v2)."""

    PARTIAL_ADD = 0
    PARTIAL_REMOVE = 1
    COMPLETE_ADD = 2  # the whole set: replaces what the client subscribed to before
    COMPLETE_REMOVE = 3  # drop the whole set


class LiteOffsetPolicy(Enum):
    LAST = 0  # where the group left off (a lite topic it never consumed: its oldest message)
    MIN = 1
    MAX = 2


@dataclass(frozen=True, slots=True)
class LiteOffset:
    """Where a newly added lite topic starts for the group: exactly one field is set."""

    policy: LiteOffsetPolicy | None = None
    offset: int | None = None
    tail_n: int | None = None
    timestamp_ms: int | None = None


# `LiteSync.topic` of filter subscriptions that apply to every LITE topic of a namespace on a broker,
# those created later included: `ns%*` (`*` for the default namespace; `*` is no topic name). The MQTT
# gateway registers filters whose first level is a wildcard (`#`, `+/x`) so (docs/mqtt.md).
EVERY_LITE_TOPIC = "*"
_NAMESPACE_SEPARATOR = "%"  # a cluster-wide name is `namespace%name` (proxy/names.py)


def lite_scope(topic: str) -> str:
    """The name of the namespace-wide filter subscriptions that apply to the LITE topic `topic`."""
    namespace, sep, _ = topic.rpartition(_NAMESPACE_SEPARATOR)
    return namespace + sep + EVERY_LITE_TOPIC


def is_lite_scope(name: str) -> bool:
    return name.rpartition(_NAMESPACE_SEPARATOR)[2] == EVERY_LITE_TOPIC


@dataclass(frozen=True, slots=True)
class LiteSync:
    group: str
    topic: str  # the bind topic (or, for filters, a namespace's scope: `lite_scope`)
    client_id: str
    action: LiteAction
    lite_topics: tuple[str, ...]
    version: int = 0  # 0: unversioned; else a request older than the last one applied is ignored
    offset: LiteOffset | None = None
    quota: int = 0  # subscriptions a client may hold (0: the broker's limit)
    # `lite_topics` are filters (`a/+/c`, `a/#`; common/litefilter.py): the broker subscribes the
    # client to each lite topic a filter matches when a message is stored in it (docs/mqtt.md).
    filters: bool = False


@dataclass(frozen=True, slots=True)
class LiteTopicInfo:
    name: str
    backlog: int  # messages stored (for a group: not yet consumed by it)
    last_write_ms: int
    created_ms: int
    subscribers: int  # clients subscribed


@dataclass(frozen=True, slots=True)
class LiteTopicList:
    topic: str
    count: int  # lite topics of the bind topic on this broker
    topics: tuple[LiteTopicInfo, ...]  # the largest backlogs first, at most `limit`


@dataclass(frozen=True, slots=True)
class LiteRemoval:
    """A lite topic the broker removed from a client's subscriptions (NotifyUnsubscribeLiteCommand)."""

    client_id: str
    group: str
    topic: str
    lite_topic: str


# -- broker information ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    version: str  # of the Sluice the broker runs
    started_ms: int  # when the broker started (epoch ms)
    disk_used_bytes: int  # of the filesystem holding the data directory
    disk_total_bytes: int
    store_bytes: int  # CommitLog and index on local disk
    unflushed_bytes: int  # written to the CommitLog, not yet flushed: the store's lag
    dispatch_lag_bytes: int  # written, not yet indexed (invisible to consumers)
    dispatch_lag_ms: int  # store-to-index delay of the last dispatch round
