"""The dispatcher: turns written CommitLog records into index entries, one WriteBatch per round.

Per record it writes the message-id entry and one key-index entry per key; per queue, segment and
round one ConsumeQueue block (the round's entries of that queue, keys.py); per queue and segment,
once, a `segq` key listing the queue in the segment (for retention); per round the dispatch
checkpoint; all in the same WriteBatch, so the indexes and the checkpoint never
disagree. A topic's deletion record (deletion.py) ends the topic's queues where it stands in the
round, in the same batch. Consumers only see dispatched records. Listeners (long polling) are told
which queues received messages after every round, grouped by topic (`Touched`); deletion listeners
(tiering) of every deletion the round applied.

The writer calls `dispatch` (on its thread, or on the event loop for a round of small appends)
once a round is durable under the flush policy and before it acknowledges the round, so nothing
is visible before it is durable and every acknowledged message is already visible
(read-your-writes). Dispatch runs where the round was written rather than on a thread of its own:
the work is Python-bound, the GIL serialises it anyway, and a thread hand-off per round cost ~15%
of append throughput (measured with tests/bench/store_bench.py). rocksdict holds the GIL through
RocksDB's write too (docs/benchmarks.md), so no thread would overlap it with the event loop's work.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

from broker.store import keys as K
from broker.store.deletion import DELETION_TOPIC, Deletion
from broker.store.index import Index
from broker.store.writer import AppendResult, AppendResults, Columns, Run, Written
from common.logs import kv

log = logging.getLogger("sluice.store.dispatch")

# The queues a round wrote to, by topic: listeners do their work per topic (a lite topic's send
# touches one queue per message, so a listener's per-queue work is kept to what needs it).
Touched = dict[str, set[int]]
DispatchListener = Callable[[Touched], None]
DeletionListener = Callable[[Deletion], None]


def call_soon_from_any_thread(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object) -> None:
    """Schedule `callback(*args)` on `loop` from a dispatch listener, which runs on the writer's
    thread or, for a round of small appends, on `loop` itself: there a plain `call_soon`, without
    the wake-up write `call_soon_threadsafe` makes. A closed loop is ignored (nobody waits any more)."""
    if asyncio._get_running_loop() is loop:
        loop.call_soon(callback, *args)
        return
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


_MAX_INDEXED_ID = 255
# `segq` keys the dispatcher remembers having put (~70 bytes each); beyond it, it forgets them all.
LISTED_MAX = 100_000
_MAX_INDEXED_KEY = 0xFFFF
_drain: Callable[[Iterable[object]], None] = collections.deque[object](maxlen=0).extend  # consume an iterator in C
_Blocks = dict[tuple[int, int, int], list[Any]]  # open ConsumeQueue blocks of a round (`_gather`)


def index_records(index: Index, records: Sequence[Written]) -> Touched:
    """Write the index entries and checkpoint for `records` (in physical order) in one batch."""
    runs = []
    for w in records:
        m = w.meta
        columns = Columns([m.topic], [m.queue_id], [m.tag_hash], [m.message_id], [m.keys])
        result = AppendResult(w.queue_offset, w.physical_offset, w.size, w.store_timestamp_ms)
        runs.append(Run(columns, [result], None, w.segment_base))
    return index_runs(index, runs)


def index_runs(
    index: Index, runs: Sequence[Run], listed: set[bytes] | None = None, deletions: list[Deletion] | None = None
) -> Touched:
    """Write the index entries and checkpoint for `runs` (in physical order) in one batch; the
    deletions the runs held are added to `deletions`.

    A run whose results are columns (`AppendResults`: one append, to one queue or to several) is
    indexed with C-level `map`s for its values and keys; a run of small appends (single sends, which
    share one) or of records recovery found, record by record. Both write the same entries. The
    writer decides which is which: it gives an append a run of its own when it has enough records
    to repay the maps' set-up (`writer.RUN_MIN`) or targets several queues. ConsumeQueue entries
    are gathered per (segment, topic, queue) while their offsets follow on, and written as blocks
    at the end."""
    batch = index.batch()
    put = batch.put
    cq, msgid, keyidx, segq = (index.handle(n) for n in (K.CF_CQ, K.CF_MSGID, K.CF_KEYIDX, K.CF_SEGQ))
    cq_value, cq_key, u32 = K.CQ_VALUE.pack, K.CQ_KEY.pack, K.U32.pack
    msgid_key, keyidx_key = K.msgid_key, K.keyidx_key
    topic_ids: dict[str, int] = {}

    def tid_of(topic: str) -> int:
        tid = topic_ids.get(topic)
        if tid is None:
            tid = topic_ids[topic] = index.intern_topic(topic, batch)
        return tid

    blocks: _Blocks = {}  # (segment base, topic id, queue id) -> open block
    listings: dict[tuple[int, int, int], int] = {}  # the same -> an offset of it this round (for `segq`)
    applied: list[Deletion] = []
    for cols, results, queue, seg_base in runs:
        if type(results) is not AppendResults:
            for topic, qid, th, mid, keys, (qoff, phys, size, store_ts) in zip(*cols, results, strict=True):
                if topic == DELETION_TOPIC and keys:
                    applied.append(_delete_topic(index, batch, blocks, listings, keys[0], phys))
                tid = tid_of(topic)
                _gather(blocks, put, cq, (seg_base, tid, qid), qoff, 1, cq_value(phys, size, th, store_ts))
                if mid and len(mid) <= _MAX_INDEXED_ID:
                    put(msgid_key(seg_base, mid, phys), u32(size), msgid)
                for key in keys:
                    kb = key.encode("utf-8")
                    if kb and len(kb) <= _MAX_INDEXED_KEY:
                        put(keyidx_key(seg_base, tid, kb, phys), u32(size), keyidx)
            continue
        physs, sizes, n = results.physical_offsets, results.sizes, len(results)
        entries = map(cq_value, physs, sizes, cols.tag_hashes, repeat(results.store_timestamp_ms))
        topics = cols.topics
        if queue is not None:  # one queue: one block
            tids: Sequence[int] = [tid_of(queue[0])] * n
            _gather(blocks, put, cq, (seg_base, tids[0], queue[1]), results.queue_offsets[0], n, b"".join(entries))
            if queue[0] == DELETION_TOPIC:  # deletions copied as a run of their own (a replica's)
                applied += [_delete_topic(index, batch, blocks, listings, keys[0], phys)
                            for keys, phys in zip(cols.keys, physs, strict=True) if keys]  # fmt: skip
        else:  # several queues (a lite or priority send)
            one_topic = topics.count(topics[0]) == n
            tids = [tid_of(topics[0])] * n if one_topic else list(map(tid_of, topics))
            qids, qoffs = cols.queue_ids, results.queue_offsets
            if one_topic and len(set(qids)) == n:  # each queue once (a lite send): a key each, put now
                _drain(map(put, map(cq_key, repeat(tids[0]), qids, qoffs), entries, repeat(cq)))
                listings.update(zip(zip(repeat(seg_base, n), tids, qids, strict=True), qoffs, strict=True))
            else:  # each entry joins its queue's block (a priority send: few queues, many entries)
                where = zip(repeat(seg_base, n), tids, qids, strict=True)
                for key, qoff, entry in zip(where, qoffs, entries, strict=True):
                    _gather(blocks, put, cq, key, qoff, 1, entry)
        mids = cols.message_ids
        lengths = set(map(len, mids))
        id_len = lengths.pop() if len(lengths) == 1 else 0
        if 0 < id_len <= _MAX_INDEXED_ID:  # the usual case: ids of one length
            id_keys = map(K.msgid_key_struct(id_len).pack, repeat(seg_base), repeat(id_len), mids, physs)
            _drain(map(put, id_keys, map(u32, sizes), repeat(msgid)))
        else:
            for mid, phys, size in zip(mids, physs, sizes, strict=True):
                if mid and len(mid) <= _MAX_INDEXED_ID:
                    put(msgid_key(seg_base, mid, phys), u32(size), msgid)
        if any(cols.keys):
            for tid, keys, phys, size in zip(tids, cols.keys, physs, sizes, strict=True):
                for key in keys:
                    kb = key.encode("utf-8")
                    if kb and len(kb) <= _MAX_INDEXED_KEY:
                        put(keyidx_key(seg_base, tid, kb, phys), u32(size), keyidx)
    segq_key, u64 = K.SEGQ_KEY.pack, K.U64.pack
    by_tid: dict[int, set[int]] = {tid: set() for tid in topic_ids.values()}
    for at, block in blocks.items():
        _put_block(put, cq, at[1], at[2], block)
        listings[at] = block[1] - 1
    for (base, tid, qid), qoff in listings.items():
        # The segment lists the queue once (`listed`: the keys put already, if the caller keeps
        # them), with an offset of it there; retention finds the highest from it (keys.py).
        key = segq_key(base, tid, qid)
        if listed is None:
            put(key, u64(qoff), segq)
        elif key not in listed:
            put(key, u64(qoff), segq)
            listed.add(key)
        by_tid[tid].add(qid)
    last = runs[-1].results[-1]
    index.put_checkpoint(batch, last.physical_offset + last.size)
    index.write(batch)
    for deletion in applied:
        index.note_deleted(deletion.topic, deletion.position)
    if deletions is not None:
        deletions += applied
    return {index.topic_name(tid) or "": qids for tid, qids in by_tid.items()}


def _delete_topic(index: Index, batch: Any, blocks: _Blocks, listings: dict[tuple[int, int, int], int], topic: str,
                  position: int) -> Deletion:  # fmt: skip
    """Apply the deletion of `topic` by the record at `position`, which follows the round's records
    before it (deletion.py), in `batch`: each queue of the topic holding anything (ConsumeQueue
    entries, a floor, entries of this round before the record: their open blocks are dropped, and
    those put already are in the range delete) ends where it ends; the topic's entries go (one
    range delete: none of the next incarnation is put yet), each queue's floor and the first offset
    of its next incarnation become its end."""
    meta = index.handle(K.CF_META)
    tid = index.topic_id(topic)
    floors: dict[int, int] = {}
    if tid is not None:
        floors = index.queue_floors(tid)
        ends = index.queue_ends(tid)
        for at in [at for at in blocks if at[1] == tid]:
            end = blocks.pop(at)[1]
            ends[at[2]] = max(ends.get(at[2], 0), end)
            listings.setdefault(at, end - 1)  # the segment still lists the queue, as for any record it holds
        for (_, t, qid), qoff in listings.items():  # a lite send's entries, put at once
            if t == tid:
                ends[qid] = max(ends.get(qid, 0), qoff + 1)
        batch.delete_range(K.cq_key(tid, 0, 0), K.queue_prefix(tid + 1, 0), index.handle(K.CF_CQ))
        put, u64 = batch.put, K.U64.pack
        for qid, end in ends.items():  # a queue's floor is at most where its entries end
            put(K.queue_floor_key(tid, qid), u64(end), meta)
            floors[qid] = end
        for qid, floor in floors.items():
            put(K.incarnation_key(tid, qid), u64(floor), meta)
    batch.put(K.deleted_key(topic), K.U64.pack(position), meta)
    return Deletion(topic, position, floors)


def _gather(blocks: _Blocks, put: Callable[..., None], cq: object, where: tuple[int, int, int], first: int, n: int,
            entries: bytes) -> None:  # fmt: skip
    """Add the packed ConsumeQueue entries of offsets first..first+n-1 of the queue `where` (segment
    base, topic id, queue id) names: to its open block if they follow on, else to a new one (the
    open block is put). A block is [first offset, next offset, entries: bytes, or a list of bytes
    once a second part joins (one container per block, not two: GC pressure)]."""
    block = blocks.get(where)
    if block is not None and block[1] == first:
        block[1] += n
        parts = block[2]
        if type(parts) is bytes:
            block[2] = [parts, entries]
        else:
            parts.append(entries)
        return
    if block is not None:
        _put_block(put, cq, where[1], where[2], block)
    blocks[where] = [first, first + n, entries]


def _put_block(put: Callable[..., None], cq: object, tid: int, qid: int, block: list[Any]) -> None:
    """Put gathered ConsumeQueue entries as blocks of at most `CQ_BLOCK_MAX` entries."""
    first, end, parts = block
    data = parts if type(parts) is bytes else b"".join(parts)
    if end - first <= K.CQ_BLOCK_MAX:
        put(K.cq_key(tid, qid, first), data, cq)
        return
    step = K.CQ_BLOCK_MAX * K.CQ_ENTRY
    for at in range(0, len(data), step):
        put(K.cq_key(tid, qid, first + at // K.CQ_ENTRY), data[at : at + step], cq)


class Dispatcher:
    def __init__(self, index: Index, start_position: int) -> None:
        self._index = index
        self.position = start_position
        self._listeners: list[DispatchListener] = []
        self._deletion_listeners: list[DeletionListener] = []
        self._cond = threading.Condition()
        self.last_lag_ms = 0
        self.max_lag_ms = 0
        self.records = 0
        self.failed: BaseException | None = None
        self._listed: set[bytes] = set()  # `segq` keys put by this process (bounded: LISTED_MAX)

    def add_listener(self, listener: DispatchListener) -> None:
        self._listeners.append(listener)

    def add_deletion_listener(self, listener: DeletionListener) -> None:
        self._deletion_listeners.append(listener)

    def wait_for(self, position: int, timeout_s: float) -> bool:
        """Block until everything before `position` is dispatched; False on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.position < position:
                left = deadline - time.monotonic()
                if left <= 0 or self.failed is not None:
                    return False
                self._cond.wait(left)
        return True

    def dispatch(self, runs: list[Run]) -> None:
        """Index one round of written records (writer thread only)."""
        if not runs or self.failed is not None:
            return
        try:
            if len(self._listed) > LISTED_MAX:
                self._listed.clear()  # a queue listed again costs a put, nothing else
            deletions: list[Deletion] = []
            touched = index_runs(self._index, runs, self._listed, deletions)
        except Exception as exc:  # RocksDB failure: stop dispatching, keep the commitlog as truth
            self.failed = exc
            log.exception("dispatch failed; records stay in the commitlog and are re-dispatched on restart")
            with self._cond:
                self._cond.notify_all()
            return
        now_ms = time.time_ns() // 1_000_000
        lag = max(0, now_ms - runs[0].results[0].store_timestamp_ms)
        self.last_lag_ms = lag
        self.max_lag_ms = max(self.max_lag_ms, lag)
        self.records += sum(len(run.results) for run in runs)
        last = runs[-1].results[-1]
        with self._cond:
            self.position = last.physical_offset + last.size
            self._cond.notify_all()
        for listener in self._listeners:
            try:
                listener(touched)
            except Exception:
                log.exception("dispatch listener failed", extra=kv(listener=repr(listener)))
        for deletion in deletions:
            for on_deleted in self._deletion_listeners:
                try:
                    on_deleted(deletion)
                except Exception:
                    log.exception("deletion listener failed", extra=kv(topic=deletion.topic))
