"""The CommitLog writer: group-commits appends to the active segment, one round at a time.

Callers hand over already encoded records, one buffer per append (`record.placed`); the
writer drains everything that queued up while it was busy, assigns queue offsets and physical
offsets in one place, seals the records in place (offsets + CRC), writes the round with one
`pwritev` of those buffers (no copy), and under the `sync` policy makes it durable with one
`fdatasync` before any caller of the round is acknowledged. Under `async`, callers are acknowledged
after the write and a flusher thread fsyncs every `flush_interval_ms`. Under `async`, small
appends made on an event loop skip the thread: the loop writes them itself, one round per loop
iteration (`_inline_round`; docs/storage-format.md), under the same one-round-at-a-time lock.

Cost: everything here runs under the GIL, so Python work per record bounds the store's throughput.
Every record is sealed by `record.seal_at`. An append whose records all go to one queue and fit in
the active segment (the common case: a batched send, or a single message) is sealed in one loop
and, from `RUN_MIN` records on, keeps its results as columns (`AppendResults`) and is a run of its
own for the dispatcher; so is an append to several queues that fits (a lite or priority send: each
record takes its own queue's next offset). Only an append the segment rolls inside takes the
record-by-record path. The dispatcher gets the round as `Run`s (one per large append and segment;
small appends share one), not one object per record.

Invariants: physical offsets are contiguous and increasing; queue offsets are strictly
increasing per queue; a round that fails to write is rolled back (file truncated, queue offsets
restored) and every caller of the round gets the error, so no caller is acknowledged for bytes that
are not in the file.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count, repeat
from typing import NamedTuple, overload

from broker.store.config import CommitLogConfig
from broker.store.segments import Segment, SegmentSet
from common.errors import BadRequest, StoreClosed, TooManyRequests, Unavailable
from common.logs import kv
from common.metrics import observe_flush
from common.record import seal_at

log = logging.getLogger("sluice.store.writer")


# Per-record carriers are NamedTuples: built once per message on the hot path, and a frozen
# dataclass costs several times more to construct.


class RecordMeta(NamedTuple):
    """What the dispatcher needs to know about a record recovery found (appends use `Columns`)."""

    topic: str
    queue_id: int
    tag_hash: int
    message_id: bytes
    keys: tuple[str, ...]


class AppendResult(NamedTuple):
    queue_offset: int
    physical_offset: int
    size: int
    store_timestamp_ms: int


class AppendResults(Sequence[AppendResult]):
    """The results of an append sealed as one run, kept as the writer's columns: an `AppendResult`
    is built only when one is read. Building one object per record on the writer thread cost ~0.18
    us per message of GIL time (store_bench), though callers mostly want the offsets
    (`queue_offsets`) or nothing, and the dispatcher takes the columns as they are. One store time
    for all; the queue offsets are a range for an append to one queue (consecutive offsets), a list
    for one to several queues (a lite or priority send: one queue per message, or per level)."""

    __slots__ = ("physical_offsets", "queue_offsets", "sizes", "store_timestamp_ms")

    def __init__(self, queue_offsets: range | list[int], physical_offsets: list[int], sizes: list[int],
                 store_timestamp_ms: int):  # fmt: skip
        assert len(queue_offsets) == len(physical_offsets) == len(sizes)
        self.queue_offsets = queue_offsets
        self.physical_offsets = physical_offsets
        self.sizes = sizes
        self.store_timestamp_ms = store_timestamp_ms

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, i: int) -> AppendResult: ...

    @overload
    def __getitem__(self, i: slice) -> list[AppendResult]: ...

    def __getitem__(self, i: int | slice) -> AppendResult | list[AppendResult]:
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self.sizes)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"result {i} of an append of {n}")
        return new_result((self.queue_offsets[j], self.physical_offsets[j], self.sizes[j], self.store_timestamp_ms))

    def __iter__(self) -> Iterator[AppendResult]:
        return map(new_result, zip(self.queue_offsets, self.physical_offsets, self.sizes,
                                    repeat(self.store_timestamp_ms)))  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    # Concatenation gives a list, as it did when appends returned lists.
    def __add__(self, other: Sequence[AppendResult]) -> list[AppendResult]:
        return [*self, *other]

    def __radd__(self, other: Sequence[AppendResult]) -> list[AppendResult]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"AppendResults({list(self)!r})"


def offsets_of(results: Sequence[AppendResult]) -> Sequence[int]:
    """The queue offsets an append took, in order (columns kept as they are)."""
    return results.queue_offsets if isinstance(results, AppendResults) else [r.queue_offset for r in results]


def span_of(results: Sequence[AppendResult]) -> tuple[int, int]:
    """The CommitLog positions [start, end) an append took (its records are contiguous)."""
    last = results[len(results) - 1]
    return results[0].physical_offset, last.physical_offset + last.size


class Written(NamedTuple):
    """A record recovery found in the commitlog, to re-dispatch (`dispatcher.index_records`)."""

    meta: RecordMeta
    queue_offset: int
    physical_offset: int
    size: int
    store_timestamp_ms: int
    segment_base: int


class Columns(NamedTuple):
    """What the writer and dispatcher need to know about an append's records: one list per field
    rather than one object per record (built with C-level maps; nothing per record for the GC)."""

    topics: list[str]
    queue_ids: list[int]
    tag_hashes: list[int]
    message_ids: list[bytes]
    keys: list[tuple[str, ...]]

    def slice(self, start: int, stop: int | None = None) -> Columns:
        return new_columns(
            (
                self.topics[start:stop],
                self.queue_ids[start:stop],
                self.tag_hashes[start:stop],
                self.message_ids[start:stop],
                self.keys[start:stop],
            )
        )

    def extend(self, other: Columns) -> None:
        self.topics.extend(other.topics)
        self.queue_ids.extend(other.queue_ids)
        self.tag_hashes.extend(other.tag_hashes)
        self.message_ids.extend(other.message_ids)
        self.keys.extend(other.keys)


class Run(NamedTuple):
    """Consecutive records of one round in one segment, handed to the dispatcher.

    `queue` is their one (topic, queue id) when they all target one queue (their queue offsets are
    then consecutive), None when they are mixed."""

    columns: Columns
    results: Sequence[AppendResult]  # an `AppendResults` when `queue` is set or the run is one append
    queue: tuple[str, int] | None
    segment_base: int


# `tuple.__new__(Cls, values)` skips the generated Python-level __new__: ~4x cheaper per record.
new_result = functools.partial(tuple.__new__, AppendResult)
_new_run = functools.partial(tuple.__new__, Run)
new_columns = functools.partial(tuple.__new__, Columns)


def empty_columns() -> Columns:
    return new_columns(([], [], [], [], []))


Waiter = concurrent.futures.Future | tuple[asyncio.AbstractEventLoop, asyncio.Future]

# An append of at least this many records to one queue is a run of its own, which the dispatcher
# indexes with C-level maps; smaller ones (single sends) share one run per round, indexed record by
# record, so the per-run set-up is paid once (the maps cost ~4 us more set-up than a record's loop).
RUN_MIN = 4
# Rounds of copied records (a replica's) written but not yet indexed, at most.
COPY_DISPATCH_DEPTH = 2
# pwritev takes at most IOV_MAX buffers per call.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


@dataclass(slots=True)
class _Pending:
    buf: bytearray  # the append's records, encoded back to back (record.placed)
    sizes: list[int]
    columns: Columns
    queue: tuple[str, int] | None  # the one queue of all records, None if several
    waiter: Waiter


class _Copy(NamedTuple):
    """Records a replica copies from its primary: `data` (whole records, already sealed) belongs at
    `segment_base + position`, where this log ends; `runs` index them."""

    segment_base: int
    position: int
    data: bytes | bytearray | memoryview
    runs: list[Run]
    waiter: Waiter


class _SmallRun:
    """The appends of few records of one round (single sends) gathered into one run, so that the
    dispatcher's set-up per run is paid once. Closed (handed to `runs`) before a run of another
    kind, so that runs stay in physical order (the dispatcher relies on it), and at the round's end."""

    __slots__ = ("columns", "results")

    def __init__(self) -> None:
        self.columns = empty_columns()
        self.results: list[AppendResult] = []

    def close(self, runs: list[Run], segment_base: int) -> None:
        if self.results:
            runs.append(_new_run((self.columns, self.results, None, segment_base)))
            self.columns, self.results = empty_columns(), []


