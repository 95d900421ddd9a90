"""`LocalBroker`: the broker in this process, implementing `BrokerApi` with plain awaits.

It owns the store, the metadata, the pop engine and its background tasks (redelivery scanning,
retention), and, when `[broker.tiering]` is configured, tiered storage (`BrokerTiering`: the
uploader task, the retention veto, and the cold reads that pop, pull, offset queries and lookups
fall through to below the local copy of a queue). It assembles the parts and checks what a call
names (topic, group, queue); the paths live in their own modules: sends in broker/produce.py,
pop and acks in broker/consumer.py, pull, offsets, lookups and traces in broker/reads.py.

The merged topology's proxy calls it directly; a broker process serves it over the internal gRPC
service (broker/service.py) to remote proxies and the admin tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from broker import priority
from broker.amqp_meta_store import AMQP_META_CFS, AmqpMetaStore
from broker.client.api import (
    NO_CONTEXT,
    AckResult,
    BrokerInfo,
    CallContext,
    ConnectedClient,
    FilterSpec,
    GroupInfo,
    GroupSpec,
    GroupStatus,
    LiteRemoval,
    LiteSync,
    LiteTopicList,
    OffsetPolicy,
    OffsetReset,
    PopRequest,
    PullResult,
    QueueRows,
    QueueStatus,
    SendResult,
    StoredMessage,
    TierEvictResult,
    TierQueueStatus,
    TierStatus,
    TierTopicStatus,
    TopicSpec,
    TopicStatus,
    TraceEvent,
    TransactionCheck,
    TransactionResolution,
    TransactionSource,
    is_lite_scope,
    lite_scope,
)
from broker.clients import ClientTable
from broker.config import BrokerConfig
from broker.consumer import PopEngine
from broker.dedup import Deduplicator
from broker.filter import FilterKind, MessageFilter, compile_filter
from broker.lite.keys import LITE_CFS
from broker.lite.service import LiteService, check_lite_spec, is_lite
from broker.lite.state import LiteState
from broker.longpoll import LongPollHub, topic_key
from broker.messages import validate_queue
from broker.metadata import METADATA_CFS, Metadata, validate_group_spec
from broker.metrics import broker_samples
from broker.mqtt_store import MQTT_CFS, MqttStateStore
from broker.popstate import POP_CFS, PopState
from broker.priority import check_priority_spec, is_priority
from broker.produce import Producer
from broker.reads import Reader
from broker.security_store import SECURITY_CFS, SecurityStore
from broker.store.deletion import Deletion
from broker.store.dispatcher import Touched, call_soon_from_any_thread
from broker.store.durability import LOCAL, Durability
from broker.store.store import MessageStore
from broker.tiering.runtime import TIER_CFS, BrokerTiering, not_enabled
from broker.timer.keys import TIMER_CFS
from broker.timer.service import TimerService
from broker.topic_deletion import TopicDeletion
from broker.trace import CF_TRACE, TRACE_CFS, TraceRecorder
from broker.transaction.pending import TXN_CFS
from broker.transaction.service import TransactionService
from common import metrics
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import (
    BadRequest,
    ClientIdRequired,
    Forbidden,
    MessageTypeConflict,
    OffsetNotFound,
    PreconditionFailed,
    RequestTimeout,
    SluiceError,
    StoreClosed,
    TopicNotFound,
)
from common.logs import kv
from common.model import (
    ADMIN_READ_GROUP_PREFIX,
    ALL_MESSAGE_TYPES,
    EXCLUSIVE_TYPES,
    UNDECIDED_TYPES,
    MessageType,
    TopicInfo,
    auto_types,
    dlq_topic,
    is_system_topic,
    validate_group_name,
    validate_topic_name,
)
from common.record import (
    FLAG_DEDUP,
    SYSPROP_DLQ_ATTEMPTS,
    SYSPROP_DLQ_ORIGIN_OFFSET,
    SYSPROP_DLQ_ORIGIN_QUEUE,
    SYSPROP_DLQ_ORIGIN_TOPIC,
    MessageRecord,
    copy_to_store,
    received,
)
from common.version import sluice_version

if TYPE_CHECKING:  # the tiering core loads pyarrow: only a broker that tiers imports it (BrokerTiering)
    from broker.tiering.manifest import SegmentEntry
    from broker.tiering.uploader import TopicStatus as UploaderTopicStatus

log = logging.getLogger("sluice.broker")


@dataclass(frozen=True, slots=True)
class _Parts:
    """What exists only while the broker runs (all of it holds RocksDB handles)."""

    metadata: Metadata
    pop_state: PopState
    engine: PopEngine
    transactions: TransactionService
    trace: TraceRecorder
    tiering: BrokerTiering | None
    timers: TimerService
    producer: Producer
    reader: Reader
    lite: LiteService
    deletions: TopicDeletion


# Every column family a broker's store holds (a replica opens the same store with the same list).
BROKER_CFS = (
    METADATA_CFS
    + POP_CFS
    + TIER_CFS
    + TXN_CFS
    + TRACE_CFS
    + SECURITY_CFS
    + TIMER_CFS
    + LITE_CFS
    + AMQP_META_CFS
    + MQTT_CFS
)


class LocalBroker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        term: int = 0,
        term_valid: Callable[[], bool] | None = None,
        durability: Durability = LOCAL,
        on_topics_changed: Callable[[], Awaitable[object]] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`term`, `term_valid`: this broker serves primary term `term` of a replicated group
        (member.py), valid while `term_valid` returns True. Its pop entries get receipt handle
        versions of that term (popstate.first_version); tiering starts a new object key epoch and
        overwrites another broker's manifest.json only while the term is valid
        (broker/tiering/manifest.py). `durability`: what a write and a consumer state change wait
        for before they are acknowledged (broker/store/durability.py: nothing standalone, the
        group's in-sync set on a replicated primary). `on_topics_changed`: awaited after a topic
        is created, updated or deleted (the NameServer registration reports at once; a failure is
        logged, the next heartbeat catches up). `clock`: what invisibility, redelivery, timers,
        transaction check-backs and lite expiry read the time from (common/clock.py)."""
        self.config = config
        self._term = term
        self._term_valid = term_valid
        self._durability = durability
        self._on_topics_changed = on_topics_changed
        self._clock = clock
        self._store: MessageStore | None = None
        self._parts: _Parts | None = None
        self._dedup: Deduplicator | None = None  # sends flagged `dedup` (broker/dedup.py)
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._filters: dict[tuple[int, str], MessageFilter] = {}
        self._trace_task: asyncio.Task[None] | None = None
        self._unregister_metrics: Callable[[], None] | None = None
        # Retention and tiering's evict-local both delete CommitLog segments: one at a time.
        self._retention_lock = threading.Lock()
        self._security: SecurityStore | None = None
        self._amqp_meta: AmqpMetaStore | None = None
        self._mqtt: MqttStateStore | None = None
        self._started_ms = 0
        self.clients = ClientTable(clock)
        self._purges: set[asyncio.Future[int]] = set()  # deleted topics' archived objects being deleted

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def term(self) -> int:
        """The primary term this broker serves (0: no replicated group)."""
        return self._term

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        self._store = await loop.run_in_executor(
            None,
            lambda: MessageStore(cfg.data_dir, cfg.store, extra_cfs=BROKER_CFS, durability=self._durability),
        )
        store = self._store
        tiering: BrokerTiering | None = None
        if cfg.tiering.enabled:
            try:
                lock, term, clock = self._retention_lock, self._term_valid, self._clock
                tiering = await loop.run_in_executor(None, lambda: BrokerTiering(
                    store, cfg.tiering, cluster=cfg.cluster, broker=cfg.name, retention_lock=lock,
                    new_epoch=term is not None, may_overwrite=term or (lambda: True), clock=clock))  # fmt: skip
            except BaseException:
                self._store = None
                await loop.run_in_executor(None, store.close)
                raise
        metadata = Metadata(store.index)
        pop_state = PopState(store.index, term=self._term, cursor_cache_size=cfg.pop.cursor_cache_size,
                             acked_state=self._durability.acked_state,
                             lite_topic=functools.partial(_is_lite_topic, metadata))  # fmt: skip
        self.hub = LongPollHub(loop)
        store.add_dispatch_listener(lambda touched: self.hub.notify_threadsafe(map(topic_key, touched)))
        trace = TraceRecorder(cfg.name, cfg.trace, store.index.cf(CF_TRACE), store.index.handle(CF_TRACE),
                              store.index.batch, store.index.write, self._clock)  # fmt: skip
        engine = PopEngine(
            broker_name=cfg.name, store=store, metadata=metadata, state=pop_state, hub=self.hub,
            config=cfg.pop, dead_letter=self._dead_letter, trace=trace, cold=tiering, clock=self._clock,
            store_host=cfg.advertised_address,
        )  # fmt: skip
        if tiering is not None:

            def on_uploaded(topic: str, entry: SegmentEntry) -> None:
                loop.call_soon_threadsafe(_trace_tiered, trace, topic, entry)

            tiering.uploader.on_uploaded = on_uploaded
        timers = TimerService(cfg.name, store, cfg.timer, lambda topic: topic in metadata.topics, self._clock)
        store.retention_pins.append(timers.min_position)
        transactions = TransactionService(cfg.name, store, cfg.transaction, cfg.advertised_address, self._clock)
        lite = LiteService(store=store, state=LiteState(store.index, cfg.lite.cache_size), pop_state=pop_state,
                           engine=engine, hub=self.hub, trace=trace, config=cfg.lite, limits=cfg.limits,
                           host=cfg.advertised_address, clock=self._clock)  # fmt: skip

        # The listener reaches the lite service through this broker, not directly: the store holds
        # its listeners, and a store -> listener -> service -> store cycle would keep the pop state's
        # and trace's RocksDB handles (so the database's lock) alive after close.
        def dispatched(touched: Touched) -> None:
            call_soon_from_any_thread(loop, self._dispatched, touched)

        store.add_dispatch_listener(dispatched)
        store.add_deletion_listener(self._deleted)
        producer = Producer(cfg.name, cfg, store, timers, transactions, trace, lite)
        dedup = self._dedup = Deduplicator(store, cfg.dedup_window_s, clock=self._clock)
        reader = Reader(store, self.hub, tiering, trace, cfg.pop, cfg.advertised_address)
        deletions = TopicDeletion(store=store, metadata=metadata, engine=engine, pop_state=pop_state, lite=lite,
                                  transactions=transactions, timers=timers, dedup=dedup,
                                  durability=self._durability)  # fmt: skip
        self._parts = _Parts(metadata, pop_state, engine, transactions, trace, tiering, timers, producer, reader,
                             lite, deletions)  # fmt: skip
        await transactions.start()
        self._security = SecurityStore(store.index)
        self._amqp_meta = AmqpMetaStore(store.index)
        self._mqtt = MqttStateStore(store.index)
        self._tasks = [
            asyncio.create_task(self.engine.run_scanner(self._stop), name="redelivery-scanner"),
            asyncio.create_task(
                self._every(cfg.store.retention.check_interval_s, self._retention_step), name="retention"
            ),
            asyncio.create_task(
                self._every(cfg.transaction.sweep_interval_ms / 1000.0, self._transaction_sweep_step),
                name="transaction-sweep",
            ),
            asyncio.create_task(timers.run(self._stop), name="timer-scheduler"),
            asyncio.create_task(lite.run_sweeper(self._stop, metadata.topics), name="lite-sweeper"),
        ]
        self._trace_task = asyncio.create_task(trace.run(self._stop), name="trace-writer")
        self._unregister_metrics = metrics.register_source(lambda: broker_samples(self))
        if tiering is not None:
            self._tasks.append(asyncio.create_task(tiering.run(), name="tier-uploader"))
        self._started_ms = self._clock.now_ms()
        log.info("broker started", extra=kv(name=cfg.name, data_dir=str(cfg.data_dir), topics=len(self.metadata.topics),
                                            groups=len(self.metadata.groups)))  # fmt: skip

    async def close(self) -> None:
        self._stop.set()
        if self._unregister_metrics is not None:
            self._unregister_metrics()
            self._unregister_metrics = None
        if self._trace_task is not None:  # it writes what is pending, then ends
            task, self._trace_task = self._trace_task, None
            await task
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._store is not None:
            store, self._store = self._store, None
            tiering = self._parts.tiering if self._parts is not None else None
            if tiering is not None:
                for purge in list(self._purges):
                    purge.cancel()  # the deletes in the uploader's threads go on; `close` waits for them
                await tiering.close()  # uploads and cold reads in flight use the store
            # RocksDB releases its lock only when the last handle is gone: drop every holder.
            if self._parts is not None:
                self._parts.timers.close()
            self._parts = None
            self._dedup = None
            self._security = None
            self._amqp_meta = None
            self._mqtt = None
            await asyncio.get_running_loop().run_in_executor(None, store.close)

    @property
    def store(self) -> MessageStore:
        if self._store is None:
            raise StoreClosed(f"broker {self.name} is not running")
        return self._store

    def _running(self) -> _Parts:
        if self._parts is None:
            raise StoreClosed(f"broker {self.name} is not running")
        return self._parts

    @property
    def running(self) -> bool:
        return self._parts is not None

    @property
    def trace(self) -> TraceRecorder:
        return self._running().trace

    @property
    def metadata(self) -> Metadata:
        return self._running().metadata

    @property
    def pop_state(self) -> PopState:
        return self._running().pop_state

    @property
    def engine(self) -> PopEngine:
        return self._running().engine

    @property
    def timers(self) -> TimerService:
        return self._running().timers

    @property
    def lite(self) -> LiteService:
        return self._running().lite

    def _dispatched(self, touched: Touched) -> None:
        """A dispatch round indexed messages of these queues (by topic): lite topics' watchers
        become ready, priority levels are worth reading again."""
        parts = self._parts
        if parts is None:  # a dispatch that lands after close wakes nobody
            return
        topics, levels, lite = parts.metadata.topics, parts.engine.levels, parts.lite
        for topic, qids in touched.items():
            spec = topics.get(topic)
            if spec is None or not spec.message_types & EXCLUSIVE_TYPES:
                continue
            if is_lite(spec):
                lite.on_dispatch(topic, qids)
            elif is_priority(spec):
                for qid in qids:
                    if qid >= priority.PRIORITY_QUEUE_BASE:
                        levels.dispatched(topic, qid)

    def _deleted(self, deletion: Deletion) -> None:
        """The store applied a topic's deletion (on the thread that dispatched it): tiering drops
        the topic's archived segments at once, so no cold read serves them."""
        tiering = self.tiering
        if tiering is not None:
            tiering.on_deleted(deletion)

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        """Run `step` every `interval_s` until the broker stops (the step logs its own failures)."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval_s)
            if self._stop.is_set():
                return
            await step()

    async def _retention_step(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._run_retention)
        except Exception:
            log.exception("retention run failed")
        tiering = self.tiering
        if tiering is not None:
            try:
                await loop.run_in_executor(None, tiering.expire)
            except SluiceError as exc:  # the bucket is down: the next run finishes the job
                log.warning("tiered retention failed; will retry", extra=kv(error=exc.message))
            except Exception:
                log.exception("tiered retention failed")

    def _run_retention(self) -> int:
        with self._retention_lock:
            return self.store.run_retention(self._clock.now_ms() / 1000)

    @property
    def tiering(self) -> BrokerTiering | None:
        """Tiered storage of this broker, None when not configured (or not running)."""
        return self._parts.tiering if self._parts is not None else None

    def _reader(self) -> Reader:
        return self._running().reader

    def _floor(self, topic: str, queue_id: int, local_low: int) -> int:
        tiering = self.tiering
        return local_low if tiering is None else tiering.floor(topic, queue_id, local_low)

    def topic_infos(self) -> list[TopicInfo]:
        if self._parts is None:
            return []
        return [TopicInfo(s.name, s.queue_count, s.permission, s.message_types) for s in self.metadata.topics.values()]

    async def _topics_changed(self) -> None:
        if self._on_topics_changed is not None:
            try:
                await self._on_topics_changed()
            except Exception as exc:  # the NameServer may be down; the next heartbeat catches up
                log.warning("could not report a topic change to the NameServer", extra=kv(error=str(exc)))

    # -- topics ----------------------------------------------------------------------------------

    def _check_topic_spec(self, spec: TopicSpec, *, system: bool = False) -> None:
        validate_topic_name(spec.name, allow_system=system)
        if not 1 <= spec.queue_count <= self.config.limits.max_queues_per_topic:
            raise BadRequest(
                f"queue count must be between 1 and {self.config.limits.max_queues_per_topic}, got {spec.queue_count}"
            )
        if not spec.message_types:
            raise BadRequest("a topic must accept at least one message type")
        if spec.message_types & EXCLUSIVE_TYPES and spec.message_types != UNDECIDED_TYPES:
            if MessageType.LITE in spec.message_types:
                check_lite_spec(spec)
            else:
                check_priority_spec(spec)

    async def create_topic(self, spec: TopicSpec) -> TopicSpec:
        """Create a topic (idempotent for the same spec). A copy this broker holds with another
        definition is refused with PRECONDITION_FAILED, never changed: changing a topic is
        `update_topic`'s, so a creation cannot overwrite what another creator made meanwhile (a
        proxy's first use racing `sluice admin topic create`: docs/shards.md)."""
        return await self._save_topic(spec, _OTHER_REFUSED)

    async def _save_topic(self, spec: TopicSpec, other: str) -> TopicSpec:
        """Save `spec`; `other` says what becomes of a copy with another definition held already:
        `_OTHER_REFUSED` (PRECONDITION_FAILED), `_OTHER_KEPT` (it is the answer) or `_OTHER_REPLACED`.

        A topic's queue count never shrinks: messages in the removed queues would be unreachable.
        """
        self._check_topic_spec(spec)
        await self._running().deletions.finished(spec.name)
        old = self.metadata.topics.get(spec.name)
        if old is not None and old != spec and other != _OTHER_REPLACED:
            if other == _OTHER_KEPT:
                return old
            raise PreconditionFailed(
                f"topic {spec.name} exists on broker {self.name} with another definition ({_describe(old)}; "
                f"asked: {_describe(spec)}), created meanwhile or before; update it to change it"
            )
        if old is not None and spec.queue_count < old.queue_count:
            raise BadRequest(
                f"topic {spec.name} has {old.queue_count} queues on broker {self.name}; reducing it to "
                f"{spec.queue_count} would strand the messages of the removed queues"
            )
        if old != spec:
            self.metadata.put_topic(spec)
            log.info(
                "topic saved",
                extra=kv(
                    topic=spec.name, queues=spec.queue_count, types=",".join(sorted(t.name for t in spec.message_types))
                ),
            )
            await self._topics_changed()
        return spec

    async def update_topic(self, spec: TopicSpec) -> TopicSpec:
        self.metadata.topic(spec.name)
        return await self._save_topic(spec, _OTHER_REPLACED)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and everything of it this broker holds (broker/topic_deletion.py,
        docs/operations.md "Deleting a topic"). Tiering drops the archived segments as the deletion
        record is dispatched (`_deleted`); their objects are deleted before this returns, or, past
        `_PURGE_WAIT_S` or with the bucket down, meanwhile (and by a later retention run)."""
        await self._running().deletions.delete(name)
        await self._topics_changed()
        tiering = self.tiering
        if tiering is not None:  # its archived objects: waited for a moment, else they go meanwhile
            purge = asyncio.ensure_future(tiering.purge(name))
            purge.add_done_callback(functools.partial(_purged, name))
            self._purges.add(purge)
            purge.add_done_callback(self._purges.discard)
            await asyncio.wait({purge}, timeout=_PURGE_WAIT_S)

    async def get_topic(self, name: str, *, auto_create: bool = False, like: TopicSpec | None = None) -> TopicSpec:
        if auto_create or like is not None:
            return await self.ensure_topic(name, like=like, create=auto_create)
        return self.metadata.topic(name)

    def held_topic(self, name: str) -> TopicSpec | None:
        """This broker's copy of the topic; None when it holds none (nothing is created)."""
        return self.metadata.topics.get(name)

    async def list_topics(self) -> list[TopicSpec]:
        return sorted(self.metadata.topics.values(), key=lambda s: s.name)

    async def topic_status(self, name: str) -> TopicStatus:
        spec = self.metadata.topic(name)
        queues = []
        local_bytes = 0
        for q in priority.pop_queues(spec) if is_priority(spec) else range(spec.queue_count):
            low, high = self.store.queue_bounds(name, q)
            queues.append(QueueStatus(q, self._floor(name, q, low), high, self.store.acked_end(name, q)))
            local_bytes += self.store.queue_bytes_estimate(name, q)
        return TopicStatus(spec, tuple(queues), half_messages=self.transactions.backlog(name),
                           pending_timers=self.timers.pending_count(name), local_bytes=local_bytes,
                           delivered=self.engine.delivered[name])  # fmt: skip

    async def ensure_topic(
        self, name: str, first: MessageType | None = None, *, like: TopicSpec | None = None, create: bool = True
    ) -> TopicSpec:
        """The topic; on first use it is created (with `create`: a proxy's lookup, never a send)
        when this broker auto-creates, else TopicNotFound. A system topic's name (`%...`, dead
        letters) is never created here.

        An auto-created topic accepts every type (so clients that check a message's type against
        the route send it) until its first message (`first`, given by a send) decides: a LITE or
        PRIORITY topic for such a message, else a topic accepting every other type.

        `like` is the cluster's definition of a topic created on first use, decided once by the
        broker that created it first (docs/shards.md, "Topics, groups and admin"): a topic this
        broker lacks is created as `like`, and an undecided copy takes like's types once they are
        decided; a decided copy never changes. `create_topic` validates the name and the spec."""
        parts = self._parts
        if parts is not None and parts.deletions.under_way(name):  # racing its deletion: what follows it
            await parts.deletions.finished(name)  # is the topic's next incarnation
        spec = self.metadata.topics.get(name)
        if spec is None:
            if not (create and self.config.auto_create) or is_system_topic(name):
                return self.metadata.topic(name)  # TopicNotFound
            if like is not None:
                if like.name != name:
                    raise BadRequest(f"the definition given for topic {name} is topic {like.name}'s")
                return await self._save_topic(like, _OTHER_KEPT)  # created meanwhile: that copy stays
            default = TopicSpec(name, self.config.auto_create_queue_count, UNDECIDED_TYPES)
            spec = await self._save_topic(default, _OTHER_KEPT)
        if spec.message_types != UNDECIDED_TYPES:
            return spec
        decided = _decision(like) if like is not None else auto_types(first) if first is not None else None
        if decided is None:
            return spec
        spec = replace(spec, message_types=decided)
        self.metadata.put_topic(spec)
        # Its first message (here or on another broker of the cluster) decides only between a LITE or
        # PRIORITY topic and one of every other type.
        accepts = ",".join(sorted(t.name.lower() for t in spec.message_types))
        where = first.name if first is not None else "on another broker"
        log.info("auto-created topic's types decided by its first message",
                 extra=kv(topic=name, first=where, accepts=accepts))  # fmt: skip
        await self._topics_changed()
        return spec

    # -- groups ----------------------------------------------------------------------------------

    async def create_group(self, spec: GroupSpec) -> GroupInfo:
        validate_group_name(spec.name)
        validate_group_spec(spec)
        info = self.metadata.put_group(spec)
        log.info(
            "consumer group saved", extra=kv(group=spec.name, fifo=spec.fifo, max_attempts=spec.max_delivery_attempts)
        )
        return info

    async def update_group(self, spec: GroupSpec) -> GroupInfo:
        self.metadata.group(spec.name)
        return await self.create_group(spec)

    async def delete_group(self, name: str) -> None:
        self.metadata.delete_group(name)
        self.pop_state.drop_group(name)
        self.engine.levels.forget(name, None)
        self.engine.ready_bytes.forget(name)
        log.info("consumer group deleted", extra=kv(group=name))

    async def get_group(self, name: str, *, auto_create: bool = False, like: GroupSpec | None = None) -> GroupInfo:
        """The group; with `auto_create`, created first where this broker auto-creates groups, as
        `like` when given (the cluster's definition: another broker's copy, proxy/firstuse.py)."""
        info = self.metadata.groups.get(name)
        if info is None and auto_create and self.config.auto_create:
            if like is not None and like.name != name:
                raise BadRequest(f"the definition given for consumer group {name} is group {like.name}'s")
            return await self.create_group(like if like is not None else GroupSpec(name))
        return info if info is not None else self.metadata.group(name)

    async def list_groups(self) -> list[GroupInfo]:
        return sorted(self.metadata.groups.values(), key=lambda i: i.spec.name)

    async def group_status(self, name: str, topics: Sequence[str] = (), *, ready_bytes: bool = False) -> GroupStatus:
        info = self.metadata.group(name)
        if ready_bytes:
            return GroupStatus(info, tuple(await self.engine.group_queues_with_bytes(info, topics)))
        return GroupStatus(info, tuple(self.engine.group_queues(info, topics)))

    # -- produce ---------------------------------------------------------------------------------

    async def send(
        self, topic: str, queue_id: int, records: Sequence[bytes], *, ctx: CallContext = NO_CONTEXT
    ) -> list[SendResult]:
        host = self.config.advertised_address
        if sum(map(len, records)) < _LARGE_SEND_BYTES:
            messages = received(records, topic, queue_id, host)
        else:  # a 16 MiB AMQP body is ~20 ms of CRC and copying: in a thread, the loop runs between its steps
            messages = await asyncio.get_running_loop().run_in_executor(None, received, records, topic, queue_id, host)
        # `received` gives each message type as a MessageType. A send never creates its topic: a stale
        # route to a broker where the topic was just deleted would recreate it here with defaults;
        # creating on first use is the proxy's decision (proxy/firstuse.py).
        first = cast(MessageType, messages[0].message_type) if messages else None
        spec = await self.ensure_topic(topic, first, create=False)
        producer, dedup = self._running().producer, self._dedup
        if dedup is not None and any(m.flags & FLAG_DEDUP for m in messages):
            results = await dedup.send(topic, messages, lambda fresh: producer.send(spec, queue_id, fresh, ctx))
        else:
            results = await producer.send(spec, queue_id, messages, ctx)
        if self._durability.replicated and (is_lite(spec) or any(m.message_type in _INDEXED_TYPES for m in messages)):
            await self._durability.wait_state()  # the timer, half-message or lite index the send wrote
        return results

    async def _state_replicated(self) -> None:
        """A replicated primary: wait until the in-sync replicas hold every consumer state change made
        so far (docs/replication.md); without replication, nothing to wait for."""
        if self._durability.replicated:
            await self._durability.wait_state()

    async def _dead_letter(self, rec: MessageRecord, group: str, attempts: int) -> None:
        name = dlq_topic(group)
        if name not in self.metadata.topics:
            spec = TopicSpec(name, 1, frozenset(ALL_MESSAGE_TYPES))
            validate_topic_name(name, allow_system=True)
            self.metadata.put_topic(spec)
            await self._topics_changed()
        sysprops = dict(rec.system_properties)
        sysprops.update({
            SYSPROP_DLQ_ORIGIN_TOPIC: rec.topic, SYSPROP_DLQ_ORIGIN_QUEUE: str(rec.queue_id),
            SYSPROP_DLQ_ORIGIN_OFFSET: str(rec.queue_offset), SYSPROP_DLQ_ATTEMPTS: str(attempts),
        })  # fmt: skip
        copy = copy_to_store(rec, name, 0, sysprops, store_host=self.config.advertised_address, delivery_timestamp_ms=0)
        (stored,) = await self.store.append([copy])
        self.trace.dead_lettered(rec.topic, rec.queue_id, rec.queue_offset, rec.message_id, group, attempts, name,
                                 stored.queue_offset)  # fmt: skip

    # -- pop consumption -------------------------------------------------------------------------

    def _filter(self, spec: FilterSpec) -> MessageFilter:
        key = (int(spec.kind), spec.expression)
        filt = self._filters.get(key)
        if filt is None:
            filt = compile_filter(FilterKind(int(spec.kind)), spec.expression)
            if len(self._filters) >= self.config.pop.filter_cache_max:
                self._filters.clear()
            self._filters[key] = filt
        return filt

    async def pop(self, request: PopRequest, *, ctx: CallContext = NO_CONTEXT) -> list[StoredMessage]:
        if ctx.expired():  # what it took would stay invisible with no one to receive it
            raise RequestTimeout(f"the client's deadline passed before the pop from {request.topic} began")
        group = self.metadata.group(request.group)  # never created here: the proxy's decision (proxy/firstuse.py)
        topic = self.metadata.topic(request.topic)
        if not topic.permission.readable:
            raise Forbidden(f"topic {topic.name} is not readable on broker {self.name}")
        if request.queue_id is not None:
            validate_queue(TopicInfo(topic.name, topic.queue_count), request.queue_id)
        filt = self._filter(request.filter)
        if is_lite(topic) or request.lite_client:
            check_lite_consumer(topic, request.lite_client)
            return await self.lite.pop(request, group, topic, filt)
        return await self.engine.pop(request, group, topic, filt)

    async def ack(
        self, group: str, topic: str, receipt_handles: list[str], *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        self.metadata.group(group)
        results, done = self.engine.ack(group, topic, receipt_handles)
        await self._state_replicated()
        self.engine.settled()  # the in-sync replicas hold the acks: their message groups go on
        spec = self.metadata.topics.get(topic)
        if spec is not None and is_lite(spec):  # and their lite topics
            self.lite.after_ack(group, topic, {qid for qid, _ in done})
        return results

    async def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> str:
        self.metadata.group(group)
        handle = self.engine.change_invisible_duration(group, topic, receipt_handle, invisible_ms)
        await self._state_replicated()
        return handle

    async def nack(self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        handle = self.engine.nack(self.metadata.group(group), topic, receipt_handle)
        await self._state_replicated()
        return handle

    async def renew(
        self, group: str, topic: str, receipt_handles: list[str], invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        self.metadata.group(group)
        results = self.engine.renew(group, topic, receipt_handles, invisible_ms)
        await self._state_replicated()
        return results

    async def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        self.metadata.group(group)
        await self.engine.forward_to_dead_letter(group, topic, receipt_handle)
        await self._state_replicated()
        self.engine.settled()

    # -- pull and offsets ------------------------------------------------------------------------

    async def pull(
        self, group: str, topic: str, queue_id: int, offset: int, max_messages: int, filter: FilterSpec,
        long_poll_ms: int = 0, *, ctx: CallContext = NO_CONTEXT,
    ) -> PullResult:  # fmt: skip
        spec = self.metadata.topic(topic)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        if max_messages <= 0:
            raise BadRequest(f"batch size must be positive, got {max_messages}")
        result = await self._reader().pull(topic, queue_id, offset, max_messages, self._filter(filter), long_poll_ms)
        if not group.startswith(ADMIN_READ_GROUP_PREFIX):  # browsing is not consuming: rates out leave it out
            self.engine.delivered[topic] += len(result.messages)
        return result

    async def get_offset(self, group: str, topic: str, queue_id: int, *, ctx: CallContext = NO_CONTEXT) -> int:
        self.metadata.topic(topic)
        offset = self.store.committed_offset(group, topic, queue_id)
        if offset is None:
            raise OffsetNotFound(f"group {group} has no committed offset for {topic} queue {queue_id}")
        return offset

    async def update_offset(
        self, group: str, topic: str, queue_id: int, offset: int, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        spec = self.metadata.topic(topic)
        validate_group_name(group)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        self.store.commit_offset(group, topic, queue_id, offset)
        await self._state_replicated()

    async def query_offset(
        self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0, *, ctx: CallContext = NO_CONTEXT
    ) -> int:
        spec = self.metadata.topic(topic)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        return await self._reader().query_offset(topic, queue_id, policy, timestamp_ms)

    async def read_rows(
        self, topic: str, queue_id: int, offset: int, end_offset: int, max_messages: int, max_bytes: int
    ) -> QueueRows:
        spec = self.metadata.topic(topic)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        if offset < 0 or end_offset < offset:
            raise BadRequest(f"read of {topic} queue {queue_id}: bad offset range [{offset}, {end_offset})")
        if max_messages <= 0 or max_bytes <= 0:
            raise BadRequest(f"read of {topic} queue {queue_id}: max messages and max bytes must be positive")
        return await self._reader().read_rows(topic, queue_id, offset, end_offset, max_messages, max_bytes)

    async def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> OffsetReset:
        info = self.metadata.group(group)
        spec = self.metadata.topic(topic)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        if offset < 0:
            raise BadRequest(f"offset must not be negative, got {offset}")
        before, now = self.engine.reset(info, topic, queue_id, offset)
        self.store.commit_offset(group, topic, queue_id, now)
        await self._state_replicated()
        log.info("consumer offset reset", extra=kv(group=group, topic=topic, queue=queue_id, previous=before,
                                                   offset=now))  # fmt: skip
        return OffsetReset(topic, queue_id, before, now)

    async def report_clients(self, proxy: str, clients: list[ConnectedClient], ttl_ms: int) -> None:
        self.clients.report(proxy, clients, ttl_ms)

    async def list_clients(self) -> list[ConnectedClient]:
        return self.clients.clients()

    # -- lookups ---------------------------------------------------------------------------------

    async def get_message(self, topic: str, message_id: str) -> list[StoredMessage]:
        return await self._reader().get_message(topic, message_id)

    async def find_messages_by_key(self, topic: str, key: str, limit: int = 64) -> list[StoredMessage]:
        return await self._reader().find_messages_by_key(topic, key, limit)

    # -- tiered storage --------------------------------------------------------------------------

    def _tiering(self) -> BrokerTiering:
        tiering = self.tiering
        if tiering is None:
            self._running()
            raise not_enabled(self.name)
        return tiering

    async def tier_status(self) -> TierStatus:
        tiering = self.tiering
        if tiering is None:
            self._running()
            return TierStatus(False, "")
        topics = tuple(_tier_topic_status(t) for t in await tiering.status())
        c = tiering.objects.snapshot()
        return TierStatus(True, tiering.objects.describe(), topics, c.puts, c.put_bytes, c.gets, c.get_bytes)

    async def tier_upload_now(self, topic: str, timeout_s: float) -> TierTopicStatus:
        if timeout_s <= 0:
            raise BadRequest(f"upload timeout must be positive, got {timeout_s} s")
        tiering = self._tiering()
        self.metadata.topic(topic)
        return _tier_topic_status(await tiering.upload_now(topic, timeout_s))

    async def tier_evict_local(self, topic: str) -> TierEvictResult:
        tiering = self._tiering()
        self.metadata.topic(topic)
        return await tiering.evict_local(topic)

    # -- transactions ----------------------------------------------------------------------------

    @property
    def transactions(self) -> TransactionService:
        return self._running().transactions

    def half_message_backlog(self) -> int:
        """Half messages awaiting commit or rollback on this broker (0 while stopped); for gauges."""
        return 0 if self._parts is None else self._parts.transactions.backlog()

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource, *, ctx: CallContext = NO_CONTEXT,
    ) -> None:  # fmt: skip
        if resolution is TransactionResolution.COMMIT and topic not in self.metadata.topics:
            raise TopicNotFound(f"topic {topic} no longer exists on broker {self.name}: recreate it to commit, or roll "
                                "the transaction back")  # fmt: skip
        await self.transactions.end(topic, message_id, transaction_id, resolution, source)
        await self._state_replicated()

    async def claim_transaction_checks(self, topics: list[str], max_checks: int) -> list[TransactionCheck]:
        return self.transactions.claim(topics, max(0, max_checks))

    async def _transaction_sweep_step(self) -> None:
        try:
            self.transactions.sweep()
        except Exception:
            log.exception("transaction sweep failed")

    # -- observability ---------------------------------------------------------------------------

    async def message_trace(self, message_id: str) -> list[TraceEvent]:
        """Every recorded event of a message id on this broker, oldest first (empty if none)."""
        if not message_id:
            raise BadRequest("a message id is required")
        if len(message_id) > self.config.limits.max_message_id_chars:
            raise BadRequest(f"message id longer than {self.config.limits.max_message_id_chars} characters")
        return await self._reader().message_trace(message_id)

    # -- security document (common/security.py; see broker/security_store.py) ---------------------

    async def get_security(self) -> tuple[int, bytes]:
        store = self._security_store()
        return store.version, store.data

    async def put_security(self, version: int, data: bytes) -> None:
        self._security_store().put(version, data)
        await self._durability.wait_state()  # a replicated primary: the in-sync replicas hold it
        log.info("security document stored", extra=kv(version=version, size_bytes=len(data)))

    def _security_store(self) -> SecurityStore:
        if self._security is None:
            raise StoreClosed("the broker is not running")
        return self._security

    # -- the AMQP gateway's metadata document (broker/amqp_meta_store.py) -------------------------

    async def get_amqp_meta(self, newer_than: int = 0) -> tuple[int, bytes]:
        return self._amqp_meta_store().get(newer_than)

    async def put_amqp_meta(self, version: int, data: bytes) -> None:
        self._amqp_meta_store().put(version, data)
        await self._durability.wait_state()  # a replicated primary: the in-sync replicas hold it
        log.info("AMQP metadata stored", extra=kv(version=version, size_bytes=len(data)))

    def _amqp_meta_store(self) -> AmqpMetaStore:
        if self._amqp_meta is None:
            raise StoreClosed("the broker is not running")
        return self._amqp_meta

    # -- the MQTT gateway's state (broker/mqtt_store.py) -----------------------------------------

    async def mqtt_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self._mqtt_store().get(keys)

    async def mqtt_write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes] = (),
                         expect: Sequence[tuple[bytes, bytes | None]] = ()) -> None:  # fmt: skip
        self._mqtt_store().write(puts, deletes, expect)
        await self._durability.wait_state()  # a replicated primary: the in-sync replicas hold it

    async def mqtt_scan(self, prefix: bytes, after: bytes = b"", limit: int = 1000) -> list[tuple[bytes, bytes]]:
        return self._mqtt_store().scan(prefix, after, limit)

    def _mqtt_store(self) -> MqttStateStore:
        if self._mqtt is None:
            raise StoreClosed("the broker is not running")
        return self._mqtt

    # -- timers ----------------------------------------------------------------------------------

    async def recall(self, topic: str, recall_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        """Cancel a DELAY message that is not delivered yet; its message id."""
        spec = self.metadata.topic(topic)
        if MessageType.DELAY not in spec.message_types:
            raise MessageTypeConflict(f"topic {topic} does not accept DELAY messages, so it has none to recall")
        message_id = await self.timers.recall(topic, recall_handle)
        await self._state_replicated()
        return message_id

    # -- lite topics (docs/lite-topics.md) --------------------------------------------------------

    def _lite_topic(self, name: str) -> TopicSpec:
        spec = self.metadata.topic(name)
        if not is_lite(spec):
            types = ", ".join(sorted(t.name for t in spec.message_types))
            raise BadRequest(f"topic {name} is not a LITE topic (it accepts {types}): lite consumers bind to a topic "
                             "created with --type lite")  # fmt: skip
        return spec

    async def sync_lite_subscription(self, sync: LiteSync) -> int:
        validate_group_name(sync.group)
        if not sync.client_id:
            raise ClientIdRequired("a lite subscription belongs to a client: the request carries no client id")
        if is_lite_scope(sync.topic):  # filters for every LITE topic of a namespace
            if not sync.filters:
                raise BadRequest(f"{sync.topic!r} names every LITE topic of a namespace: it takes filter subscriptions "
                                 "only")  # fmt: skip
            await self.get_group(sync.group, auto_create=True)
            binds = sorted(n for n, s in self.metadata.topics.items() if is_lite(s) and lite_scope(n) == sync.topic)
            subscribed = self.lite.sync_filters(sync.topic, sync, binds)
        else:
            spec = self._lite_topic(sync.topic)
            await self.get_group(sync.group, auto_create=True)
            subscribed = self.lite.sync(spec, sync)
        await self._state_replicated()
        return subscribed

    async def list_lite_topics(self, topic: str, group: str = "", limit: int = 100) -> LiteTopicList:
        spec = self._lite_topic(topic)
        if group:
            self.metadata.group(group)
        return self.lite.list(spec, group, limit)

    async def claim_lite_removals(self, client_ids: list[str]) -> list[LiteRemoval]:
        return self.lite.claim_removals(client_ids)

    # -- broker information ----------------------------------------------------------------------

    async def broker_info(self) -> BrokerInfo:
        self._running()
        stats = self.store.stats()
        used, total = self.store.disk_usage()
        return BrokerInfo(
            version=sluice_version(), started_ms=self._started_ms, disk_used_bytes=used, disk_total_bytes=total,
            store_bytes=max(0, stats.commitlog_end - stats.commitlog_min) + stats.index_bytes,
            unflushed_bytes=max(0, stats.written_position - stats.flushed_position),
            dispatch_lag_bytes=max(0, stats.written_position - stats.dispatched_position),
            dispatch_lag_ms=stats.dispatch_last_lag_ms,
        )  # fmt: skip


# How long `delete_topic` waits for the deleted topic's archived objects to go before it answers
# (the admin tool's calls time out after 5 s); past it they go on being deleted, and a failure is
# finished by the next retention run.
_PURGE_WAIT_S = 2.0
# What `_save_topic` does with a copy of another definition that the broker holds already.
_OTHER_REFUSED, _OTHER_KEPT, _OTHER_REPLACED = "refused", "kept", "replaced"


def _describe(spec: TopicSpec) -> str:
    """A topic's definition in a message: queues, accepted types and permission."""
    kinds = spec.message_types
    types = "any type" if kinds == UNDECIDED_TYPES else ",".join(sorted(t.name.lower() for t in kinds))
    return f"{spec.queue_count} queue(s), {types}, {spec.permission.name.lower()}"


def _is_lite_topic(metadata: Metadata, name: str) -> bool:
    spec = metadata.topics.get(name)
    return spec is not None and is_lite(spec)


def _purged(topic: str, purge: asyncio.Future[int]) -> None:
    if purge.cancelled():
        return
    exc = purge.exception()
    if isinstance(exc, SluiceError):  # the bucket is down: the next retention run deletes them
        log.warning("archived segments of a deleted topic not deleted yet; will retry",
                    extra=kv(topic=topic, error=exc.message))  # fmt: skip
    elif exc is not None:
        log.error("deleting the archived segments of a deleted topic failed", extra=kv(topic=topic), exc_info=exc)


# Message types whose send also writes consumer state (the timer index, the half-message index).
_INDEXED_TYPES = frozenset({MessageType.DELAY, MessageType.TRANSACTION})
_LARGE_SEND_BYTES = 1 << 20  # a send of records this large is verified and copied off the event loop
# The types a first message can decide an auto-created topic to accept (`auto_types`).
_DECISIONS = frozenset(auto_types(t) for t in MessageType)


def _decision(like: TopicSpec) -> frozenset[MessageType] | None:
    """The types `like` (the cluster's definition of an auto-created topic) decided; None while
    it is undecided too. BadRequest for a set no first message decides."""
    if like.message_types == UNDECIDED_TYPES:
        return None
    if like.message_types not in _DECISIONS:
        types = ",".join(sorted(t.name.lower() for t in like.message_types))
        raise BadRequest(f"topic {like.name}: {types} is not what a first message decides an auto-created topic to "
                         "accept (one of lite, priority, or the four ordinary types)")  # fmt: skip
    return like.message_types


def check_lite_consumer(topic: TopicSpec, client_id: str) -> None:
    if not is_lite(topic):
        raise BadRequest(f"topic {topic.name} is not a LITE topic: lite consumers bind to a topic created with "
                         "--type lite")  # fmt: skip
    if not client_id:
        raise BadRequest(f"topic {topic.name} is a LITE topic: consume it with a lite consumer "
                         "(LiteSimpleConsumer, LitePushConsumer)")  # fmt: skip


def _tier_topic_status(st: UploaderTopicStatus) -> TierTopicStatus:
    queues = tuple(
        TierQueueStatus(q, *st.local.get(q, (0, 0)), *st.tiered.get(q, (0, 0)))
        for q in sorted(set(st.local) | set(st.tiered))
    )
    return TierTopicStatus(st.topic, queues, st.lag_messages, st.lag_s, st.bytes, st.objects, st.last_error,
                           st.failures, st.last_upload_ms)  # fmt: skip


def _trace_tiered(trace: TraceRecorder, topic: str, entry: SegmentEntry) -> None:
    for queue_id, (first, last) in entry.queues.items():
        trace.tiered(topic, queue_id, first, last + 1, entry.key)
