"""Pop consumption: receive with invisibility, ack, invisible-duration changes, retry and DLQ.

A pop, for one consumer group and topic, hands out up to N messages in this order:
1. messages whose invisibility ended (redelivery, delivery attempt + 1), oldest deadline first;
2. for FIFO groups, the next held-back message of every message group that has nothing in flight;
3. new messages from the group's cursor, skipping those the filter rejects (they count as done).
Each delivered message becomes INFLIGHT until `now + invisible` and gets a receipt handle whose
version changes with every delivery and invisible-duration change (see popstate.py, receipt.py).
All state changes of one call are one WriteBatch, committed before the call returns.

A message that runs out of delivery attempts moves to `%DLQ%<group>` when its invisibility ends
(the scanner task does it; pops leave such messages alone). FIFO groups deliver a message group's
next message only after the previous one is acknowledged or dead-lettered (on a replicated primary:
once every in-sync member holds that ack or dead letter, popstate.py); other message groups in the
same queue keep flowing. A lite topic is such a lane as a whole (broker/lite/service.py).

Event-loop thread only: the state of a call is read and written without an await in between,
except around the dead-letter append, which re-checks the entry's version after the await.

Tiered storage (`cold`, when configured): messages below the local copy of a queue live in the
bucket. Reading them blocks, so a pop first fetches, off the event loop, what it may need from
there (a run of messages from each cold cursor, and due or FIFO-held messages below the local copy)
into a `_Cold` batch; the synchronous part then uses those records exactly like local ones. An
offset the bucket holds but the batch lacks (another pop moved the cursor meanwhile) is left for
the next round, never skipped. A bucket that is down fails the pop with the retriable error only
when no other queue had anything to deliver.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from broker import priority
from broker.client import receipt
from broker.client.api import AckResult, GroupInfo, GroupQueueStatus, PopRequest, StoredMessage, TopicSpec
from broker.config import PopConfig
from broker.filter import MessageFilter, TagFilter
from broker.longpoll import LongPollHub, group_key, topic_key
from broker.metadata import Metadata
from broker.popstate import EntryState, PopBatch, PopEntry, PopState
from broker.readybytes import ReadBehind, ReadyBytes
from broker.store.store import MessageStore, ReadResult, ReadStatus
from broker.tiering.runtime import BrokerTiering
from broker.trace import TraceRecorder
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import (
    IllegalInvisibleTime,
    InvalidReceiptHandle,
    MessageCorrupted,
    OffsetNotFound,
    SluiceError,
    Unavailable,
)
from common.logs import BurstLog, kv
from common.record import MessageRecord

log = logging.getLogger("sluice.broker.consumer")

DeadLetter = Callable[[MessageRecord, str, int], Awaitable[None]]
_DUE_SCAN_LIMIT = 1_000
_READY_BYTES_ROUNDS = 16  # reads in a worker thread per ready-bytes status before giving up (Unavailable)


@dataclass
class _Cold:
    """Messages of one pop fetched from the tiered bucket before its synchronous part runs."""

    runs: dict[int, list[MessageRecord]] = field(default_factory=dict)  # queue -> messages from its cursor on
    records: dict[tuple[int, int], MessageRecord] = field(default_factory=dict)  # (queue, offset) -> message
    fetched: set[tuple[int, int]] = field(default_factory=set)  # (queue, offset) asked for, found or not
    cursors: dict[int, int] = field(default_factory=dict)  # queue -> first cursor, found in the bucket
    skip: set[int] = field(default_factory=set)  # queues whose first cursor the bucket could not tell
    error: SluiceError | None = None  # the bucket failed (first failure)
    short: bool = False  # a message in the bucket was needed but not fetched: pop again at once

    def run_from(self, queue_id: int, offset: int) -> list[MessageRecord]:
        return [r for r in self.runs.get(queue_id, ()) if r.queue_offset >= offset]


class PopEngine:
    def __init__(
        self, *, broker_name: str, store: MessageStore, metadata: Metadata, state: PopState, hub: LongPollHub,
        config: PopConfig, dead_letter: DeadLetter, trace: TraceRecorder, cold: BrokerTiering | None = None,
        clock: Clock = SYSTEM_CLOCK, store_host: str = "",
    ) -> None:  # fmt: skip
        """`clock`: invisible durations and redelivery are measured on it (common/clock.py).
        `store_host`: this broker's address, delivered as the store host of a record that names none."""
        self._name = broker_name
        self._host = store_host
        self.clock = clock
        self._cold = cold
        self._store = store
        self._max_bytes = store.config.read.max_batch_bytes
        self._meta = metadata
        self._state = state
        self._hub = hub
        self._cfg = config
        self._dead_letter = dead_letter
        self._trace = trace
        self._rotation = itertools.count()
        self.levels = priority.EmptyLevels()  # priority levels each group has drained
        self.ready_bytes = ReadyBytes(store)  # body bytes of the ready messages of queues asked about
        self.dead_lettered = 0
        self._dlq_log = BurstLog(log, "message(s) moved to the dead-letter topic")  # one line per burst
        # Messages handed to consumers per topic since start (every delivery attempt, pop and pull):
        # `topic_status` reports it, and the console plots a topic's rate out from it.
        self.delivered: collections.Counter[str] = collections.Counter()

    # -- pop -------------------------------------------------------------------------------------

    async def pop(
        self, req: PopRequest, group: GroupInfo, topic: TopicSpec, filt: MessageFilter
    ) -> list[StoredMessage]:
        if not self._cfg.min_invisible_ms <= req.invisible_ms <= self._cfg.max_invisible_ms:
            raise IllegalInvisibleTime(
                f"invisible duration {req.invisible_ms} ms is outside "
                f"[{self._cfg.min_invisible_ms}, {self._cfg.max_invisible_ms}] ms"
            )
        n = max(1, min(req.max_messages, self._cfg.max_batch_messages))
        wait_s = min(req.long_poll_ms, self._cfg.max_long_poll_ms) / 1000.0
        deadline = time.monotonic() + wait_s
        keys = (topic_key(topic.name), group_key(group.spec.name))
        while True:
            snapshot = self._hub.snapshot(keys)
            queues = self._queues(req, topic)
            cold = await self._fetch_cold(group, topic.name, queues, n) if self._cold is not None else _Cold()
            found = self._pop_once(req, group, topic, filt, n, queues, cold)
            remaining = deadline - time.monotonic()
            if found:
                return found
            if cold.error is not None:
                raise cold.error
            if remaining <= 0:
                return found
            if not cold.short:
                await self._hub.wait(snapshot, remaining)

    def _queues(self, req: PopRequest, topic: TopicSpec) -> list[int]:
        if priority.is_priority(topic):
            return priority.pop_queues(topic)  # every level of this broker, most urgent first
        if req.queue_id is not None:
            return [req.queue_id]
        start = next(self._rotation) % topic.queue_count
        return [(start + i) % topic.queue_count for i in range(topic.queue_count)]

    def _pop_once(
        self, req: PopRequest, group: GroupInfo, topic: TopicSpec, filt: MessageFilter, n: int, queues: list[int],
        cold: _Cold,
    ) -> list[StoredMessage]:  # fmt: skip
        now = self.clock.now_ms()
        until = now + req.invisible_ms
        out: list[StoredMessage] = []
        claimed: set[tuple[int, str]] = set()  # FIFO (queue, message group) handed out in this call
        fifo_open = True
        if group.spec.fifo:
            self._state.release_settled()  # lanes whose last ack the in-sync replicas now hold
            fifo_open = self._state.fifo_open()  # a new primary: once they hold the state it began with
        batch = self._state.batch()
        self._redeliver(group, topic.name, set(queues), filt, n, now, until, batch, out, claimed, cold)
        if group.spec.fifo and fifo_open:
            for qid in queues:
                if self._full(out, n):
                    break
                self._release_waiting(group, topic.name, qid, n, until, batch, out, claimed, cold)
        levels = self.levels if priority.is_priority(topic) and self._cold is None else None
        g = group.spec.name
        for qid in queues:
            if self._full(out, n):
                break
            if levels is not None and levels.is_drained(g, topic.name, qid):
                continue
            before = len(out)
            self._take_new(group, topic.name, qid, filt, n, until, batch, out, claimed, cold, fifo_open=fifo_open)
            if levels is not None and len(out) == before and self._at_end(batch, g, topic.name, qid):
                levels.drained(g, topic.name, qid)
        batch.commit()
        self.delivered[topic.name] += len(out)
        if out and self._trace.enabled:
            self._trace.delivered_many(topic.name, group.spec.name,
                                       [(m.queue_id, m.queue_offset, m.delivery_attempt) for m in out])  # fmt: skip
        return out

    def _bytes_left(self, out: list[StoredMessage]) -> int:
        """Record bytes a pop holding `out` may still take: one pop carries about
        `read.max_batch_bytes` (past its first message), as one read does, so that a response of
        the internal RPC stays under its limit however large the bodies (AMQP's reach 16 MiB)."""
        return self._max_bytes - sum(m.record.size or len(m.record.body) for m in out)

    def _full(self, out: list[StoredMessage], n: int) -> bool:
        return len(out) >= n or (bool(out) and self._bytes_left(out) <= 0)

    def _redeliver(
        self, group: GroupInfo, topic: str, queues: set[int], filt: MessageFilter, n: int, now: int, until: int,
        batch: PopBatch, out: list[StoredMessage], claimed: set[tuple[int, str]], cold: _Cold,
    ) -> None:  # fmt: skip
        g = group.spec.name
        for _, t, qid, offset in list(self._state.due(g, now, _DUE_SCAN_LIMIT)):
            if self._full(out, n):
                return
            if t != topic or qid not in queues:
                continue
            entry = self._state.entry(g, t, qid, offset)
            if entry is None or entry.state is not EntryState.INFLIGHT:
                continue
            if entry.attempt >= group.spec.max_delivery_attempts:
                continue  # the scanner dead-letters it
            rec = self._load(g, t, qid, offset, entry, batch, cold)
            if rec is None:
                continue
            if not filt.matches(rec.tag, rec.properties):
                batch.remove(g, t, qid, offset, entry)  # the subscription no longer wants it
                continue
            version = self._state.next_version(entry.version)
            new = PopEntry(EntryState.INFLIGHT, entry.attempt + 1, version, until, entry.message_group)
            batch.put(g, t, qid, offset, new, entry)
            if entry.message_group:
                claimed.add((qid, entry.message_group))
            out.append(self._deliver(rec, new.attempt, new.version, until, g))

    def _release_waiting(
        self, group: GroupInfo, topic: str, qid: int, n: int, until: int, batch: PopBatch,
        out: list[StoredMessage], claimed: set[tuple[int, str]], cold: _Cold,
    ) -> None:  # fmt: skip
        g = group.spec.name
        lanes = self._state.fifo.get((g, topic, qid))
        if not lanes:
            return
        for mg, lane in list(lanes.items()):
            if self._full(out, n):
                return
            if lane.outstanding or lane.settling or not lane.waiting or (qid, mg) in claimed:
                continue
            offset = lane.waiting[0]
            entry = self._state.entry(g, topic, qid, offset)
            if entry is None or entry.state is not EntryState.WAITING:
                continue
            rec = self._load(g, topic, qid, offset, entry, batch, cold)
            if rec is None:
                continue
            new = PopEntry(EntryState.INFLIGHT, entry.attempt + 1, self._state.next_version(entry.version), until, mg)
            batch.put(g, topic, qid, offset, new, entry)
            claimed.add((qid, mg))
            out.append(self._deliver(rec, new.attempt, new.version, until, g))

    def _take_new(
        self, group: GroupInfo, topic: str, qid: int, filt: MessageFilter, n: int, until: int, batch: PopBatch,
        out: list[StoredMessage], claimed: set[tuple[int, str]], cold: _Cold, *, fifo_open: bool = True,
    ) -> None:  # fmt: skip
        """New messages from the group's cursor; `fifo_open` False (`PopState.fifo_open`): every
        message of a message group is held back (WAITING) for now."""
        g = group.spec.name
        fifo = group.spec.fifo
        if qid in cold.skip:
            return
        unset = self._state.cursor(g, topic, qid) is None
        cursor = cold.cursors[qid] if unset and qid in cold.cursors else self.cursor(group, topic, qid)
        start = cursor
        scanned = 0
        while not self._full(out, n) and scanned < self._cfg.max_scan_entries:
            left = self._bytes_left(out)
            res = self._store.read(topic, qid, cursor, max_messages=n - len(out), max_bytes=max(1, left),
                                   tag_hashes=filt.tag_hashes)  # fmt: skip
            tier = self._cold
            if (
                res.status is ReadStatus.OFFSET_TOO_SMALL
                and tier is not None
                and tier.covers(topic, qid, cursor, res.min_offset)
            ):
                run = cold.run_from(qid, cursor)
                if not run:
                    cold.short = True  # in the bucket, not fetched for this call: the next round reads it
                    break
                res = ReadResult(ReadStatus.FOUND, run, run[-1].queue_offset + 1, res.min_offset, res.max_offset)
            if res.status is ReadStatus.OFFSET_TOO_SMALL:
                cursor = res.next_offset  # older messages were deleted by retention
                continue
            if res.status is ReadStatus.OFFSET_OVERFLOW:
                cursor = res.max_offset  # the queue is shorter than the cursor (data lost in a crash)
                break
            if res.status is ReadStatus.NO_NEW_MESSAGES:
                break
            scanned += max(1, res.next_offset - cursor)
            consumed_to = res.next_offset
            # Hot loop (once per new message): bound methods and the tag test are looked up once.
            add, deliver, append = batch.add_inflight, self._deliver, out.append
            version, held_version = self._state.first_version, self._state.waiting_version
            everything = isinstance(filt, TagFilter) and filt.tags is None
            for rec in res.messages:
                if len(out) >= n or (out and left <= 0):
                    consumed_to = rec.queue_offset
                    break
                if not everything and not filt.matches(rec.tag, rec.properties):
                    continue
                mg = (rec.message_group or "") if fifo else ""
                if mg:
                    lane = self._state.fifo.get((g, topic, qid), {}).get(mg)
                    if (qid, mg) in claimed or not fifo_open or (lane is not None and not lane.idle):
                        held = PopEntry(EntryState.WAITING, 0, held_version, 0, mg)
                        batch.put(g, topic, qid, rec.queue_offset, held, None)
                        continue
                    claimed.add((qid, mg))
                add(g, topic, qid, rec.queue_offset, until, mg)
                append(deliver(rec, 1, version, until, g))
                left -= rec.size or len(rec.body)
            cursor = consumed_to
        if cursor != start or self._state.cursor(g, topic, qid) is None:
            batch.set_cursor(g, topic, qid, cursor)

    def _at_end(self, batch: PopBatch, g: str, topic: str, qid: int) -> bool:
        """Whether the group's cursor in a queue (as this pop leaves it) is at the queue's end."""
        cursor = batch.cursor_set(g, topic, qid)
        if cursor is None:
            cursor = self._state.cursor(g, topic, qid)
        return cursor is not None and cursor == self._store.queue_bounds(topic, qid)[1]

    def cursor(self, group: GroupInfo, topic: str, qid: int) -> int:
        """The group's next never-delivered offset, initialised from its start position."""
        cursor = self._state.cursor(group.spec.name, topic, qid)
        if cursor is not None:
            return cursor
        spec = group.spec
        if spec.consume_from.value == "earliest":
            low = self._store.queue_bounds(topic, qid)[0]
            return low if self._cold is None else self._cold.floor(topic, qid, low)
        return self._store.offset_for_timestamp(topic, qid, self._since_ms(group))

    @staticmethod
    def _since_ms(group: GroupInfo) -> int:
        spec = group.spec
        return spec.consume_from_timestamp_ms if spec.consume_from.value == "timestamp" else group.created_ms

    def _load(
        self, g: str, topic: str, qid: int, offset: int, entry: PopEntry, batch: PopBatch, cold: _Cold
    ) -> MessageRecord | None:
        try:
            return self._store.get(topic, qid, offset)
        except OffsetNotFound:
            rec = cold.records.get((qid, offset))
            if rec is not None:
                return rec
            if self._cold is not None and (qid, offset) not in cold.fetched:
                low = self._store.queue_bounds(topic, qid)[0]
                if self._cold.covers(topic, qid, offset, low, exact=True):
                    cold.short = True  # tiered, not fetched for this call (or the bucket failed): keep it
                    return None
            batch.remove(g, topic, qid, offset, entry)  # deleted by retention: nothing left to deliver
        except MessageCorrupted as exc:
            log.error(
                "dropping an unreadable message from pop state",
                extra=kv(group=g, topic=topic, queue=qid, offset=offset, error=exc.message),
            )
            batch.remove(g, topic, qid, offset, entry)
        return None

    def _deliver(self, rec: MessageRecord, attempt: int, version: int, until: int, group: str) -> StoredMessage:
        """The delivered message with its receipt handle (`_pop_once` records the trace, per pop)."""
        qid, offset = rec.queue_id, rec.queue_offset
        handle = receipt.encode(self._name, qid, offset, version, until, receipt.name_crc(rec.topic),
                                receipt.name_crc(group))  # fmt: skip
        return StoredMessage(rec, attempt, handle, until, self._host)

    # -- ack and friends -------------------------------------------------------------------------

    def _fields(self, group: str, topic: str, handle: str) -> tuple[int, int, int, int, int, int]:
        """(queue, offset, version, deadline, topic CRC, group CRC) of a handle issued by this broker
        for this topic and group; InvalidReceiptHandle otherwise."""
        broker, qid, offset, version, until, tcrc, gcrc = receipt.fields(handle)
        if broker != self._name:
            raise InvalidReceiptHandle(f"receipt handle belongs to broker {broker}, not {self._name}")
        receipt.check_names(tcrc, gcrc, topic, group)
        return qid, offset, version, until, tcrc, gcrc

    @staticmethod
    def _current(raw: bytes | None, version: int) -> PopEntry:
        """The entry a handle of `version` names, if that handle is still the live one."""
        entry = None if raw is None else PopEntry.decode(raw)
        if entry is None or entry.state is not EntryState.INFLIGHT:
            raise InvalidReceiptHandle(
                "no delivery is in flight under this handle: the message was acknowledged or dead-lettered, or "
                "(after a failover) its delivery was not kept and it will be delivered again; this handle is spent"
            )
        if entry.version != version:
            raise InvalidReceiptHandle(
                "receipt handle expired: the message was redelivered or its invisible duration changed since"
            )
        return entry

    def _deleted_since(self, topic: str, qid: int, offset: int) -> None:
        """Refuse a handle whose message's topic was deleted since it was delivered (the offset lies
        below the queue's first offset since then: no new message ever has it)."""
        if offset < self._store.incarnation_floor(topic, qid):
            raise InvalidReceiptHandle(
                f"the message of this receipt handle is gone: topic {topic} was deleted after the message was "
                "delivered (a topic of that name now is a new one, which this handle cannot touch)"
            )

    def _resolve(self, group: str, topic: str, handle: str) -> tuple[receipt.ReceiptHandle, PopEntry]:
        qid, offset, version, until, tcrc, gcrc = self._fields(group, topic, handle)
        (raw,) = self._state.entries(group, topic, [(qid, offset)])
        if raw is None:
            self._deleted_since(topic, qid, offset)
        entry = self._current(raw, version)
        return receipt.ReceiptHandle(self._name, qid, offset, version, until, tcrc, gcrc), entry

    def ack(self, group: str, topic: str, handles: list[str]) -> tuple[list[AckResult], set[tuple[int, int]]]:
        """Acknowledge a request's handles: one decode pass, one multi-get of their entries, one batch.
        Also the (queue, offset) positions it acknowledged (which free a lite topic's next message:
        `LiteService.after_ack`)."""
        parsed: list[tuple[int, int, int] | SluiceError] = []
        for handle in handles:
            try:
                qid, offset, version, _, _, _ = self._fields(group, topic, handle)
                parsed.append((qid, offset, version))
            except SluiceError as exc:
                parsed.append(exc)
        raws = iter(self._state.entries(group, topic, [(p[0], p[1]) for p in parsed if not isinstance(p, SluiceError)]))
        batch = self._state.batch()
        results: list[AckResult] = []
        done: set[tuple[int, int]] = set()
        release = False
        for handle, p in zip(handles, parsed, strict=True):
            try:
                if isinstance(p, SluiceError):
                    raise p
                qid, offset, version = p
                raw = next(raws)
                if raw is None:
                    self._deleted_since(topic, qid, offset)
                entry = self._current(raw, version)
                if (qid, offset) in done:
                    raise InvalidReceiptHandle("the same receipt handle appears twice in one request")
                done.add((qid, offset))
                batch.remove(group, topic, qid, offset, entry)
                release = release or bool(entry.message_group)
                results.append(AckResult(handle))
            except SluiceError as exc:
                results.append(AckResult(handle, exc))
        batch.commit()
        self._trace.acked_many(topic, group, list(done))
        if release:
            self._hub.notify((group_key(group),))
        return results, done

    def change_invisible_duration(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        self._check_invisible(invisible_ms)
        rh, entry = self._resolve(group, topic, handle)
        return self._make_invisible(group, topic, rh, entry, invisible_ms)

    def nack(self, group: GroupInfo, topic: str, handle: str) -> str:
        """A failed attempt: invisible for the group's retry-policy delay after that attempt."""
        rh, entry = self._resolve(group.spec.name, topic, handle)
        delay_ms = group.spec.retry_policy.delay_ms(entry.attempt)
        self._check_invisible(delay_ms)
        return self._make_invisible(group.spec.name, topic, rh, entry, delay_ms)

    def _check_invisible(self, invisible_ms: int) -> None:
        if not 0 <= invisible_ms <= self._cfg.max_invisible_ms:
            raise IllegalInvisibleTime(
                f"invisible duration {invisible_ms} ms is outside [0, {self._cfg.max_invisible_ms}] ms"
            )

    def _make_invisible(
        self, group: str, topic: str, rh: receipt.ReceiptHandle, entry: PopEntry, invisible_ms: int
    ) -> str:
        """Move a resolved in-flight entry's deadline to now + invisible_ms; returns the new handle."""
        until = self.clock.now_ms() + invisible_ms
        new = PopEntry(
            EntryState.INFLIGHT, entry.attempt, self._state.next_version(entry.version), until, entry.message_group
        )
        batch = self._state.batch()
        batch.put(group, topic, rh.queue_id, rh.queue_offset, new, entry)
        batch.commit()
        self._trace.invisible(topic, rh.queue_id, rh.queue_offset, group, entry.attempt, invisible_ms)
        if invisible_ms == 0:
            self._hub.notify((group_key(group),))
        return receipt.ReceiptHandle(
            self._name, rh.queue_id, rh.queue_offset, new.version, until, rh.topic_crc, rh.group_crc
        ).encode()

    def renew(self, group: str, topic: str, handles: list[str], invisible_ms: int) -> list[AckResult]:
        """Extend the invisibility of in-flight messages while their consumer still holds them.

        Unlike an invisible-duration change, the version stays, so the handle the consumer got at
        delivery remains the one it acks with (push consumers never see a renewed handle).
        """
        if not 0 < invisible_ms <= self._cfg.max_invisible_ms:
            raise IllegalInvisibleTime(f"renewal of {invisible_ms} ms is outside (0, {self._cfg.max_invisible_ms}] ms")
        until = self.clock.now_ms() + invisible_ms
        batch = self._state.batch()
        results: list[AckResult] = []
        for handle in handles:
            try:
                rh, entry = self._resolve(group, topic, handle)
                new = PopEntry(EntryState.INFLIGHT, entry.attempt, entry.version, until, entry.message_group)
                batch.put(group, topic, rh.queue_id, rh.queue_offset, new, entry)
                results.append(AckResult(handle))
            except SluiceError as exc:
                results.append(AckResult(handle, exc))
        batch.commit()
        return results

    async def forward_to_dead_letter(self, group: str, topic: str, handle: str) -> None:
        rh, entry = self._resolve(group, topic, handle)
        await self._move_to_dlq(group, topic, rh.queue_id, rh.queue_offset, entry)

    async def _move_to_dlq(self, group: str, topic: str, qid: int, offset: int, entry: PopEntry) -> None:
        batch = self._state.batch()
        cold = _Cold()
        await self._fetch_exact(topic, [(qid, offset)], cold)
        rec = self._load(group, topic, qid, offset, entry, batch, cold)
        if rec is None:
            batch.commit()
            if cold.error is not None:
                raise cold.error  # the message is in the bucket, which failed: the scanner retries
            return
        await self._dead_letter(rec, group, entry.attempt)
        current = self._state.entry(group, topic, qid, offset)
        if current is not None and current.version == entry.version:
            batch.remove(group, topic, qid, offset, current)
            batch.commit()
        self.dead_lettered += 1
        self._dlq_log.event((group, topic), group=group, topic=topic, queue=qid, offset=offset,
                            message_id=rec.message_id, attempts=entry.attempt)  # fmt: skip
        if entry.message_group:
            self._hub.notify((group_key(group),))

    # -- background ------------------------------------------------------------------------------

    def settled(self) -> None:
        """Wake the consumers of groups whose message groups' or lite topics' last acks or dead
        letters every in-sync member now holds (their next messages may go out); on a new primary,
        of every group once they hold the state its term began with (`PopState.fifo_open`: FIFO
        groups and lite consumers, whichever groups they are, waited for it)."""
        was_open = self._state.fifo_open()
        opened = self._state.release_settled()
        if not was_open and self._state.fifo_open():
            opened |= set(self._meta.groups)
        if opened:
            self._hub.notify(tuple(group_key(g) for g in opened))

    async def scan_due(self) -> None:
        """Dead-letter exhausted messages and wake consumers of groups with visible-again messages
        or FIFO lanes opened since (`settled`: an ack refused while too few members were in sync
        opens its lane once they hold it)."""
        self.settled()
        now = self.clock.now_ms()
        for g in self._state.groups_with_inflight():
            info = self._meta.groups.get(g)
            if info is None:
                continue
            any_due = False
            for _, t, qid, offset in list(self._state.due(g, now, _DUE_SCAN_LIMIT)):
                any_due = True
                entry = self._state.entry(g, t, qid, offset)
                if entry is None or entry.state is not EntryState.INFLIGHT:
                    continue
                if entry.attempt >= info.spec.max_delivery_attempts:
                    try:
                        await self._move_to_dlq(g, t, qid, offset, entry)
                    except SluiceError as exc:
                        log.warning(
                            "could not dead-letter a message; will retry",
                            extra=kv(group=g, topic=t, queue=qid, offset=offset, error=exc.message),
                        )
            if any_due:
                self._hub.notify((group_key(g),))

    async def run_scanner(self, stop: asyncio.Event) -> None:
        interval = self._cfg.redelivery_scan_interval_ms / 1000.0
        while not stop.is_set():
            try:
                await self.scan_due()
            except Exception:
                log.exception("redelivery scan failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    # -- status ----------------------------------------------------------------------------------

    def group_queues(
        self, group: GroupInfo, topics: Sequence[str] = (), *, ready_bytes: bool = False
    ) -> list[GroupQueueStatus]:
        """Consumption status of every queue of every topic the group has consumed here, and of
        `topics` held here (a queue never consumed counts from the group's start position);
        `ready_bytes`: with the body bytes of the ready messages (readybytes.py)."""
        g = group.spec.name
        seen: dict[str, set[int]] = {t: set() for t in topics if t in self._meta.topics}
        for topic, qid in self._state.queue_keys(g):  # one scan of the group's cursors
            seen.setdefault(topic, set()).add(qid)
        out = []
        for topic in sorted(seen):
            spec = self._meta.topics.get(topic)
            if spec is None:
                held: list[int] = []
            else:  # a priority topic's messages are in its level queues (docs/priority.md)
                held = priority.pop_queues(spec) if priority.is_priority(spec) else list(range(spec.queue_count))
            queues = sorted(seen[topic] | set(held))
            for qid in queues:
                cursor = self.cursor(group, topic, qid)
                pending = self._state.first_pending_offset(g, topic, qid)
                consumed = cursor if pending is None else min(pending, cursor)
                high = self._store.queue_bounds(topic, qid)[1]
                due_at = self._state.due_offsets(g, topic, qid, self.clock.now_ms())
                due = len(due_at)
                size = self.ready_bytes.ready((g, topic, qid), consumed, cursor, high, due_at) if ready_bytes else 0
                out.append(GroupQueueStatus(topic, qid, consumed, high, max(0, high - consumed),
                                            self._state.inflight[(g, topic, qid)],
                                            self._state.retrying(g, topic, qid), max(0, high - cursor) + due,
                                            due, size))  # fmt: skip
        return out

    async def group_queues_with_bytes(self, group: GroupInfo, topics: Sequence[str] = ()) -> list[GroupQueueStatus]:
        """`group_queues` with `ready_bytes`: a queue whose body sizes are far behind is read in a
        worker thread first, then the whole status is taken again on the event loop."""
        for _ in range(_READY_BYTES_ROUNDS):
            try:
                return self.group_queues(group, topics, ready_bytes=True)
            except ReadBehind as behind:
                await self.ready_bytes.catch_up(behind)
        raise Unavailable(f"the ready bytes of group {group.spec.name} kept changing; try again")

    def reset(self, group: GroupInfo, topic: str, qid: int, offset: int) -> tuple[int, int]:
        """Consume a queue from `offset` (clamped to what is stored, tiered included): the group's
        entries of the queue are dropped. Returns (consumed offset before, offset now)."""
        g = group.spec.name
        cursor = self.cursor(group, topic, qid)
        pending = self._state.first_pending_offset(g, topic, qid)
        before = cursor if pending is None else min(pending, cursor)
        low, high = self._store.queue_bounds(topic, qid)
        floor = low if self._cold is None else self._cold.floor(topic, qid, low)
        target = max(floor, min(offset, high))
        self._state.reset_queue(g, topic, qid, target)
        self.levels.forget(g, topic)
        self._hub.notify((group_key(g),))  # long polls of the group look again
        return before, target

    # -- tiered storage: what a pop needs from the bucket ----------------------------------------

    async def _fetch_cold(self, group: GroupInfo, topic: str, queues: list[int], n: int) -> _Cold:
        """Fetch, off the event loop, the bucket messages the next `_pop_once` may deliver."""
        tier = self._cold
        assert tier is not None
        cold = _Cold()
        g = group.spec.name
        fetched = 0
        lows = {qid: self._store.queue_bounds(topic, qid)[0] for qid in queues}
        cold_queues = {qid for qid, low in lows.items() if tier.covers(topic, qid, 0, low)}
        if not cold_queues:
            return cold  # nothing of these queues is only in the bucket: the hot path costs no more
        for qid in queues:
            if fetched >= n:
                break
            low = lows[qid]
            cursor = self._state.cursor(g, topic, qid)
            if cursor is None:
                cursor = self.cursor(group, topic, qid)
                since = self._since_ms(group)
                newest = tier.newest_ms(topic, qid)
                if (
                    group.spec.consume_from.value != "earliest" and cursor == low and newest is not None
                    and since <= newest and tier.covers(topic, qid, 0, low)
                ):  # fmt: skip
                    try:  # the start time lies in the bucket
                        found = await tier.offset_for_timestamp(topic, qid, since)
                    except SluiceError as exc:
                        cold.error = cold.error or exc
                        cold.skip.add(qid)  # starting it from the local copy would skip tiered messages
                        continue
                    if found is not None:
                        cursor = cold.cursors[qid] = min(found, low)
            if not tier.covers(topic, qid, cursor, low):
                continue
            try:
                run = await tier.read(topic, qid, cursor, n)
            except SluiceError as exc:
                cold.error = cold.error or exc
                continue
            cold.runs[qid] = run
            fetched += len(run)
        wanted: list[tuple[int, int]] = []
        for _, t, qid, offset in list(self._state.due(g, self.clock.now_ms(), _DUE_SCAN_LIMIT)):
            if t == topic and qid in cold_queues and offset < lows[qid] and len(wanted) < n:
                wanted.append((qid, offset))
        if group.spec.fifo:
            for qid in cold_queues:
                for lane in self._state.fifo.get((g, topic, qid), {}).values():
                    if lane.waiting and len(wanted) < 2 * n:
                        wanted.append((qid, lane.waiting[0]))
        await self._fetch_exact(topic, wanted, cold)
        return cold

    async def _fetch_exact(self, topic: str, wanted: list[tuple[int, int]], cold: _Cold) -> None:
        """Fetch single messages below the local copy of their queue from the bucket into `cold`."""
        tier = self._cold
        if tier is None:
            return
        for qid, offset in wanted:
            low = self._store.queue_bounds(topic, qid)[0]
            if not tier.covers(topic, qid, offset, low, exact=True):
                continue
            try:
                rec = await tier.get(topic, qid, offset)
            except SluiceError as exc:
                cold.error = cold.error or exc
                continue
            cold.fetched.add((qid, offset))
            if rec is not None:
                cold.records[(qid, offset)] = rec