class CommitLogWriter:
    def __init__(
        self,
        config: CommitLogConfig,
        segments: SegmentSet,
        *,
        next_offset_lookup: Callable[[str, int], int],
        on_written: Callable[[list[Run]], None],
        dispatched_position: Callable[[], int],
        failed: Callable[[], BaseException | None] = lambda: None,
    ) -> None:
        self._cfg = config
        self._segments = segments
        self._lookup = next_offset_lookup
        self._on_written = on_written
        self._dispatched = dispatched_position
        self._failed = failed
        self._queue: collections.deque[_Pending] = collections.deque()
        self._copies: collections.deque[_Copy] = collections.deque()  # a replica's (submit_copy)
        self._copy_dispatcher: concurrent.futures.ThreadPoolExecutor | None = None  # started by the first copy
        self._copy_dispatches: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._stop_flusher = threading.Event()
        self._idle = False  # the writer waits on the condition (guarded by it)
        self._next_qoff: dict[tuple[str, int], list[int]] = {}  # (topic, qid) -> [next offset, last phys]
        # Queues created empty (new lite topics) whose first record needs no index lookup
        # (`note_empty`); added from any thread, taken by the round that writes to one.
        self._empty: set[tuple[str, int]] = set()
        self._fd_lock = threading.Lock()
        # One round at a time, on the writer thread or inline on an event loop (`_inline_round`).
        self._round_lock = threading.Lock()
        self._inline_max = config.inline_append_max_bytes if config.flush_policy == "async" else 0
        self._inline: list[_Pending] = []  # appends made on `_inline_loop` in its current iteration
        self._inline_loop: asyncio.AbstractEventLoop | None = None
        active = segments.active
        assert active is not None, "the store creates the first segment before starting the writer"
        self._seg: Segment = active
        self._fd = os.open(active.path, os.O_WRONLY)
        self.written_position = active.end
        self.flushed_position = active.end
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, name="commitlog-writer", daemon=True)
        self._flusher: threading.Thread | None = None
        self._thread.start()
        if config.flush_policy == "async":
            self._flusher = threading.Thread(target=self._flush_loop, name="commitlog-flusher", daemon=True)
            self._flusher.start()

    # -- callers ---------------------------------------------------------------------------------

    def submit(
        self,
        buf: bytearray,
        sizes: list[int],
        columns: Columns,
        queue: tuple[str, int] | None,
        waiter: Waiter,
    ) -> None:
        """Queue one append: `buf` holds its records back to back (`sizes`), `columns` describes
        them, `queue` is their one (topic, queue id) or None if
        they target several queues."""
        with self._cond:
            if self._closed:
                raise StoreClosed("the store is closed")
            failure = self._failed()
            if failure is not None:
                raise Unavailable(f"the broker's store stopped accepting writes ({failure}); restart the broker")
            if len(self._queue) >= self._cfg.max_pending_appends:
                raise TooManyRequests("the broker's write queue is full; retry after a short backoff")
            pending = _Pending(buf, sizes, columns, queue, waiter)
            if len(buf) <= self._inline_max and isinstance(waiter, tuple) and self._inline_on(waiter[0]):
                self._inline.append(pending)
                return
            self._queue.append(pending)
            if self._idle:  # a busy writer drains the queue anyway: no wake-up syscall per append
                self._cond.notify()

    def _inline_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether an append made on `loop` (its own thread: `append` awaits there) is written by
        that loop: the store's first loop takes them, and schedules one round per loop iteration."""
        if self._inline_loop is None:
            self._inline_loop = loop
        elif self._inline_loop is not loop:
            return False
        if not self._inline:
            loop.call_soon(self._inline_round)
        return True

    def submit_copy(
        self,
        segment_base: int,
        position: int,
        data: bytes | bytearray | memoryview,
        runs: list[Run],
        waiter: Waiter,
    ) -> None:
        """Queue records copied from a primary (docs/replication.md): written as they are at the
        same offsets (rolling to `segment_base` when the primary did), indexed by `runs`, then
        `waiter` gets None. A gap or overlap with this log's end fails the waiter with BadRequest."""
        with self._cond:
            if self._closed:
                raise StoreClosed("the store is closed")
            self._copies.append(_Copy(segment_base, position, data, runs, waiter))
            if self._idle:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._copy_dispatcher is not None:  # indexing of copies ends before the index closes
            self._copy_dispatcher.shutdown(wait=True)
        self._stop_flusher.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._round_lock, self._fd_lock:  # an inline round may be writing (close runs off the loop)
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
        self.flushed_position = self.written_position

    # -- writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._copies and not self._closed:
                    self._idle = True
                    self._cond.wait()
                self._idle = False
                if not self._queue and not self._copies and self._closed:
                    return
                items = list(self._queue)
                self._queue.clear()
                copies = list(self._copies)
                self._copies.clear()
            with self._round_lock:
                if copies:  # a replica has no appends of its own, a primary no copies
                    self._copy(copies)
                if items:
                    self._round(items)

    def _inline_round(self) -> None:
        """Write the appends made on the loop during its last iteration, on the loop (async policy,
        small appends): no hand-off to the writer thread and back. Should the writer thread be in
        a round of its own (a large append), they go to it rather than block the loop."""
        items, self._inline = self._inline, []
        if self._closed:
            _complete(items, None, StoreClosed("the store is closed"), on_loop=True)
            return
        if not self._round_lock.acquire(blocking=False):
            with self._cond:
                self._queue.extend(items)
                if self._idle:
                    self._cond.notify()
            return
        try:
            self._round(items, on_loop=True)
        finally:
            self._round_lock.release()

    def _copy(self, items: list[_Copy]) -> None:
        """Write replicated pieces at the end of the log (writer thread). Pieces that follow each other
        in one segment are written together: one pwritev, one fdatasync (sync policy) and one
        dispatch (one RocksDB batch) for all of them, so a replica catching up on a backlog pays
        those per round, not per piece."""
        group: list[_Copy] = []
        for item in items:
            try:
                end = self._seg.end + sum(len(g.data) for g in group)
                if item.segment_base != self._seg.base:
                    if item.segment_base != end or item.position != 0:
                        raise BadRequest(
                            f"replicated data for segment {item.segment_base}+{item.position} does not follow "
                            f"this log's end {end}"
                        )
                    self._copy_group(group)  # the pieces before the roll belong to the old segment
                    group = []
                    self._roll()
                if item.segment_base + item.position != end:
                    raise BadRequest(
                        f"replicated data at {item.segment_base + item.position} but this log ends at {end}"
                    )
            except BadRequest as exc:
                self._copy_group(group)
                group = []
                _complete([item], None, exc)
                continue
            except OSError as exc:  # the roll failed
                self._copy_group(group)
                group = []
                failure = Unavailable(f"the replica could not roll its commitlog ({exc.strerror or exc})")
                _complete([item], None, failure)
                continue
            group.append(item)
        self._copy_group(group)

    def _copy_group(self, group: list[_Copy]) -> None:
        """Write pieces that follow this log's end in its active segment, in one go."""
        if not group:
            return
        err: BaseException | None = None
        start_seg, start_size = self._seg, self._seg.size
        try:
            self._write([g.data for g in group], start_size + sum(len(g.data) for g in group))  # type: ignore[misc]
            if self._cfg.flush_policy == "sync":
                os.fdatasync(self._fd)
                self.flushed_position = self._seg.end
        except OSError as exc:
            self._rollback(start_seg, start_size)
            err = Unavailable(f"the replica could not write to its commitlog ({exc.strerror or exc})")
        if err is None:
            self.written_position = self._seg.end
            self._next_qoff.clear()  # queue ends come from the index (this writer sealed none of these)
            self._dispatch_copies([run for g in group for run in g.runs])
        _complete(group, None if err else [[] for _ in group], err)

    def _dispatch_copies(self, runs: list[Run]) -> None:
        """Index copied records in the copy dispatcher's thread, while this thread writes the next
        pieces (a replica catching up spends about as long indexing as writing). A copy is complete
        once written: recovery re-dispatches what a crash left unindexed, and a replica serves no
        reads before it is promoted, which closes (and so drains) this store first. At most
        COPY_DISPATCH_DEPTH rounds wait to be indexed."""
        if self._copy_dispatcher is None:
            self._copy_dispatcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="copy-dispatch")
        while len(self._copy_dispatches) >= COPY_DISPATCH_DEPTH:
            self._copy_dispatches.popleft().result()
        self._copy_dispatches.append(self._copy_dispatcher.submit(self._on_written, runs))

    def _round(self, items: list[_Pending], *, on_loop: bool = False) -> None:
        now_ms = time.time_ns() // 1_000_000
        start_seg, start_size = self._seg, self._seg.size
        runs: list[Run] = []
        results: list[Sequence[AppendResult]] = []
        chunks: list[bytearray | memoryview] = []
        seg_limit = self._cfg.segment_bytes
        base, pos = self._seg.base, self._seg.size
        try:
            small = _SmallRun()  # the round's single sends
            for item in items:
                sizes, queue, buf = item.sizes, item.queue, item.buf
                nbytes = len(buf)
                if pos + nbytes > seg_limit and (pos > 0 or len(sizes) > 1):
                    # The segment rolls inside this append: record by record.
                    small.close(runs, base)
                    view = memoryview(buf)
                    out, base, pos = self._seal_each(item, view, chunks, runs, base, pos, now_ms)
                    results.append(out)
                    continue
                if queue is None:  # several queues (a lite or priority send): a run of its own
                    small.close(runs, base)
                    mixed = self._seal_mixed(item, base + pos, now_ms)
                    runs.append(_new_run((item.columns, mixed, None, base)))
                    results.append(mixed)
                    pos += nbytes
                    chunks.append(buf)
                    continue
                # The common case: one queue, and the append fits in the active segment.
                entry = self._queue_entry(queue)
                qoff = entry[0]
                n = len(sizes)
                physs = _seal_queue(buf, sizes, qoff, base + pos, now_ms)
                phys = physs[n - 1]
                cols = item.columns
                if n >= RUN_MIN:  # a run of its own, indexed by the dispatcher's maps
                    small.close(runs, base)
                    sealed: Sequence[AppendResult] = AppendResults(range(qoff, qoff + n), physs, sizes, now_ms)
                    runs.append(_new_run((cols, sealed, queue, base)))
                else:  # a single send or a few records: they share the round's small run
                    sealed = list(map(new_result, zip(count(qoff), physs, sizes, repeat(now_ms))))
                    small.columns.extend(cols)
                    small.results += sealed
                results.append(sealed)
                entry[0] = qoff + n
                entry[1] = phys
                pos += nbytes
                chunks.append(buf)
            small.close(runs, base)
            self._write(chunks, pos)
            if self._cfg.flush_policy == "sync":
                started = time.perf_counter()
                os.fdatasync(self._fd)
                observe_flush(time.perf_counter() - started)
                self.flushed_position = self._seg.end
        except OSError as exc:
            self._rollback(start_seg, start_size)
            log.error("commitlog write failed; round rolled back", extra=kv(error=str(exc), appends=len(items)))
            err = Unavailable(f"the broker could not write to its commitlog ({exc.strerror or exc}); retry later")
            _complete(items, None, err, on_loop=on_loop)
            return
        self.written_position = self._seg.end
        self.rounds += 1
        # Index before acknowledging: an acknowledged message is already visible (read-your-writes),
        # and the woken event loop does not contend with the dispatch for the GIL.
        self._on_written(runs)
        _complete(items, results, None, on_loop=on_loop)

    def _seal_each(
        self,
        item: _Pending,
        view: memoryview,
        chunks: list[bytearray | memoryview],
        runs: list[Run],
        base: int,
        pos: int,
        now_ms: int,
    ) -> tuple[list[AppendResult], int, int]:
        """Seal an append record by record: mixed queues, or a segment roll inside it.
        Returns its results and the new (segment base, position in segment)."""
        seg_limit = self._cfg.segment_bytes
        buf = item.buf
        out: list[AppendResult] = []
        run_from = 0  # first record of the current run (the records since the last roll)
        chunk_from = start = 0  # byte offsets in `buf`
        cur_key: tuple[str, int] | None = None
        entry: list[int] = []
        cols = item.columns
        for i, (size, topic, queue_id) in enumerate(zip(item.sizes, cols.topics, cols.queue_ids, strict=True)):
            if pos > 0 and pos + size > seg_limit:
                if start > chunk_from:
                    chunks.append(view[chunk_from:start])
                if i > run_from:
                    runs.append(_run_of(cols.slice(run_from, i), out[run_from:i], item.queue, base))
                self._write(chunks, pos)
                chunks.clear()
                self._roll()
                base, pos = self._seg.base, 0
                run_from, chunk_from = i, start
            phys = base + pos
            key = (topic, queue_id)
            if key != cur_key:  # batches usually target one queue: one lookup per run
                cur_key, entry = key, self._queue_entry(key)
            qoff = entry[0]
            entry[0] = qoff + 1
            entry[1] = phys
            seal_at(buf, view, start, size, qoff, phys, now_ms)
            out.append(new_result((qoff, phys, size, now_ms)))
            start += size
            pos += size
        if start > chunk_from:
            chunks.append(view[chunk_from:start])
        if len(out) > run_from:
            rest = cols if run_from == 0 else cols.slice(run_from)
            runs.append(_run_of(rest, out[run_from:], item.queue, base))
        return out, base, pos

    def _write(self, chunks: list[bytearray | memoryview], new_size: int) -> None:
        if not chunks:
            return
        offset = self._seg.size
        for i in range(0, len(chunks), _IOV_MAX):
            group = chunks[i : i + _IOV_MAX]
            want = sum(map(len, group))
            n = os.pwritev(self._fd, group, offset)
            if n < want:  # a short write (rare): finish it from a flat copy of what is left
                rest = memoryview(b"".join(group))[n:]
                offset += n
                while rest:
                    k = os.pwrite(self._fd, rest, offset)
                    rest = rest[k:]
                    offset += k
            else:
                offset += n
        assert offset == new_size, "segment size must equal the bytes written"
        self._segments.grew(self._seg, new_size)

    def _roll(self) -> None:
        """Seal the active segment (durably) and start the next one where it ends."""
        with self._fd_lock:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self.flushed_position = self._seg.end
            self._seg = self._segments.create(self._seg.end)
            self._fd = os.open(self._seg.path, os.O_WRONLY)
        log.info("commitlog rolled to a new segment", extra=kv(segment=self._seg.name()))

    def _seal_mixed(self, item: _Pending, phys: int, now_ms: int) -> AppendResults:
        """Seal an append to several queues that fits in the active segment, its first record at
        `phys`: each record takes its queue's next offset. Its results stay columns, which the
        dispatcher indexes as they are."""
        buf, sizes, cols = item.buf, item.sizes, item.columns
        view = memoryview(buf)
        cache = self._next_qoff
        qoffs: list[int] = []
        physs: list[int] = []
        start = 0
        for size, key in zip(sizes, zip(cols.topics, cols.queue_ids, strict=True), strict=True):
            entry = cache.get(key)
            if entry is None:
                entry = self._queue_entry(key)
            qoff = entry[0]
            entry[0] = qoff + 1
            entry[1] = phys
            seal_at(buf, view, start, size, qoff, phys, now_ms)
            qoffs.append(qoff)
            physs.append(phys)
            start += size
            phys += size
        return AppendResults(qoffs, physs, sizes, now_ms)

    def note_empty(self, topic: str, queue_ids: Iterable[int]) -> None:
        """Queues just created that hold no record (a new lite topic's, whose number is never
        reused): the round that writes the first record of one starts it at offset 0 instead of
        asking the index where it ends (a RocksDB seek, the largest cost of a first message).
        Called before any append to them is submitted; bounded like the offset cache (beyond it the
        hints are dropped: the index lookup is always right)."""
        empty = self._empty
        if len(empty) >= self._cfg.queue_offset_cache_size:
            empty.clear()
        empty.update(zip(repeat(topic), queue_ids))

    def _queue_entry(self, key: tuple[str, int]) -> list[int]:
        """The mutable [next queue offset, last physical offset] of a queue. A failed round
        forgets them all (`_rollback`): the index then knows every queue's end, since each round
        is dispatched before the next one starts."""
        entry = self._next_qoff.get(key)
        if entry is None:
            if len(self._next_qoff) >= self._cfg.queue_offset_cache_size:
                self._evict()
            if key in self._empty:
                self._empty.discard(key)
                entry = [0, -1]
            else:
                entry = [self._lookup(key[0], key[1]), -1]
            self._next_qoff[key] = entry
        return entry

    def _evict(self) -> None:
        """Forget queues whose last append is already dispatched (the index then knows their end)."""
        dispatched = self._dispatched()
        target = max(1, len(self._next_qoff) // 10)
        victims = [k for k, (_, last) in self._next_qoff.items() if last < dispatched][:target]
        for k in victims:
            del self._next_qoff[k]

    def _rollback(self, seg: Segment, size: int) -> None:
        self._next_qoff.clear()  # the next offsets of the queues this round wrote are the index's again
        try:
            if self._seg is not seg:
                # The round rolled into new segments: drop them and go back to the old one.
                self._segments.remove_after(seg)
                with self._fd_lock:
                    os.close(self._fd)
                    self._seg = seg
                    self._fd = os.open(seg.path, os.O_WRONLY)
            self._segments.truncate(seg, size)
        except OSError:
            log.exception("could not roll back a failed commitlog write; restart the broker to recover")

    # -- flusher thread (async policy) -----------------------------------------------------------

    def _flush_loop(self) -> None:
        interval = self._cfg.flush_interval_ms / 1000.0
        while not self._stop_flusher.wait(interval):
            target = self.written_position
            if target == self.flushed_position:
                continue
            with self._fd_lock:
                if self._fd >= 0:
                    started = time.perf_counter()
                    os.fdatasync(self._fd)
                    observe_flush(time.perf_counter() - started)
            self.flushed_position = max(self.flushed_position, target)

    @property
    def thread_id(self) -> int:
        """The writer thread's id (benchmarks read its CPU clock)."""
        ident = self._thread.ident
        assert ident is not None, "the writer thread starts in __init__"
        return ident


def _run_of(columns: Columns, results: list[AppendResult], queue: tuple[str, int] | None, base: int) -> Run:
    """The run of a part of a record-by-record append: a one-queue part keeps its results as
    columns, as the dispatcher's maps take them."""
    if queue is None:
        return _new_run((columns, results, None, base))
    physs, sizes = [r.physical_offset for r in results], [r.size for r in results]
    first = results[0]
    offsets = range(first.queue_offset, first.queue_offset + len(results))
    return _new_run((columns, AppendResults(offsets, physs, sizes, first.store_timestamp_ms), queue, base))


def _seal_queue(buf: bytearray, sizes: list[int], queue_offset: int, physical_offset: int, now_ms: int) -> list[int]:
    """Seal the records of `buf` (back to back, `sizes`) as consecutive offsets of one queue from
    `queue_offset`, the first at `physical_offset`; returns each record's physical offset."""
    view = memoryview(buf)
    physs: list[int] = []
    start = 0
    for size in sizes:
        seal_at(buf, view, start, size, queue_offset, physical_offset, now_ms)
        physs.append(physical_offset)
        queue_offset += 1
        physical_offset += size
        start += size
    return physs


def _complete(
    items: Sequence[_Pending | _Copy],
    results: list[Sequence[AppendResult]] | None,
    err: BaseException | None,
    *,
    on_loop: bool = False,
) -> None:
    """Resolve the waiters of `items`; `on_loop`: this runs on their (one) event loop's thread."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, object]]] = {}
    for i, item in enumerate(items):
        outcome: object = err if err is not None else results[i] if results else None
        w = item.waiter
        if isinstance(w, concurrent.futures.Future):
            if err is not None:
                w.set_exception(err)
            else:
                w.set_result(outcome)
        else:
            loop, fut = w
            by_loop.setdefault(loop, []).append((fut, outcome))
    for loop, pairs in by_loop.items():
        if on_loop:
            _resolve(pairs)
            continue
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed; nobody waits any more
            loop.call_soon_threadsafe(_resolve, pairs)


def _resolve(pairs: list[tuple[asyncio.Future, object]]) -> None:
    for fut, outcome in pairs:
        if fut.done():
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
