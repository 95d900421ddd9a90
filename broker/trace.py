"""Message trace: the broker records the life of every message and answers "what happened to id X".

Recording is cheap on the hot path: a send appends one tuple per append (the offset range it took,
not one per message), a pop one per call (its deliveries) and an ack request one (its positions),
unrolled into one event per message only by the flushing thread; dead-lettering and the rarer
events one each; all to an in-memory list, on the event loop's thread. The `run` task swaps
the list out every `flush_interval_ms` and writes it with one RocksDB WriteBatch in an executor
thread (byte layout: broker/tracekeys.py). The list is bounded (`max_pending_events`); beyond it
events are dropped and counted (`sluice_trace_events_dropped_total`), never blocking a send.

Durability: the trace is diagnostic, not acknowledged state. Events of the last flush interval are
lost on SIGKILL; everything flushed survives restarts. Retention: every `expire_interval_s`, the
buckets older than `max_age_s` are removed with range deletions.

Thread rules: `sent`/`delivered`/... and `run` on the event loop's thread; `flush`, `expire` and
`lookup` block on RocksDB and run in an executor (or in tests, directly).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from typing import Any

import rocksdict

from broker import tracekeys as K
from broker.client.api import TraceEvent, TraceKind
from broker.config import TraceConfig
from common import metrics
from common.clock import SYSTEM_CLOCK, Clock
from common.logs import kv

log = logging.getLogger("sluice.broker.trace")
_APPEND = -1  # the queue of a pending `sent` event of an append to several queues: keyed by its CommitLog range
_drain: Callable[[Iterable[object]], None] = collections.deque[object](maxlen=0).extend  # consume an iterator in C

CF_TRACE = "trace"
TRACE_CFS = (CF_TRACE,)
# Events per RocksDB WriteBatch of a flush. On a replicated primary each batch is one state change
# sent to the replicas as one frame (docs/replication.md); a full pending list (max_pending_events)
# in one batch could exceed a frame (4 MiB by default). 5,000 events are at most about 1 MiB (the
# JSON ones are the largest, ~200 bytes with their key).
FLUSH_BATCH_EVENTS = 5_000

# A pending event: (kind, time_ms, topic, queue, offset, fields) — encoded only when flushed, its
# fields as a JSON document.
_Pending = tuple[TraceKind, int, str, int, int, "dict[str, Any]"]
# The deliveries of one pop or the acks of one request, kept as one item until flushed: (kind,
# time_ms, topic, group, positions), a position being (queue, offset, attempt) for deliveries and
# (queue, offset) for acks. One tuple per call on the event loop instead of one per message.
_Run = tuple[TraceKind, int, str, str, "list[tuple[Any, ...]]"]


class TraceRecorder:
    def __init__(
        self, broker: str, config: TraceConfig, cf: rocksdict.Rdict, handle: rocksdict.ColumnFamily,
        new_batch: Callable[[], rocksdict.WriteBatch], write: Callable[[rocksdict.WriteBatch], object],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:  # fmt: skip
        """`clock`: event times and the age of buckets are read on it (common/clock.py)."""
        self.broker = broker
        self._clock = clock
        self._cfg = config
        self._cf = cf
        self._handle = handle
        self._new_batch = new_batch
        self._write = write
        self._pending: list[_Pending | _Run] = []
        self._count = 0  # events in _pending (a run holds several)
        self._seq = itertools.count()
        self._bucket_ms = max(1, int(config.bucket_s * 1000))
        self._dropped = metrics.TRACE_EVENTS_DROPPED.labels(broker)
        self.enabled = config.enabled

    # -- recording (event loop thread) ------------------------------------------------------------

    def _add(self, event: _Pending) -> None:
        if self._count >= self._cfg.max_pending_events:
            self._dropped.inc()
            return
        self._pending.append(event)
        self._count += 1

    def sent(self, topic: str, queue_id: int, start: int, end: int, client_id: str, born_host: str) -> None:
        """One append stored offsets [start, end) of a queue for a producer."""
        if self.enabled and end > start:
            self._add((TraceKind.SENT, self._clock.now_ms(), topic, queue_id, end,
                       {"start": start, "end": end, "client": client_id, "host": born_host}))  # fmt: skip

    def sent_append(self, topic: str, start: int, end: int, client_id: str, born_host: str) -> None:
        """One append whose messages went to queues of their own (lite topics, priority levels) took
        CommitLog positions [start, end) for a producer: one event for the append, however many
        queues."""
        if self.enabled and end > start:
            fields = {"start_position": start, "end_position": end, "client": client_id, "host": born_host}
            self._add((TraceKind.SENT, self._clock.now_ms(), topic, _APPEND, end, fields))

    def delivered(self, topic: str, queue_id: int, offset: int, group: str, attempt: int) -> None:
        self.delivered_many(topic, group, [(queue_id, offset, attempt)])

    def acked(self, topic: str, queue_id: int, offset: int, group: str) -> None:
        self.acked_many(topic, group, [(queue_id, offset)])

    def delivered_many(self, topic: str, group: str, deliveries: list[tuple[int, ...]]) -> None:
        """`delivered` for every (queue, offset, attempt) of one pop, kept as one pending item."""
        if self.enabled and deliveries:
            self._add_run((TraceKind.DELIVERED, self._clock.now_ms(), topic, group, deliveries))

    def acked_many(self, topic: str, group: str, positions: list[tuple[int, ...]]) -> None:
        """`acked` for every (queue, offset) of one ack request, kept as one pending item."""
        if self.enabled and positions:
            self._add_run((TraceKind.ACKED, self._clock.now_ms(), topic, group, positions))

    def _add_run(self, run: _Run) -> None:
        n = len(run[4])
        room = self._cfg.max_pending_events - self._count
        if room < n:
            self._dropped.inc(n - max(0, room))
            if room <= 0:
                return
            kind, t, topic, group, positions = run
            run = (kind, t, topic, group, positions[:room])
            n = room
        self._pending.append(run)
        self._count += n

    def invisible(self, topic: str, queue_id: int, offset: int, group: str, attempt: int, invisible_ms: int) -> None:
        if self.enabled:
            self._add((TraceKind.INVISIBLE, self._clock.now_ms(), topic, queue_id, offset,
                       {"group": group, "attempt": attempt, "invisible_ms": invisible_ms}))  # fmt: skip

    def dead_lettered(
        self, topic: str, queue_id: int, offset: int, message_id: str, group: str, attempts: int, dlq: str,
        dlq_offset: int,
    ) -> None:  # fmt: skip
        if self.enabled:
            self._add((TraceKind.DEAD_LETTERED, self._clock.now_ms(), topic, queue_id, offset,
                       {"id": message_id, "group": group, "attempt": attempts, "dlq_topic": dlq,
                        "dlq_offset": dlq_offset}))  # fmt: skip

    def tiered(self, topic: str, queue_id: int, start: int, end: int, object_key: str) -> None:
        """Offsets [start, end) of a queue were uploaded to the tier as `object_key` (tiering calls this)."""
        if self.enabled and end > start:
            self._add((TraceKind.TIERED, self._clock.now_ms(), topic, queue_id, end,
                       {"start": start, "end": end, "object": object_key}))  # fmt: skip

    @property
    def pending(self) -> int:
        return self._count

    # -- writing (executor) -----------------------------------------------------------------------

    def take(self) -> list[_Pending | _Run]:
        """Swap out the pending events (event loop thread); `flush` writes them."""
        events, self._pending, self._count = self._pending, [], 0
        return events

    def flush(self, items: list[_Pending | _Run]) -> None:
        if not items:
            return
        batch = self._new_batch()
        put, cf = batch.put, self._handle
        prefixes: dict[tuple[int, str], bytes] = {}
        # Each batch is one state change on a replicated primary (one frame to the replicas): at
        # most FLUSH_BATCH_EVENTS events; a longer run is cut into parts.
        events = 0
        for item in _split_runs(items, FLUSH_BATCH_EVENTS):
            size = len(item[4]) if len(item) == 5 else 1
            if events and events + size > FLUSH_BATCH_EVENTS:
                self._write(batch)
                batch = self._new_batch()
                put = batch.put
                events = 0
            events += size
            if len(item) == 5:
                self._put_run(put, item, prefixes)
                continue
            kind, t, topic, qid, offset, fields = item
            bucket = t // self._bucket_ms
            seq = next(self._seq) & K.U32_MAX
            if kind is TraceKind.SENT and qid == _APPEND:
                key = K.append_key(bucket, topic, offset, seq)
            elif kind is TraceKind.SENT:
                key = K.range_key(K.KIND_SENT, bucket, topic, qid, offset, seq)
            elif kind is TraceKind.TIERED:
                key = K.range_key(K.KIND_TIERED, bucket, topic, qid, offset, seq)
            else:
                key = K.position_key(bucket, topic, qid, offset, t, seq)
            put(key, K.encode_value({"k": kind.value, "t": t, **fields}), cf)
        self._write(batch)

    def _put_run(self, put: Callable[..., None], run: _Run, prefixes: dict[tuple[int, str], bytes]) -> None:
        """Put the compact position events of one run (a pop's deliveries, an ack request's acks)
        with C-level maps: one key per message, one value per distinct attempt."""
        kind, t, topic, group, positions = run
        bucket = t // self._bucket_ms
        prefix = prefixes.get((bucket, topic))
        if prefix is None:
            prefix = prefixes[(bucket, topic)] = K.topic_prefix(bucket, topic)
        n = len(positions)
        columns = list(zip(*positions, strict=True))
        qids, offsets = columns[0], columns[1]
        attempts: Iterable[int] = columns[2] if kind is TraceKind.DELIVERED else repeat(0, n)
        raw_group = group.encode("utf-8")
        values: dict[int, bytes] = {}

        def value_of(attempt: int) -> bytes:
            value = values.get(attempt)
            if value is None:
                value = values[attempt] = K.encode_compact(kind.value, attempt, raw_group)
            return value

        seqs = map(K.U32_MAX.__and__, itertools.islice(self._seq, n))
        keys = K.position_keys_after(prefix, qids, offsets, t, seqs)
        _drain(map(put, keys, map(value_of, attempts), repeat(self._handle)))

    def expire(self, now: int | None = None) -> None:
        """Delete every bucket older than max_age_s."""
        cutoff = ((self._clock.now_ms() if now is None else now) - int(self._cfg.max_age_s * 1000)) // self._bucket_ms
        if cutoff <= 0:
            return
        batch = self._new_batch()
        for kind in K.KINDS:
            batch.delete_range(K.bucket_prefix(kind, 0), K.bucket_prefix(kind, cutoff), self._handle)
        self._write(batch)

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every flush_interval_ms and expire old buckets until `stop`; flushes once more at the end."""
        loop = asyncio.get_running_loop()
        interval = self._cfg.flush_interval_ms / 1000.0
        next_expiry = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            try:
                await loop.run_in_executor(None, self.flush, self.take())
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + self._cfg.expire_interval_s
                    await loop.run_in_executor(None, self.expire)
            except Exception as exc:  # RocksDB failure: the trace is best effort, the broker keeps serving
                log.warning("could not write message trace events", extra=kv(error=str(exc)))
            if stop.is_set():
                return

    # -- lookup (executor) ------------------------------------------------------------------------

    def _buckets(self) -> range:
        now = self._clock.now_ms()
        first = max(0, (now - int(self._cfg.max_age_s * 1000)) // self._bucket_ms)
        return range(first, now // self._bucket_ms + 2)  # +2: clocks of other writers a little ahead

    def _scan(self, prefix: bytes) -> list[dict[str, Any]]:
        out = []
        it = self._cf.iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            with contextlib.suppress(ValueError):
                out.append(K.decode_value(it.value(), K.position_time(it.key())))
            it.next()
        return out

    def position_events(
        self, topic: str, queue_id: int, offset: int, message_id: str, position: int | None = None
    ) -> list[TraceEvent]:
        """Every event of the message stored at (topic, queue, offset), whose CommitLog position
        is `position` if known: sent, consumption, tiered."""
        out = []
        for bucket in self._buckets():
            out.extend(self._in_range(K.KIND_SENT, bucket, topic, queue_id, offset, message_id))
            if position is not None:
                out.extend(self._in_append(bucket, topic, queue_id, offset, position, message_id))
            for doc in self._scan(K.position_prefix(bucket, topic, queue_id, offset)):
                doc.setdefault("id", message_id)
                out.append(_event(doc, topic, queue_id, offset))
            out.extend(self._in_range(K.KIND_TIERED, bucket, topic, queue_id, offset, message_id))
        return out

    def _in_range(
        self, kind: bytes, bucket: int, topic: str, queue_id: int, offset: int, message_id: str
    ) -> list[TraceEvent]:
        """The range event (sent batch, tiered segment) of one bucket that holds `offset`, if any."""
        doc = self._covering(K.range_queue_prefix(kind, bucket, topic, queue_id), offset, "start", "end")
        return [] if doc is None else [_event({**doc, "id": message_id}, topic, queue_id, offset)]

    def _in_append(
        self, bucket: int, topic: str, queue_id: int, offset: int, position: int, message_id: str
    ) -> list[TraceEvent]:
        """The `sent` event of one bucket's append whose CommitLog range holds `position`, if any."""
        doc = self._covering(K.append_prefix(bucket, topic), position, "start_position", "end_position")
        return [] if doc is None else [_event({**doc, "id": message_id}, topic, queue_id, offset)]

    def _covering(self, prefix: bytes, value: int, low: str, high: str) -> dict[str, Any] | None:
        """The document of the first range event under `prefix` (keyed by where it ends) that ends
        after `value`, if it also starts at or before it: `doc[low] <= value < doc[high]`."""
        it = self._cf.iter()
        it.seek(K.range_seek(prefix, value))
        if not it.valid() or not it.key().startswith(prefix):
            return None
        doc: dict[str, Any] = K.decode_value(it.value())
        return doc if doc[low] <= value < doc[high] else None


_DETAIL_FIELDS = ("host", "source", "invisible_ms", "dlq_topic", "dlq_offset", "object", "start", "end")


def _event(doc: dict[str, Any], topic: str, queue_id: int, offset: int) -> TraceEvent:
    detail: dict[str, str] = {k: str(doc[k]) for k in _DETAIL_FIELDS if k in doc}
    return TraceEvent(
        kind=TraceKind(doc["k"]), time_ms=int(doc["t"]), topic=topic, queue_id=queue_id, queue_offset=offset,
        message_id=str(doc.get("id", "")), group=str(doc.get("group", "")), attempt=int(doc.get("attempt", 0)),
        client_id=str(doc.get("client", "")), detail=detail,
    )  # fmt: skip


def _split_runs(items: list[_Pending | _Run], limit: int) -> Iterator[_Pending | _Run]:
    """`items`, each run of more than `limit` events cut into runs of at most `limit`."""
    for item in items:
        if len(item) == 5 and len(item[4]) > limit:
            kind, t, topic, group, positions = item
            for i in range(0, len(positions), limit):
                yield kind, t, topic, group, positions[i : i + limit]
        else:
            yield item
