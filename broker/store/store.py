"""`MessageStore`: the broker's durable store, seen from the rest of the broker.

Opening a store recovers it (recovery.py), then starts the writer thread (which also dispatches). Appends
are async (`append`) or blocking (`append_blocking`, for tools and child-process tests); both go
through the one writer. Reads, lookups and offsets are plain calls: they touch RocksDB and the page
cache for microseconds, so async callers may run them inline (see docs/storage-format.md for when
to move them to an executor).

Errors: bad input raises a typed `SluiceError` (unknown topic or queue, offset out of range, a
record that fails its checks); nothing a caller passes can corrupt the store.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
import operator
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import accumulate, islice
from pathlib import Path

from broker.store import keys as K
from broker.store.config import StoreConfig
from broker.store.deletion import deletion_record
from broker.store.dispatcher import DeletionListener, Dispatcher, DispatchListener
from broker.store.durability import LOCAL, Durability
from broker.store.index import CqEntry, Index
from broker.store.recovery import RecoveryReport, recover
from broker.store.retention import Retention
from broker.store.segments import SegmentSet
from broker.store.writer import (
    RUN_MIN,
    AppendResult,
    AppendResults,
    Columns,
    CommitLogWriter,
    Run,
    new_columns,
    new_result,
    span_of,
)
from broker.tags import tag_hash
from common.errors import BadRequest, IllegalOffset, MessageCorrupted, OffsetNotFound, StoreClosed
from common.logs import kv
from common.record import (
    CopiedRecords,
    MessageRecord,
    decode,
    placed,
    verify_copied,
)

log = logging.getLogger("sluice.store")

# An encoded append: buffer, record sizes, columns, and its one
# (topic, queue id) or None if several.
_Prepared = tuple[bytearray, list[int], Columns, tuple[str, int] | None]
_TOPIC, _TAG, _KEYS, _QUEUE_ID, _MESSAGE_ID = (
    operator.attrgetter(f) for f in ("topic", "tag", "keys", "queue_id", "message_id")
)  # fmt: skip


class ReadStatus(Enum):
    FOUND = "found"
    NO_NEW_MESSAGES = "no_new_messages"  # offset == end of queue
    OFFSET_TOO_SMALL = "offset_too_small"  # older messages were deleted; next_offset = oldest kept
    OFFSET_OVERFLOW = "offset_overflow"  # offset beyond the end of the queue
    NO_MATCH = "no_match"  # entries were scanned but none passed the filter


@dataclass(slots=True)
class ReadResult:
    status: ReadStatus
    messages: list[MessageRecord]
    next_offset: int  # where the next read should start
    min_offset: int
    max_offset: int  # one past the last dispatched entry


@dataclass
class StoreStats:
    commitlog_min: int
    commitlog_end: int
    written_position: int
    flushed_position: int
    dispatched_position: int
    dispatch_last_lag_ms: int
    dispatch_max_lag_ms: int
    segments: int
    index_bytes: int
    recovery: RecoveryReport | None = field(default=None)


@dataclass(slots=True)
class PreparedAppend:
    """Records encoded by `MessageStore.prepare`, waiting for `append_prepared`."""

    buf: bytearray
    sizes: list[int]
    columns: Columns
    queue: tuple[str, int] | None  # the one queue of every record, else None


class MessageStore:
    def __init__(
        self, data_dir: Path, config: StoreConfig, *, extra_cfs: Sequence[str] = (), durability: Durability = LOCAL
    ) -> None:
        """`durability`: what an append waits for before it is acknowledged (durability.py); a
        replicated primary passes its group's acknowledgement gate."""
        self.config = config
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.index = Index(data_dir / "index", cache_bytes=config.index_cache_bytes,
                           write_buffer_bytes=config.index_write_buffer_bytes, extra_cfs=extra_cfs)  # fmt: skip
        self.segments = SegmentSet(data_dir / "commitlog")
        try:
            self.recovery = recover(self.segments, self.index, config.recovery)
            if self.segments.active is None:
                self.segments.create(self.index.checkpoint() or 0)
        except BaseException:
            # A store that fails to open must not keep RocksDB's lock: the operator's next attempt
            # (e.g. with recovery.truncate_corrupt_tail) may run in this same process.
            self.segments.close()
            self.index.close()
            raise
        self.dispatcher = Dispatcher(self.index, self.segments.max_offset())
        self.writer = CommitLogWriter(
            config.commitlog,
            self.segments,
            next_offset_lookup=lambda topic, queue_id: self.queue_bounds(topic, queue_id)[1],
            on_written=self.dispatcher.dispatch,
            dispatched_position=lambda: self.dispatcher.position,
            failed=lambda: self.dispatcher.failed,
        )
        self.retention = Retention(self.segments, self.index, config.retention, data_dir)
        # Callables naming the oldest CommitLog position a broker feature still needs (None: none);
        # retention keeps every segment from there on (pending timers register one).
        self.retention_pins: list[Callable[[], int | None]] = []
        self.durability = durability
        self._replicated = durability.replicated  # False: appends skip the no-op waits
        self.index.recorder = durability.attach(self.index, lambda: self.writer.written_position)
        self._closed = False
        log.info(
            "store opened",
            extra=kv(
                data_dir=str(data_dir),
                segments=len(self.segments.all()),
                end=self.segments.max_offset(),
                flush=config.commitlog.flush_policy,
            ),
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        self.segments.close()
        self.index.close()
        log.info("store closed", extra=kv(data_dir=str(self.data_dir)))

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """`listener(queues)` runs after each round's dispatch with the (topic, queue) set, on the thread
        that wrote the round (the writer's, or the event loop's for small appends): it must be thread-safe."""
        self.dispatcher.add_listener(listener)

    def add_deletion_listener(self, listener: DeletionListener) -> None:
        """`listener(deletion)` runs after the dispatch of each topic deletion record this process
        appends or copies (not those recovery re-dispatches as the store opens), where dispatch runs:
        it must be thread-safe."""
        self.dispatcher.add_deletion_listener(listener)

    # -- appends ---------------------------------------------------------------------------------

    def _prepare(self, records: Sequence[MessageRecord]) -> _Prepared:
        """The append's buffer (`placed`: a send's records as its edge encoded them, records the
        broker made encoded there), sizes, index columns, and its one (topic, queue id) or None."""
        if self._closed:
            raise StoreClosed("the store is closed")
        if not records:
            raise BadRequest("nothing to append")
        buf, sizes = placed(records, self.config.commitlog.max_record_bytes)
        first = records[0]
        if len(records) == 1:
            columns = new_columns(([first.topic], [first.queue_id], [tag_hash(first.tag)],
                                   [first.message_id.encode()], [first.keys]))  # fmt: skip
            return buf, sizes, columns, (first.topic, first.queue_id)
        n = len(records)
        topics, queues, tags = list(map(_TOPIC, records)), list(map(_QUEUE_ID, records)), list(map(_TAG, records))
        one_queue = topics.count(first.topic) == n and queues.count(first.queue_id) == n
        tag_hashes = [tag_hash(first.tag)] * n if tags.count(first.tag) == n else list(map(tag_hash, tags))
        mids = list(map(str.encode, map(_MESSAGE_ID, records)))
        columns = new_columns((topics, queues, tag_hashes, mids, list(map(_KEYS, records))))
        return buf, sizes, columns, (first.topic, first.queue_id) if one_queue else None

    async def append(self, records: Sequence[MessageRecord]) -> Sequence[AppendResult]:
        """Append records (any topics and queues) durably per the flush policy; results in order."""
        buf, sizes, columns, queue = self._prepare(records)
        if self._replicated:
            self.durability.admit()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Sequence[AppendResult]] = loop.create_future()
        self.writer.submit(buf, sizes, columns, queue, (loop, fut))
        results = await fut
        if self._replicated:
            await self.durability.wait(_end_of(results))
        return results

    def prepare(self, records: Sequence[MessageRecord]) -> PreparedAppend:
        """Encode records for `append_prepared` (any thread): lets a caller encode ahead of time,
        off the event loop, and append later (the timer scheduler prepares the next tick's copies)."""
        return PreparedAppend(*self._prepare(records))

    async def append_prepared(self, prepared: PreparedAppend) -> Sequence[AppendResult]:
        """Append records encoded by `prepare` (once: the writer seals the buffers in place)."""
        if self._replicated:
            self.durability.admit()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Sequence[AppendResult]] = loop.create_future()
        self.writer.submit(prepared.buf, prepared.sizes, prepared.columns, prepared.queue, (loop, fut))
        results = await fut
        if self._replicated:
            await self.durability.wait(_end_of(results))
        return results

    async def delete_topic(self, topic: str) -> AppendResult:
        """Append the record that deletes `topic` (deletion.py) and return once it is dispatched and
        durable like any append: every queue of the topic then ends where it ended, holds nothing
        and goes on from there. Where the record landed (its position is `deleted_at(topic)`).

        Always written by the writer thread, never inline on the event loop: dispatching it reads
        and deletes every queue of the topic (a bind topic may have many lite topics)."""
        buf, sizes, columns, queue = self._prepare([deletion_record(topic)])
        if self._replicated:
            self.durability.admit()
        fut: concurrent.futures.Future[Sequence[AppendResult]] = concurrent.futures.Future()
        self.writer.submit(buf, sizes, columns, queue, fut)
        (result,) = await asyncio.wrap_future(fut)
        if self._replicated:
            await self.durability.wait(result.physical_offset + result.size)
        return result

    def append_blocking(self, records: Sequence[MessageRecord], timeout_s: float = 30.0) -> Sequence[AppendResult]:
        buf, sizes, columns, queue = self._prepare(records)
        fut: concurrent.futures.Future[Sequence[AppendResult]] = concurrent.futures.Future()
        self.writer.submit(buf, sizes, columns, queue, fut)
        return fut.result(timeout_s)

    def append_copy(
        self, segment_base: int, position: int, data: bytes | bytearray | memoryview
    ) -> asyncio.Future[object]:
        """Append whole records copied from a primary at the same offsets (a replica's only way to
        write; docs/replication.md); the returned future is done once they are written and
        dispatched. Each record is verified (magic, size, CRC, its own position) before anything
        is written; bad data raises MessageCorrupted and writes nothing. Copies are written in the
        order they were handed over, so a replica keeps several in flight (Replica._copy)."""
        if self._closed:
            raise StoreClosed("the store is closed")
        runs = copied_runs(data, segment_base, position)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        self.writer.submit_copy(segment_base, position, data, runs, (loop, fut))
        return fut

    def wait_dispatched(self, timeout_s: float = 10.0) -> bool:
        """Block until everything written so far is visible to readers."""
        return self.dispatcher.wait_for(self.writer.written_position, timeout_s)

    # -- reads -----------------------------------------------------------------------------------

    def note_empty_queues(self, topic: str, queue_ids: Iterable[int]) -> None:
        """Queues of `topic` just created, that hold no record and never held one (a new lite
        topic's): their first append skips the index lookup of where they end (writer.note_empty)."""
        self.writer.note_empty(topic, queue_ids)

    def deleted_at(self, topic: str) -> int:
        """The CommitLog position of the topic's last deletion (-1 if none): a record of the topic
        stored before it (a message, its pending timer or half message) is of the deleted topic."""
        return self.index.deleted_at(topic)

    def incarnation_floor(self, topic: str, queue_id: int) -> int:
        """The queue's first offset since its topic was last deleted (0 if never): an offset below
        it names a message of the deleted topic."""
        tid = self.index.topic_id(topic)
        return 0 if tid is None else self.index.incarnation_floor(tid, queue_id)

    def incarnation_floors(self, topic: str) -> dict[int, int]:
        """`incarnation_floor` of every queue of the topic that held messages when it was deleted."""
        tid = self.index.topic_id(topic)
        return {} if tid is None else self.index.incarnation_floors(tid)

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue; max is one past the last visible message."""
        tid = self.index.topic_id(topic)
        return (0, 0) if tid is None else self.index.queue_bounds(tid, queue_id)

    def acked_end(self, topic: str, queue_id: int) -> int:
        """One past the newest message of a queue that can never change: without replication the
        queue's end; on a replicated primary, the end of the messages every in-sync member holds (a
        binary search of the ConsumeQueue by CommitLog position, which grows with the offset)."""
        tid = self.index.topic_id(topic)
        if tid is None:
            return 0
        low, high = self.index.queue_bounds(tid, queue_id)
        position = self.durability.acked_position()
        if position is None or high <= low:
            return high

        def held(n: int) -> bool:  # the message at offset n - 1 is held by every in-sync member
            entry = self.index.cq_entry(tid, queue_id, n - 1)
            return entry is not None and entry.physical_offset + entry.size <= position

        lo, hi = low, high  # the answer is in [lo, hi]; lo is held (or the floor)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if held(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def queue_bytes_estimate(self, topic: str, queue_id: int) -> int:
        """Bytes of a queue's local messages, estimated as their count times the mean record size
        of the queue's newest ConsumeQueue block (one seek, whatever the queue holds)."""
        tid = self.index.topic_id(topic)
        if tid is None:
            return 0
        low, high = self.index.queue_bounds(tid, queue_id)
        if high <= low:
            return 0
        block = self.index.cq_block(tid, queue_id, high - 1)
        if block is None:
            return 0
        sizes = [size for _, size, _, _ in K.CQ_VALUE.iter_unpack(block[1])]
        return (high - low) * sum(sizes) // len(sizes)

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        max_bytes: int | None = None,
        tag_hashes: frozenset[int] | None = None,
    ) -> ReadResult:
        """Up to `max_messages` visible messages of a queue from `offset`, optionally by tag hash."""
        if offset < 0:
            raise IllegalOffset(f"offset {offset} is negative")
        if max_messages <= 0:
            raise BadRequest(f"max messages must be positive, got {max_messages}")
        budget = min(max_bytes or self.config.read.max_batch_bytes, self.config.read.max_batch_bytes)
        tid = self.index.topic_id(topic)
        low, high = (0, 0) if tid is None else self.index.queue_bounds(tid, queue_id)
        if offset < low:
            return ReadResult(ReadStatus.OFFSET_TOO_SMALL, [], low, low, high)
        if offset == high:
            return ReadResult(ReadStatus.NO_NEW_MESSAGES, [], offset, low, high)
        if offset > high:
            return ReadResult(ReadStatus.OFFSET_OVERFLOW, [], high, low, high)
        assert tid is not None
        picked: list[CqEntry] = []
        used = 0
        next_offset = offset
        for scanned, entry in enumerate(self.index.cq_entries(tid, queue_id, offset), start=1):
            next_offset = entry.queue_offset + 1
            if tag_hashes is None or entry.tag_hash in tag_hashes:
                if picked and used + entry.size > budget:
                    next_offset = entry.queue_offset
                    break
                picked.append(entry)
                used += entry.size
                if len(picked) >= max_messages:
                    break
            if scanned >= self.config.read.max_scan_entries:
                break
        messages = self.load_entries(picked)
        status = ReadStatus.FOUND if messages else ReadStatus.NO_MATCH
        return ReadResult(status, messages, next_offset, low, high)

    def _load(self, physical_offset: int, size: int) -> MessageRecord:
        data = self.segments.read(physical_offset, size)
        return decode(data, 0, where=f"commitlog position {physical_offset}")

    def load_entries(self, entries: list[CqEntry]) -> list[MessageRecord]:
        """The records of index entries, in order. Entries in ascending order in one segment, at most
        `read.coalesce_gap_bytes` apart, are read with one pread: a batch sent to one queue is
        stored contiguously, so a pop of 32 messages costs one system call instead of 32, and the
        heads of lite topics written about the same time (sorted by position) nearly so."""
        out: list[MessageRecord] = []
        i, n = 0, len(entries)
        while i < n:
            first = entries[i]
            start = first.physical_offset
            end = start + first.size
            j = i + 1
            gap = self.config.read.coalesce_gap_bytes
            if j < n and end <= entries[j].physical_offset <= end + gap:
                seg_end = self.segments.find(start).end  # a run never crosses into the next segment
                while j < n and end <= entries[j].physical_offset <= end + gap:
                    next_end = entries[j].physical_offset + entries[j].size
                    if next_end > seg_end:
                        break
                    end = next_end
                    j += 1
            if j == i + 1:
                out.append(self._load(start, first.size))
            else:
                data = self.segments.read(start, end - start)
                for e in entries[i:j]:
                    out.append(decode(data, e.physical_offset - start, where=f"commitlog position {e.physical_offset}"))
            i = j
        return out

    def read_at(self, physical_offset: int, size: int) -> MessageRecord:
        """The record at a CommitLog position (as found in an index entry)."""
        return self._load(physical_offset, size)

    def get(self, topic: str, queue_id: int, queue_offset: int) -> MessageRecord:
        tid = self.index.topic_id(topic)
        entry = None if tid is None else self.index.cq_entry(tid, queue_id, queue_offset)
        if entry is None:
            raise OffsetNotFound(f"no message at offset {queue_offset} of {topic}/{queue_id}")
        return self._load(entry.physical_offset, entry.size)

    def find_by_id(self, message_id: str, topic: str | None = None) -> list[MessageRecord]:
        """The stored records with this id (of `topic`), oldest first; none of a deleted topic."""
        out = []
        deleted_at = self.index.deleted_at
        for phys, size in self.index.find_by_id(self.segments.bases(), message_id):
            try:
                rec = self._load(phys, size)
            except (OffsetNotFound, MessageCorrupted):
                continue  # deleted by retention between the lookup and the read
            if (topic is None or rec.topic == topic) and phys > deleted_at(rec.topic):
                out.append(rec)
        return out

    def find_by_key(self, topic: str, key: str, limit: int = 64) -> list[MessageRecord]:
        tid = self.index.topic_id(topic)
        if tid is None:
            return []
        out = []
        for phys, size in self.index.find_by_key(self.segments.bases(), tid, key, limit, self.index.deleted_at(topic)):
            try:
                out.append(self._load(phys, size))
            except (OffsetNotFound, MessageCorrupted):
                continue
        return out

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset whose store time is >= timestamp (the queue's end if none is)."""
        tid = self.index.topic_id(topic)
        if tid is None:
            return 0
        lo, hi = self.index.queue_bounds(tid, queue_id)
        # Binary search over ConsumeQueue blocks, then inside the block found (store times only
        # rise along a queue): entries below `lo` are older than `timestamp_ms`, from `hi` not.
        while lo < hi:
            mid = (lo + hi) // 2
            block = self.index.cq_block(tid, queue_id, mid)
            if block is None:  # a hole left by a concurrent retention run: search above it
                lo = mid + 1
                continue
            first, value = block
            a, b = max(first, lo), min(first + len(value) // K.CQ_ENTRY, hi)
            stamps = [e[3] for e in islice(K.CQ_VALUE.iter_unpack(value), a - first, b - first)]
            i = a + bisect.bisect_left(stamps, timestamp_ms)
            if i > a:
                lo = i
            if i < b:
                hi = i
        return lo

    # -- consumer offsets ------------------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset < 0:
            raise IllegalOffset(f"offset {offset} is negative")
        tid = self.index.topic_id(topic)
        if tid is None:
            raise OffsetNotFound(f"topic {topic} has no messages on this broker")
        self.index.put_offset(group, tid, queue_id, offset)

    def compact_queues(self, topic: str) -> None:
        """Compact the topic's ConsumeQueue range (blocking): after a deletion, so that reads of the
        queues' next messages do not step over the range deletes' tombstones until RocksDB gets to it."""
        tid = self.index.topic_id(topic)
        if tid is not None:
            self.index.cf(K.CF_CQ).compact_range(K.queue_prefix(tid, 0), K.queue_prefix(tid + 1, 0))

    def drop_offsets(self, topic: str) -> int:
        """Forget the offsets groups committed in a (deleted) topic (blocking: scans every committed
        offset). How many groups had some."""
        tid = self.index.topic_id(topic)
        return 0 if tid is None else self.index.drop_offsets(tid)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        tid = self.index.topic_id(topic)
        return None if tid is None else self.index.get_offset(group, tid, queue_id)

    # -- housekeeping ----------------------------------------------------------------------------

    def run_retention(self, now_s: float) -> int:
        """Apply retention once at `now_s` (epoch seconds: the owner's clock, common/clock.py); returns
        the number of segments deleted."""
        keep_from = self.dispatcher.position
        for pin in self.retention_pins:
            position = pin()
            if position is not None:
                keep_from = min(keep_from, position)
        deleted = self.retention.run(keep_from, now_s)
        if deleted:
            self.index.forget_deletions_before(self.segments.min_offset())
        return deleted

    def stats(self) -> StoreStats:
        return StoreStats(
            commitlog_min=self.segments.min_offset(),
            commitlog_end=self.segments.max_offset(),
            written_position=self.writer.written_position,
            flushed_position=self.writer.flushed_position,
            dispatched_position=self.dispatcher.position,
            dispatch_last_lag_ms=self.dispatcher.last_lag_ms,
            dispatch_max_lag_ms=self.dispatcher.max_lag_ms,
            segments=len(self.segments.all()),
            index_bytes=self.index.size_bytes(),
            recovery=self.recovery,
        )

    def disk_usage(self) -> tuple[int, int]:
        """(used bytes, total bytes) of the filesystem holding the data directory."""
        usage = shutil.disk_usage(self.data_dir)
        return usage.used, usage.total


def _end_of(results: Sequence[AppendResult]) -> int:
    """Where the last record of an append ends in the CommitLog (appends are contiguous)."""
    return span_of(results)[1]


def copied_runs(data: bytes | bytearray | memoryview, segment_base: int, position: int) -> list[Run]:
    """Verify the records of `data` (whole records meant for `segment_base + position`) and
    describe them for the dispatcher: a one-queue run (indexed with C-level maps) for every
    stretch of at least RUN_MIN records of one queue with consecutive offsets and one store time
    (a primary's append), the records in between as mixed runs."""
    if not data:
        raise BadRequest("no records to copy")
    got = verify_copied(data, segment_base + position)
    topics, qids, qoffs, stamps = got.topics, got.queue_ids, got.queue_offsets, got.store_timestamps_ms
    sizes = got.sizes
    hashes = list(map(tag_hash, got.tags))
    physs = list(accumulate(sizes[:-1], initial=segment_base + position))
    runs: list[Run] = []
    n, start, mixed_from = len(sizes), 0, 0
    while start < n:
        end = start + 1
        topic, qid, stamp = topics[start], qids[start], stamps[start]
        while (end < n and qids[end] == qid and qoffs[end] == qoffs[end - 1] + 1 and stamps[end] == stamp
               and topics[end] == topic):  # fmt: skip
            end += 1
        if end - start >= RUN_MIN:
            if mixed_from < start:
                runs.append(_mixed_run(got, hashes, physs, mixed_from, start, segment_base))
            results = AppendResults(range(qoffs[start], qoffs[end - 1] + 1), physs[start:end], sizes[start:end], stamp)
            runs.append(Run(_columns(got, hashes, start, end), results, (topic, qid), segment_base))
            mixed_from = end
        start = end
    if mixed_from < n:
        runs.append(_mixed_run(got, hashes, physs, mixed_from, n, segment_base))
    return runs


def _columns(got: CopiedRecords, hashes: list[int], start: int, end: int) -> Columns:
    """The index columns of copied records `start:end`."""
    return new_columns((got.topics[start:end], got.queue_ids[start:end], hashes[start:end],
                        got.message_ids[start:end], got.keys[start:end]))  # fmt: skip


def _mixed_run(got: CopiedRecords, hashes: list[int], physs: list[int], start: int, end: int, base: int) -> Run:
    rows = zip(got.queue_offsets[start:end], physs[start:end], got.sizes[start:end],
               got.store_timestamps_ms[start:end], strict=True)  # fmt: skip
    return Run(_columns(got, hashes, start, end), list(map(new_result, rows)), None, base)


__all__ = ["MessageStore", "ReadResult", "ReadStatus", "StoreStats"]
