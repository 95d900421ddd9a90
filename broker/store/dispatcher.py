"""The dispatcher: turns written CommitLog records into index entries, one WriteBatch per round.

Per record it writes the ConsumeQueue entry, the message-id entry and one key-index entry per key;
per round, the highest queue offset each queue reached in each segment (`segq`, used by retention)
and the dispatch checkpoint, all in the same WriteBatch, so the indexes and the checkpoint never
disagree. Consumers only see dispatched records. Listeners (long polling) are told which queues
received messages after every round.

The writer hands records over only once they are durable under the flush policy, so dispatch never
exposes a record a crash could take back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from broker.store import keys as K
from broker.store.config import DispatchConfig
from broker.store.index import Index
from broker.store.writer import Written
from common.logs import kv

log = logging.getLogger("sluice.store.dispatch")

DispatchListener = Callable[[set[tuple[str, int]]], None]
_MAX_INDEXED_ID = 255
_MAX_INDEXED_KEY = 0xFFFF


def index_records(index: Index, records: Sequence[Written]) -> set[tuple[str, int]]:
    """Write the index entries and checkpoint for `records` (in physical order) in one batch."""
    batch = index.batch()
    cq, msgid, keyidx, segq = (index.handle(n) for n in (K.CF_CQ, K.CF_MSGID, K.CF_KEYIDX, K.CF_SEGQ))
    seg_max: dict[tuple[int, int, int], int] = {}
    touched: set[tuple[str, int]] = set()
    for w in records:
        meta = w.meta
        tid = index.intern_topic(meta.topic, batch)
        batch.put(
            K.cq_key(tid, meta.queue_id, w.queue_offset),
            K.cq_value(w.physical_offset, w.size, meta.tag_hash, w.store_timestamp_ms),
            cq,
        )
        if meta.message_id and len(meta.message_id) <= _MAX_INDEXED_ID:
            batch.put(K.msgid_key(w.segment_base, meta.message_id, w.physical_offset), K.U32.pack(w.size), msgid)
        for key in meta.keys:
            kb = key.encode("utf-8")
            if kb and len(kb) <= _MAX_INDEXED_KEY:
                batch.put(K.keyidx_key(w.segment_base, tid, kb, w.physical_offset), K.U32.pack(w.size), keyidx)
        seg_max[(w.segment_base, tid, meta.queue_id)] = w.queue_offset
        touched.add((meta.topic, meta.queue_id))
    for (base, tid, qid), qoff in seg_max.items():
        batch.put(K.segq_key(base, tid, qid), K.U64.pack(qoff), segq)
    last = records[-1]
    index.put_checkpoint(batch, last.physical_offset + last.size)
    index.write(batch)
    return touched


class Dispatcher:
    def __init__(self, index: Index, config: DispatchConfig, start_position: int) -> None:
        self._index = index
        self._cfg = config
        self.position = start_position
        self._queue: queue.SimpleQueue[list[Written] | None] = queue.SimpleQueue()
        self._listeners: list[DispatchListener] = []
        self._cond = threading.Condition()
        self.last_lag_ms = 0
        self.max_lag_ms = 0
        self.records = 0
        self.failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="store-dispatcher", daemon=True)
        self._thread.start()

    def add_listener(self, listener: DispatchListener) -> None:
        self._listeners.append(listener)

    def submit(self, written: list[Written]) -> None:
        if written:
            self._queue.put(written)

    def wait_for(self, position: int, timeout_s: float) -> bool:
        """Block until everything before `position` is dispatched; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.position < position:
                left = deadline - time.monotonic()
                if left <= 0 or self.failed is not None:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            records = list(first)
            stop = False
            while len(records) < self._cfg.max_batch_records:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                records.extend(more)
            self._dispatch(records)
            if stop:
                return

    def _dispatch(self, records: list[Written]) -> None:
        try:
            touched = index_records(self._index, records)
        except Exception as exc:  # RocksDB failure: stop dispatching, keep the commitlog as truth
            self.failed = exc
            log.exception("dispatch failed; records stay in the commitlog and are re-dispatched on restart")
            with self._cond:
                self._cond.notify_all()
            return
        now_ms = time.time_ns() // 1_000_000
        lag = max(0, now_ms - records[0].store_timestamp_ms)
        self.last_lag_ms = lag
        self.max_lag_ms = max(self.max_lag_ms, lag)
        self.records += len(records)
        last = records[-1]
        with self._cond:
            self.position = last.physical_offset + last.size
            self._cond.notify_all()
        for listener in self._listeners:
            try:
                listener(touched)
            except Exception:
                log.exception("dispatch listener failed", extra=kv(listener=repr(listener)))
