"""`TimerService`: the broker's pending DELAY messages and the scheduler that delivers them.

A DELAY message is appended once to the CommitLog under the internal topic `%SYS_TIMER` (queue 0),
with its target topic and queue in system properties; right after the append, one WriteBatch adds
its `timer` and `timer_pos` keys and bumps the topic's pending count (layouts in keys.py). The send
is acknowledged only after that batch, so every acknowledged timer is indexed. (A crash between the
append and the batch leaves an unindexed record that is never delivered; its send was not
acknowledged, so the client retries it.)

The scheduler (one task per broker, `run`) scans the `timer` keys due by now in order, reads their
records, and appends copies into their topics in one store append per batch, then deletes the keys
in one WriteBatch. Before the append it records the batch's last key as `inflight`; if the broker
dies (or the append fails) between the append and the delete, the next round first checks each
timer up to that key against the message-id index of its topic (each copy carries its timer's
position) and only deletes those already delivered. So a timer is delivered once, never lost, and
never early (due times are rounded up to the precision).

Recall deletes a pending timer's keys under the same lock the scheduler holds per batch, so a
recall either wins (the timer is never delivered) or finds it gone (NotFound).

Single-writer: every mutation runs on the broker's event loop; scans and record reads of a batch
run in the default executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from broker.client.recall import RecallHandle, decode_recall_handle
from broker.config import TimerConfig
from broker.store.store import MessageStore, PreparedAppend
from broker.store.writer import AppendResult
from broker.timer import keys as TK
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import BadRequest, IllegalDeliveryTime, MessageCorrupted, NotFound, OffsetNotFound
from common.logs import kv
from common.record import (
    SYSPROP_TIMER_POSITION,
    SYSPROP_TIMER_TARGET_QUEUE,
    SYSPROP_TIMER_TARGET_TOPIC,
    MessageRecord,
    copy_to_store,
)

log = logging.getLogger("sluice.broker.timer")

# A delivery timestamp this far ahead is a millisecond value the Python client put in the seconds
# field (it passes `delivery_timestamp` there unchanged): the year ~5138 and beyond.
_SECONDS_AS_MS_THRESHOLD_MS = 10**14


@dataclass(slots=True)
class _Due:
    key: bytes
    position: int
    target: str
    record: MessageRecord | None  # None: unreadable (logged) and dropped


@dataclass(slots=True)
class _Staged:
    """A batch of due timers with their copies encoded, ready to append."""

    due: list[_Due]
    prepared: PreparedAppend | None  # None: nothing to append (every timer of the batch is dropped)
    generation: int  # recalls counted when it was read: stale if another recall ran since


class TimerService:
    def __init__(
        self,
        broker_name: str,
        store: MessageStore,
        config: TimerConfig,
        topic_exists: Callable[[str], bool],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`clock`: delivery times are read on it (common/clock.py); the waits between ticks are real."""
        self._broker = broker_name
        self._clock = clock
        self._store = store
        self._cfg = config
        self._topic_exists = topic_exists
        index = store.index
        self._timer = index.cf(TK.CF_TIMER)
        self._pos = index.cf(TK.CF_TIMER_POS)
        self._state = index.cf(TK.CF_TIMER_STATE)
        self._h_timer = index.handle(TK.CF_TIMER)
        self._h_pos = index.handle(TK.CF_TIMER_POS)
        self._h_state = index.handle(TK.CF_TIMER_STATE)
        self._index = index
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._next_wake_ms = 0
        self._generation = 0  # bumped by every recall: staged batches read before it are stale
        self._needs_check = True  # a previous run may have died with a batch in flight
        self._counts: dict[str, int] = {}
        for key, value in self._state.items(from_key=TK.STATE_COUNT_PREFIX):
            if not key.startswith(TK.STATE_COUNT_PREFIX):
                break
            n = TK.parse_u64(value)
            if n:
                self._counts[key[len(TK.STATE_COUNT_PREFIX) :].decode("utf-8")] = n
        self.delivered = 0  # timers delivered by this process (for stats)

    def close(self) -> None:
        """Drop every RocksDB handle: RocksDB keeps its lock while any is alive, and a logged
        exception's traceback may keep this object alive after the broker closed."""
        for name in ("_timer", "_pos", "_state", "_h_timer", "_h_pos", "_h_state", "_index", "_store"):
            self.__dict__.pop(name, None)

    # -- send side -------------------------------------------------------------------------------

    def check_delivery_time(self, msg: MessageRecord, now: int | None = None) -> None:
        at = msg.delivery_timestamp_ms
        limit = (self._clock.now_ms() if now is None else now) + self._cfg.max_delay_ms
        if at > limit:
            hint = ""
            if at >= _SECONDS_AS_MS_THRESHOLD_MS:
                hint = " (it looks like milliseconds passed where seconds are expected)"
            raise IllegalDeliveryTime(
                f"delivery time {at} ms is more than {self._cfg.max_delay_ms // 1000} s ahead{hint}; "
                f"this broker schedules messages at most {self._cfg.max_delay_ms // 1000} s into the future"
            )

    def timer_record(self, target: MessageRecord) -> MessageRecord:
        """The record kept under the timer topic for a message bound to `target.topic`/`queue_id`."""
        sysprops = dict(target.system_properties)
        sysprops[SYSPROP_TIMER_TARGET_TOPIC] = target.topic
        sysprops[SYSPROP_TIMER_TARGET_QUEUE] = str(target.queue_id)
        target.system_properties = sysprops
        target.topic = TK.TIMER_TOPIC
        target.queue_id = 0
        target.edge = b""  # its system properties changed: encoded again (the edge record lacks them)
        return target

    def index(self, items: list[tuple[str, int, AppendResult]]) -> list[str]:
        """Index appended timer records: (target topic, delivery time, append result) each, one
        WriteBatch. Returns their recall handles, in order."""
        batch = self._index.batch()
        handles = []
        added: dict[str, int] = {}
        earliest = None
        for topic, deliver_at, res in items:
            due = TK.round_up(deliver_at, self._cfg.precision_ms)
            batch.put(TK.timer_key(due, res.physical_offset), TK.timer_value(res.size, topic), self._h_timer)
            batch.put(TK.pos_key(res.physical_offset), TK.u64(due), self._h_pos)
            added[topic] = added.get(topic, 0) + 1
            earliest = due if earliest is None else min(earliest, due)
            handles.append(RecallHandle(self._broker, due, res.physical_offset, TK.topic_crc(topic)).encode())
        for topic, n in added.items():
            batch.put(TK.count_key(topic), TK.u64(self._counts.get(topic, 0) + n), self._h_state)
        self._index.write(batch)
        for topic, n in added.items():
            self._counts[topic] = self._counts.get(topic, 0) + n
        if earliest is not None and earliest < self._next_wake_ms:
            self._wake.set()
        return handles

    # -- status ----------------------------------------------------------------------------------

    def pending_count(self, topic: str | None = None) -> int:
        """Timers not yet delivered (of one topic, or all): a gauge for metrics and topic status."""
        if topic is not None:
            return self._counts.get(topic, 0)
        return sum(self._counts.values())

    def min_position(self) -> int | None:
        """The oldest CommitLog position a pending timer needs (retention keeps it)."""
        it = self._pos.iter()
        it.seek_to_first()
        return TK.parse_pos_key(it.key()) if it.valid() else None

    # -- recall ----------------------------------------------------------------------------------

    async def recall(self, topic: str, handle_text: str) -> str:
        """Cancel a pending timer; its message id. NotFound when it was delivered, recalled or unknown."""
        handle = decode_recall_handle(handle_text)
        if handle.broker != self._broker:
            raise BadRequest(f"recall handle belongs to broker {handle.broker}, not {self._broker}")
        if handle.topic_crc != TK.topic_crc(topic):
            raise BadRequest(f"recall handle was not issued for topic {topic}")
        async with self._lock:
            raw = self._timer.get(key := TK.timer_key(handle.due_ms, handle.position))
            if raw is None:
                raise NotFound(
                    f"no pending delay message for this recall handle in topic {topic}: "
                    "it was already delivered or recalled, or never existed"
                )
            size, target = TK.parse_timer_value(raw)
            try:
                message_id = self._store.read_at(handle.position, size).message_id
            except (OffsetNotFound, MessageCorrupted):
                message_id = ""
            batch = self._index.batch()
            self._drop(batch, [(key, handle.position, target)])
            self._index.write(batch)
            self._commit_counts([target])
            self._generation += 1
        log.info("timer recalled", extra=kv(topic=topic, message_id=message_id, due_ms=handle.due_ms))
        return message_id

    async def drop_topic(self, topic: str, before: int) -> int:
        """Forget the pending timers of `topic` stored before CommitLog position `before` (its
        deletion: store.deletion); how many. The timer index is scanned off the event loop, under
        the lock a delivery round holds. A timer of the deleted topic indexed after the scan is
        dropped when it comes due (`_copy`)."""
        async with self._lock:
            stale = await asyncio.get_running_loop().run_in_executor(None, self._pending_of, topic, before)
            if stale:
                batch = self._index.batch()
                self._drop(batch, stale)
                self._index.write(batch)
                self._commit_counts([t for _, _, t in stale])
                self._generation += 1  # staged batches may hold them
        if stale:
            log.info("pending timers of a deleted topic dropped", extra=kv(topic=topic, timers=len(stale)))
        return len(stale)

    def _pending_of(self, topic: str, before: int) -> list[tuple[bytes, int, str]]:
        out = []
        it = self._timer.iter()
        it.seek_to_first()
        while it.valid():
            position = TK.parse_timer_key(it.key())[1]
            if position < before and TK.parse_timer_value(it.value())[1] == topic:
                out.append((bytes(it.key()), position, topic))
            it.next()
        return out

    # -- scheduler -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        interval_s = self._cfg.precision_ms / 1000.0
        staged: list[_Staged] = []
        while not stop.is_set():
            try:
                if self._needs_check:
                    staged = []
                    await self._settle_inflight()
                delivered = await self.deliver_due(staged=staged)
                staged = []
                if delivered >= self._cfg.batch_messages:
                    continue  # more may be due: no sleep
                wait_s = interval_s
                first = self._first_due()
                if first is not None:
                    ahead_ms = first - self._clock.now_ms()
                    if 0 < ahead_ms <= self._cfg.prefetch_ms:
                        self._next_wake_ms = first  # a send due earlier interrupts the prefetch
                        self._wake.clear()
                        staged = await self._prefetch(first)
                        if self._wake.is_set():
                            continue
                        ahead_ms = first - self._clock.now_ms()
                    wait_s = min(interval_s, max(0.0, ahead_ms / 1000.0))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer delivery round failed; retrying")
                self._needs_check = True
                wait_s = interval_s
            self._next_wake_ms = self._clock.now_ms() + int(wait_s * 1000)
            self._wake.clear()
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wait_either(stop), wait_s)

    async def _wait_either(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _first_due(self) -> int | None:
        it = self._timer.iter()
        it.seek_to_first()
        return TK.parse_timer_key(it.key())[0] if it.valid() else None

    async def _prefetch(self, tick_ms: int) -> list[_Staged]:
        """Read and encode the copies of the timers due at `tick_ms` (and before), ahead of it."""
        loop = asyncio.get_running_loop()
        generation = self._generation
        out: list[_Staged] = []
        start = b""
        held = 0
        # Stop at the tick (deliver), or when a send scheduled something due earlier.
        while held < self._cfg.prefetch_bytes and self._clock.now_ms() < tick_ms and not self._wake.is_set():
            st = await loop.run_in_executor(None, self._stage, tick_ms, start, generation)
            if st is None:
                break
            out.append(st)
            held += len(st.prepared.buf) if st.prepared is not None else 0
            if len(st.due) < self._cfg.batch_messages:
                break
            start = st.due[-1].key + b"\0"  # keys are fixed-size: the next possible key
        return out

    async def deliver_due(self, now: int | None = None, staged: list[_Staged] | None = None) -> int:
        """Deliver every timer due by `now`, batch by batch; the number of timers settled.

        `staged` batches (prefetched for a tick that has now come) go first unless a recall ran
        since they were read. Staging the next batch (executor) overlaps with appending the current
        one. The lock is held throughout, so a recall waits for the round, then finds its timer
        pending or gone."""
        loop = asyncio.get_running_loop()
        total = 0
        async with self._lock:
            limit = self._clock.now_ms() if now is None else now
            for st in staged or ():
                if st.generation != self._generation or st.due[-1].key > TK.timer_key(limit, (1 << 64) - 1):
                    break
                await self._deliver_batch(st)
                total += len(st.due)
            current = await loop.run_in_executor(None, self._stage, limit, b"", self._generation)
            while current is not None:
                ahead = None
                if len(current.due) >= self._cfg.batch_messages:
                    nxt = current.due[-1].key + b"\0"
                    ahead = loop.run_in_executor(None, self._stage, limit, nxt, self._generation)
                try:
                    await self._deliver_batch(current)
                finally:
                    if ahead is not None and self._needs_check:
                        await asyncio.gather(ahead, return_exceptions=True)
                total += len(current.due)
                current = await ahead if ahead is not None else None
        return total

    async def _deliver_batch(self, st: _Staged) -> None:
        due = st.due
        marker = self._index.batch()  # a batch, so that a replicated primary records it
        marker.put(TK.STATE_INFLIGHT, due[-1].key, self._h_state)
        self._index.write(marker)
        self._needs_check = True
        if st.prepared is not None:
            await self._store.append_prepared(st.prepared)
        batch = self._index.batch()
        self._drop(batch, [(d.key, d.position, d.target) for d in due])
        batch.delete(TK.STATE_INFLIGHT, self._h_state)
        self._index.write(batch)
        self._commit_counts([d.target for d in due])
        self._needs_check = False
        self.delivered += len(st.prepared.sizes) if st.prepared is not None else 0

    def _stage(self, limit_ms: int, start: bytes, generation: int) -> _Staged | None:
        """One batch of timers due by `limit_ms` from key `start` on, with their copies encoded."""
        due = self._collect(limit_ms, start)
        if not due:
            return None
        copies = [c for c in (self._copy(d) for d in due) if c is not None]
        for d in due:
            d.record = None  # encoded now: a staged batch holds its bytes once
        return _Staged(due, self._store.prepare(copies) if copies else None, generation)

    def _collect(self, limit_ms: int, start: bytes) -> list[_Due]:
        out: list[_Due] = []
        it = self._timer.iter()
        if start:
            it.seek(start)
        else:
            it.seek_to_first()
        while it.valid() and len(out) < self._cfg.batch_messages:
            key = it.key()
            due_ms, position = TK.parse_timer_key(key)
            if due_ms > limit_ms:
                break
            size, target = TK.parse_timer_value(it.value())
            out.append(_Due(key, position, target, self._read(position, size)))
            it.next()
        return out

    def _read(self, position: int, size: int) -> MessageRecord | None:
        try:
            return self._store.read_at(position, size)
        except (OffsetNotFound, MessageCorrupted) as exc:
            log.error("pending timer record is unreadable; dropped", extra=kv(position=position, error=str(exc)))
            return None

    def _copy(self, due: _Due) -> MessageRecord | None:
        rec = due.record
        if rec is None:
            return None
        if not self._topic_exists(due.target):
            log.warning(
                "timer's topic no longer exists; dropped", extra=kv(topic=due.target, message_id=rec.message_id)
            )
            return None
        if due.position < self._store.deleted_at(due.target):
            log.warning("timer's topic was deleted after it was sent (and created again); dropped",
                        extra=kv(topic=due.target, message_id=rec.message_id))  # fmt: skip
            return None
        sysprops = {k: v for k, v in rec.system_properties.items()
                    if k not in (SYSPROP_TIMER_TARGET_TOPIC, SYSPROP_TIMER_TARGET_QUEUE)}  # fmt: skip
        sysprops[SYSPROP_TIMER_POSITION] = str(due.position)
        return copy_to_store(rec, due.target, int(rec.system_properties.get(SYSPROP_TIMER_TARGET_QUEUE, "0")), sysprops)

    def _drop(self, batch: object, entries: list[tuple[bytes, int, str]]) -> None:
        """Delete timers' keys and write their topics' new counts into `batch` (counts follow in
        memory through `_commit_counts` once the batch is written)."""
        put, delete = batch.put, batch.delete  # type: ignore[attr-defined]
        removed: dict[str, int] = {}
        for key, position, target in entries:
            delete(key, self._h_timer)
            delete(TK.pos_key(position), self._h_pos)
            removed[target] = removed.get(target, 0) + 1
        for target, n in removed.items():
            left = max(0, self._counts.get(target, 0) - n)
            if left:
                put(TK.count_key(target), TK.u64(left), self._h_state)
            else:
                delete(TK.count_key(target), self._h_state)

    def _commit_counts(self, targets: list[str]) -> None:
        for target in targets:
            left = self._counts.get(target, 0) - 1
            if left > 0:
                self._counts[target] = left
            else:
                self._counts.pop(target, None)

    async def _settle_inflight(self) -> None:
        """After a crash (or a failed append) with a batch in flight: drop the timers of that batch
        whose copy is already in their topic; the others stay pending and are delivered normally."""
        async with self._lock:
            marker = self._state.get(TK.STATE_INFLIGHT)
            if marker is None:
                self._needs_check = False
                return
            done = await asyncio.get_running_loop().run_in_executor(None, self._already_delivered, bytes(marker))
            batch = self._index.batch()
            self._drop(batch, done)
            batch.delete(TK.STATE_INFLIGHT, self._h_state)
            self._index.write(batch)
            self._commit_counts([t for _, _, t in done])
            self._needs_check = False
        log.info("timer batch in flight at the last stop settled", extra=kv(already_delivered=len(done)))

    def _already_delivered(self, marker: bytes) -> list[tuple[bytes, int, str]]:
        done = []
        it = self._timer.iter()
        it.seek_to_first()
        while it.valid() and it.key() <= marker:
            key = it.key()
            _, position = TK.parse_timer_key(key)
            size, target = TK.parse_timer_value(it.value())
            rec = self._read(position, size)
            if rec is None or any(
                c.system_properties.get(SYSPROP_TIMER_POSITION) == str(position)
                for c in self._store.find_by_id(rec.message_id, target)
            ):
                done.append((key, position, target))
            it.next()
        return done
