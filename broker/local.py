"""`LocalBroker`: the broker in this process, implementing `BrokerApi` with plain awaits.

It owns the store, the metadata, the pop engine and its background tasks (redelivery scanning,
retention). The merged topology's proxy calls it directly; a broker process serves it over the
internal gRPC service (broker/service.py) to remote proxies and the admin tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.api import (
    AckResult,
    FilterSpec,
    GroupInfo,
    GroupSpec,
    GroupStatus,
    OffsetPolicy,
    OutgoingMessage,
    PopRequest,
    PullResult,
    QueueStatus,
    SendResult,
    StoredMessage,
    TopicSpec,
    TopicStatus,
)
from broker.config import BrokerConfig
from broker.consumer import PopEngine
from broker.filter import FilterKind, MessageFilter, compile_filter
from broker.longpoll import LongPollHub, topic_key
from broker.messages import to_record, to_stored, validate_message, validate_queue
from broker.metadata import METADATA_CFS, Metadata, validate_group_spec
from broker.popstate import POP_CFS, PopState
from broker.store.record import MessageRecord
from broker.store.store import MessageStore, ReadStatus
from broker.timer.keys import TIMER_CFS
from broker.timer.service import TimerService
from common.errors import BadRequest, Forbidden, MessageTypeConflict, OffsetNotFound, StoreClosed
from common.logs import kv
from common.model import (
    ALL_MESSAGE_TYPES,
    MessageType,
    TopicInfo,
    dlq_topic,
    validate_group_name,
    validate_topic_name,
)

log = logging.getLogger("sluice.broker")


@dataclass(frozen=True, slots=True)
class _Parts:
    """What exists only while the broker runs (all of it holds RocksDB handles)."""

    metadata: Metadata
    pop_state: PopState
    engine: PopEngine
    timers: TimerService


class LocalBroker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.on_topics_changed: Callable[[], Awaitable[object]] | None = None
        self._store: MessageStore | None = None
        self._parts: _Parts | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._filters: dict[tuple[int, str], MessageFilter] = {}

    @property
    def name(self) -> str:
        return self.config.name

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        self._store = await loop.run_in_executor(
            None, lambda: MessageStore(cfg.data_dir, cfg.store, extra_cfs=METADATA_CFS + POP_CFS + TIMER_CFS)
        )
        store = self._store
        metadata = Metadata(store.index)
        pop_state = PopState(store.index)
        self.hub = LongPollHub(loop)
        store.add_dispatch_listener(lambda touched: self.hub.notify_threadsafe({topic_key(t) for t, _ in touched}))
        engine = PopEngine(
            broker_name=cfg.name, store=store, metadata=metadata, state=pop_state, hub=self.hub,
            config=cfg.pop, dead_letter=self._dead_letter,
        )  # fmt: skip
        timers = TimerService(cfg.name, store, cfg.timer, lambda topic: topic in metadata.topics)
        store.retention_pins.append(timers.min_position)
        self._parts = _Parts(metadata, pop_state, engine, timers)
        self._tasks = [
            asyncio.create_task(self.engine.run_scanner(self._stop), name="redelivery-scanner"),
            asyncio.create_task(self._retention_loop(), name="retention"),
            asyncio.create_task(timers.run(self._stop), name="timer-scheduler"),
        ]
        log.info("broker started", extra=kv(name=cfg.name, data_dir=str(cfg.data_dir), topics=len(self.metadata.topics),
                                            groups=len(self.metadata.groups)))  # fmt: skip

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._store is not None:
            store, self._store = self._store, None
            # RocksDB releases its lock only when the last handle is gone: drop every holder.
            if self._parts is not None:
                self._parts.timers.close()
            self._parts = None
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

    async def _retention_loop(self) -> None:
        interval = self.config.store.retention.check_interval_s
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)
            if self._stop.is_set():
                return
            try:
                await loop.run_in_executor(None, self.store.run_retention)
            except Exception:
                log.exception("retention run failed")

    def topic_infos(self) -> list[TopicInfo]:
        if self._parts is None:
            return []
        return [TopicInfo(s.name, s.queue_count, s.permission, s.message_types) for s in self.metadata.topics.values()]

    async def _topics_changed(self) -> None:
        if self.on_topics_changed is not None:
            try:
                await self.on_topics_changed()
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

    async def create_topic(self, spec: TopicSpec) -> TopicSpec:
        """Create a topic, or update it when it exists (idempotent for the same spec).

        A topic's queue count never shrinks: messages in the removed queues would be unreachable.
        """
        self._check_topic_spec(spec)
        old = self.metadata.topics.get(spec.name)
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
        return await self.create_topic(spec)

    async def delete_topic(self, name: str) -> None:
        self.metadata.delete_topic(name)
        log.info("topic deleted", extra=kv(topic=name))
        await self._topics_changed()

    async def get_topic(self, name: str) -> TopicSpec:
        return self.metadata.topic(name)

    async def list_topics(self) -> list[TopicSpec]:
        return sorted(self.metadata.topics.values(), key=lambda s: s.name)

    async def topic_status(self, name: str) -> TopicStatus:
        spec = self.metadata.topic(name)
        queues = tuple(QueueStatus(q, *self.store.queue_bounds(name, q)) for q in range(spec.queue_count))
        return TopicStatus(spec, queues, pending_timers=self.timers.pending_count(name))

    async def ensure_topic(self, name: str) -> TopicSpec:
        """The topic; on first use it is created (accepting every message type) when this broker
        auto-creates, else TopicNotFound. `create_topic` validates the name."""
        spec = self.metadata.topics.get(name)
        if spec is None and self.config.auto_create:
            spec = await self.create_topic(
                TopicSpec(name, self.config.auto_create_queue_count, frozenset(ALL_MESSAGE_TYPES))
            )
        return spec if spec is not None else self.metadata.topic(name)

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
        log.info("consumer group deleted", extra=kv(group=name))

    async def get_group(self, name: str, *, auto_create: bool = False) -> GroupInfo:
        info = self.metadata.groups.get(name)
        if info is None and auto_create and self.config.auto_create:
            return await self.create_group(GroupSpec(name))
        return info if info is not None else self.metadata.group(name)

    async def list_groups(self) -> list[GroupInfo]:
        return sorted(self.metadata.groups.values(), key=lambda i: i.spec.name)

    async def group_status(self, name: str) -> GroupStatus:
        info = self.metadata.group(name)
        return GroupStatus(info, tuple(self.engine.group_queues(info)))

    # -- produce ---------------------------------------------------------------------------------

    async def send(self, topic: str, queue_id: int, messages: list[OutgoingMessage]) -> list[SendResult]:
        spec = await self.ensure_topic(topic)
        if not spec.permission.writable:
            raise Forbidden(f"topic {topic} is not writable on broker {self.name}")
        if not messages:
            raise BadRequest("no messages to send")
        if len(messages) > self.config.limits.max_batch_messages:
            raise BadRequest(f"{len(messages)} messages in one send; at most {self.config.limits.max_batch_messages}")
        info = TopicInfo(spec.name, spec.queue_count, spec.permission, spec.message_types)
        validate_queue(info, queue_id)
        host = self.config.advertised_address
        timers = self.timers
        records = []
        for msg in messages:
            validate_message(msg, info, self.config.limits)
            if msg.message_type is MessageType.DELAY:
                timers.check_delivery_time(msg)
        for msg in messages:
            rec = to_record(topic, queue_id, msg, host)
            records.append(timers.timer_record(rec) if msg.message_type is MessageType.DELAY else rec)
        results = await self.store.append(records)
        delayed = [(topic, m.delivery_timestamp_ms, r) for m, r in zip(messages, results, strict=True)
                   if m.message_type is MessageType.DELAY]  # fmt: skip
        handles = iter(timers.index(delayed) if delayed else ())
        return [
            SendResult(m.message_id, queue_id, r.queue_offset,
                       recall_handle=next(handles) if m.message_type is MessageType.DELAY else "")
            for m, r in zip(messages, results, strict=True)
        ]  # fmt: skip

    async def _dead_letter(self, rec: MessageRecord, group: str, attempts: int) -> None:
        name = dlq_topic(group)
        if name not in self.metadata.topics:
            spec = TopicSpec(name, 1, frozenset(ALL_MESSAGE_TYPES))
            validate_topic_name(name, allow_system=True)
            self.metadata.put_topic(spec)
            await self._topics_changed()
        sysprops = dict(rec.system_properties)
        sysprops.update({
            "DLQ_ORIGIN_TOPIC": rec.topic, "DLQ_ORIGIN_QUEUE_ID": str(rec.queue_id),
            "DLQ_ORIGIN_QUEUE_OFFSET": str(rec.queue_offset), "DLQ_DELIVERY_ATTEMPTS": str(attempts),
        })  # fmt: skip
        copy = MessageRecord(
            topic=name, queue_id=0, body=rec.body, message_id=rec.message_id, tag=rec.tag, keys=rec.keys,
            message_group=rec.message_group, properties=rec.properties, system_properties=sysprops,
            message_type=rec.message_type, flags=rec.flags, born_timestamp_ms=rec.born_timestamp_ms,
            born_host=rec.born_host, store_host=self.config.advertised_address,
        )  # fmt: skip
        await self.store.append([copy])

    # -- pop consumption -------------------------------------------------------------------------

    def _filter(self, spec: FilterSpec) -> MessageFilter:
        key = (int(spec.kind), spec.expression)
        filt = self._filters.get(key)
        if filt is None:
            filt = compile_filter(FilterKind(int(spec.kind)), spec.expression)
            if len(self._filters) > 10_000:
                self._filters.clear()
            self._filters[key] = filt
        return filt

    async def pop(self, request: PopRequest) -> list[StoredMessage]:
        group = await self.get_group(request.group, auto_create=request.auto_create_group)
        topic = self.metadata.topic(request.topic)
        if not topic.permission.readable:
            raise Forbidden(f"topic {topic.name} is not readable on broker {self.name}")
        if request.queue_id is not None:
            validate_queue(TopicInfo(topic.name, topic.queue_count), request.queue_id)
        filt = self._filter(request.filter)
        return await self.engine.pop(request, group, topic, filt)

    async def ack(self, group: str, topic: str, receipt_handles: list[str]) -> list[AckResult]:
        self.metadata.group(group)
        return self.engine.ack(group, topic, receipt_handles)

    async def change_invisible_duration(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        self.metadata.group(group)
        return self.engine.change_invisible_duration(group, topic, receipt_handle, invisible_ms)

    async def nack(self, group: str, topic: str, receipt_handle: str) -> str:
        return self.engine.nack(self.metadata.group(group), topic, receipt_handle)

    async def renew(self, group: str, topic: str, receipt_handles: list[str], invisible_ms: int) -> list[AckResult]:
        self.metadata.group(group)
        return self.engine.renew(group, topic, receipt_handles, invisible_ms)

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        self.metadata.group(group)
        await self.engine.forward_to_dead_letter(group, topic, receipt_handle)

    # -- pull and offsets ------------------------------------------------------------------------

    async def pull(
        self, group: str, topic: str, queue_id: int, offset: int, max_messages: int, filter: FilterSpec,
        long_poll_ms: int = 0,
    ) -> PullResult:  # fmt: skip
        spec = self.metadata.topic(topic)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        if max_messages <= 0:
            raise BadRequest(f"batch size must be positive, got {max_messages}")
        filt = self._filter(filter)
        deadline = time.monotonic() + min(long_poll_ms, self.config.pop.max_long_poll_ms) / 1000.0
        n = min(max_messages, self.config.pop.max_batch_messages)
        while True:
            snapshot = self.hub.snapshot((topic_key(topic),))
            res = self.store.read(topic, queue_id, offset, max_messages=n, tag_hashes=filt.tag_hashes)
            msgs = [to_stored(r, 1) for r in res.messages if filt.matches(r.tag, r.properties)]
            next_offset = res.next_offset
            if res.status is ReadStatus.OFFSET_OVERFLOW:
                next_offset = res.max_offset
            remaining = deadline - time.monotonic()
            if msgs or res.status in (ReadStatus.OFFSET_TOO_SMALL, ReadStatus.OFFSET_OVERFLOW) or remaining <= 0:
                return PullResult(msgs, next_offset, res.min_offset, res.max_offset)
            if res.status is ReadStatus.NO_MATCH:
                offset = next_offset
                continue
            await self.hub.wait(snapshot, remaining)

    async def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        self.metadata.topic(topic)
        offset = self.store.committed_offset(group, topic, queue_id)
        if offset is None:
            raise OffsetNotFound(f"group {group} has no committed offset for {topic} queue {queue_id}")
        return offset

    async def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        spec = self.metadata.topic(topic)
        validate_group_name(group)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        self.store.commit_offset(group, topic, queue_id, offset)

    async def query_offset(self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0) -> int:
        spec = self.metadata.topic(topic)
        validate_queue(TopicInfo(spec.name, spec.queue_count), queue_id)
        low, high = self.store.queue_bounds(topic, queue_id)
        if policy is OffsetPolicy.BEGINNING:
            return low
        if policy is OffsetPolicy.END:
            return high
        return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)

    # -- lookups ---------------------------------------------------------------------------------

    async def get_message(self, topic: str, message_id: str) -> list[StoredMessage]:
        return [to_stored(r, 1) for r in self.store.find_by_id(message_id, topic)]

    async def find_messages_by_key(self, topic: str, key: str, limit: int = 64) -> list[StoredMessage]:
        return [to_stored(r, 1) for r in self.store.find_by_key(topic, key, min(max(limit, 1), 1000))]

    # -- timers ----------------------------------------------------------------------------------

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a DELAY message that is not delivered yet; its message id."""
        spec = self.metadata.topic(topic)
        if MessageType.DELAY not in spec.message_types:
            raise MessageTypeConflict(f"topic {topic} does not accept DELAY messages, so it has none to recall")
        return await self.timers.recall(topic, recall_handle)
