"""The CommitLog writer: one thread owns the active segment and group-commits appends.

Callers hand over already encoded records (`record.encode`); the writer drains everything that
queued up while it was busy, assigns queue offsets and physical offsets in one place, seals the
records (offsets + CRC), writes the round with one `write`, and under the `sync` policy makes it
durable with one `fdatasync` before any caller of the round is acknowledged. Under `async`, callers
are acknowledged after the write and a flusher thread fsyncs every `flush_interval_ms`.

Invariants (asserted): physical offsets are contiguous and increasing; queue offsets are strictly
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from broker.store.config import CommitLogConfig
from broker.store.record import seal
from broker.store.segments import Segment, SegmentSet
from common.errors import StoreClosed, TooManyRequests, Unavailable
from common.logs import kv
from common.metrics import observe_flush

log = logging.getLogger("sluice.store.writer")


# Per-record carriers are NamedTuples: built once per message on the hot path, and a frozen
# dataclass costs several times more to construct.


class RecordMeta(NamedTuple):
    """What the writer and dispatcher need to know about an encoded record."""

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


class Written(NamedTuple):
    """A sealed record handed to the dispatcher."""

    meta: RecordMeta
    queue_offset: int
    physical_offset: int
    size: int
    store_timestamp_ms: int
    segment_base: int


# `tuple.__new__(Cls, values)` skips the generated Python-level __new__: ~4x cheaper per record.
new_meta = functools.partial(tuple.__new__, RecordMeta)
_new_result = functools.partial(tuple.__new__, AppendResult)
_new_written = functools.partial(tuple.__new__, Written)

Waiter = concurrent.futures.Future | tuple[asyncio.AbstractEventLoop, asyncio.Future]


@dataclass(slots=True)
class _Pending:
    buffers: list[bytearray]
    metas: list[RecordMeta]
    waiter: Waiter


class CommitLogWriter:
    def __init__(
        self,
        config: CommitLogConfig,
        segments: SegmentSet,
        *,
        next_offset_lookup: Callable[[str, int], int],
        on_written: Callable[[list[Written]], None],
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
        self._cond = threading.Condition()
        self._closed = False
        self._stop_flusher = threading.Event()
        self._idle = False  # the writer waits on the condition (guarded by it)
        self._next_qoff: dict[tuple[str, int], list[int]] = {}  # (topic, qid) -> [next offset, last phys]
        self._fd_lock = threading.Lock()
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

    def submit(self, buffers: list[bytearray], metas: list[RecordMeta], waiter: Waiter) -> None:
        with self._cond:
            if self._closed:
                raise StoreClosed("the store is closed")
            failure = self._failed()
            if failure is not None:
                raise Unavailable(f"the broker's store stopped accepting writes ({failure}); restart the broker")
            if len(self._queue) >= self._cfg.max_pending_appends:
                raise TooManyRequests("the broker's write queue is full; retry after a short backoff")
            self._queue.append(_Pending(buffers, metas, waiter))
            if self._idle:  # a busy writer drains the queue anyway: no wake-up syscall per append
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._stop_flusher.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._fd_lock:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
        self.flushed_position = self.written_position

    # -- writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._idle = True
                    self._cond.wait()
                self._idle = False
                if not self._queue and self._closed:
                    return
                items = list(self._queue)
                self._queue.clear()
            self._round(items)

    def _round(self, items: list[_Pending]) -> None:
        now_ms = time.time_ns() // 1_000_000
        start_seg, start_size = self._seg, self._seg.size
        saved: dict[tuple[str, int], list[int] | None] = {}
        written: list[Written] = []
        results: list[list[AppendResult]] = []
        chunks: list[bytearray] = []
        seg_limit = self._cfg.segment_bytes
        base, pos = self._seg.base, self._seg.size
        try:
            for item in items:
                out: list[AppendResult] = []
                cur_key: tuple[str, int] | None = None
                entry: list[int] = []
                for buf, meta in zip(item.buffers, item.metas, strict=True):
                    size = len(buf)
                    if pos > 0 and pos + size > seg_limit:
                        self._write(chunks, pos)
                        chunks = []
                        self._roll()
                        base, pos = self._seg.base, 0
                    phys = base + pos
                    key = (meta[0], meta[1])
                    if key != cur_key:  # batches usually target one queue: one lookup per run
                        cur_key, entry = key, self._queue_entry(key, saved)
                    qoff = entry[0]
                    entry[0] = qoff + 1
                    entry[1] = phys
                    seal(buf, qoff, phys, now_ms)
                    chunks.append(buf)
                    pos += size
                    out.append(_new_result((qoff, phys, size, now_ms)))
                    written.append(_new_written((meta, qoff, phys, size, now_ms, base)))
                results.append(out)
            self._write(chunks, pos)
            if self._cfg.flush_policy == "sync":
                started = time.perf_counter()
                os.fdatasync(self._fd)
                observe_flush(time.perf_counter() - started)
                self.flushed_position = self._seg.end
        except OSError as exc:
            self._rollback(start_seg, start_size, saved)
            log.error("commitlog write failed; round rolled back", extra=kv(error=str(exc), appends=len(items)))
            err = Unavailable(f"the broker could not write to its commitlog ({exc.strerror or exc}); retry later")
            _complete(items, None, err)
            return
        self.written_position = self._seg.end
        self.rounds += 1
        # Index before acknowledging: an acknowledged message is already visible (read-your-writes),
        # and the woken event loop does not contend with the dispatch for the GIL.
        self._on_written(written)
        _complete(items, results, None)

    def _write(self, chunks: list[bytearray], new_size: int) -> None:
        if not chunks:
            return
        data = memoryview(b"".join(chunks))
        offset = self._seg.size
        while data:
            n = os.pwrite(self._fd, data, offset)
            data = data[n:]
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

    def _queue_entry(self, key: tuple[str, int], saved: dict[tuple[str, int], list[int] | None]) -> list[int]:
        """The mutable [next queue offset, last physical offset] of a queue, remembering its value
        at the start of the round so a failed round can be rolled back."""
        entry = self._next_qoff.get(key)
        if key not in saved:
            saved[key] = None if entry is None else list(entry)
        if entry is None:
            if len(self._next_qoff) >= self._cfg.queue_offset_cache_size:
                self._evict()
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

    def _rollback(self, seg: Segment, size: int, saved: dict[tuple[str, int], list[int] | None]) -> None:
        for key, entry in saved.items():
            if entry is None:
                self._next_qoff.pop(key, None)
            else:
                self._next_qoff[key] = entry
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


def _complete(items: list[_Pending], results: list[list[AppendResult]] | None, err: BaseException | None) -> None:
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
