"""The pending half messages of one broker: RocksDB column family `txn`, mirrored in memory.

Layout (keys big-endian, values little-endian):

    key   = physical_offset u64            (the half message's CommitLog position)
    value = format u8 (=1), state u8, queue_id u32, size u32, created_ms u64, next_check_ms u64,
            checks u32, topic length u16, topic (UTF-8), message id length u16, message id (UTF-8)

state 1 PENDING: waiting for EndTransaction or a check-back answer; 2 COMMITTING: a COMMIT was
accepted and is being appended to the topic (finished at startup if the broker died meanwhile).

Every entry is loaded at startup (their number is bounded by `transaction.max_pending`), and
check-back order lives in memory: one heap per topic of (next_check_ms, position), so a proxy's
claim for its producers' topics touches only those topics, plus one `final` heap of entries whose
last check was handed out (rolled back by the sweeper when it stays unanswered). Heaps are lazy:
an item whose entry is gone or was rescheduled is skipped when it surfaces.

Single writer: every mutation runs on the broker's event loop; each is one RocksDB write, and
memory follows only after it succeeded.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from broker.store.index import Index
from common.errors import StoreCorrupted

CF_TXN = "txn"
TXN_CFS = (CF_TXN,)

_FORMAT = 1
_KEY = struct.Struct(">Q")
_HEAD = struct.Struct("<BBIIQQI")
_LEN = struct.Struct("<H")


class HalfState(IntEnum):
    PENDING = 1
    COMMITTING = 2


@dataclass(slots=True)
class HalfEntry:
    position: int  # CommitLog position of the half message
    size: int
    topic: str
    queue_id: int
    message_id: str
    created_ms: int
    next_check_ms: int
    checks: int = 0  # check-backs handed out so far
    state: HalfState = HalfState.PENDING

    def encode(self) -> bytes:
        topic, mid = self.topic.encode(), self.message_id.encode()
        head = _HEAD.pack(_FORMAT, self.state, self.queue_id, self.size, self.created_ms, self.next_check_ms,
                          self.checks)  # fmt: skip
        return b"".join((head, _LEN.pack(len(topic)), topic, _LEN.pack(len(mid)), mid))

    @classmethod
    def decode(cls, key: bytes, raw: bytes) -> HalfEntry:
        try:
            fmt, state, qid, size, created, due, checks = _HEAD.unpack_from(raw)
            if fmt != _FORMAT:
                raise ValueError(f"unknown format {fmt}")
            pos = _HEAD.size
            (n,) = _LEN.unpack_from(raw, pos)
            topic = raw[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            (n,) = _LEN.unpack_from(raw, pos)
            mid = raw[pos + 2 : pos + 2 + n].decode()
            (position,) = _KEY.unpack(key)
            return cls(position, size, topic, qid, mid, created, due, checks, HalfState(state))
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise StoreCorrupted(f"transaction entry {key.hex()} cannot be decoded: {exc}") from None


class PendingTable:
    def __init__(self, index: Index, max_checks: int) -> None:
        self._index = index
        self._cf = index.cf(CF_TXN)
        self._max_checks = max_checks
        self.entries: dict[int, HalfEntry] = {}
        self._due: dict[str, list[tuple[int, int]]] = {}  # topic -> heap of (next_check_ms, position)
        self._final: list[tuple[int, int]] = []  # last check handed out: (answer deadline, position)
        self.per_topic: dict[str, int] = {}

    def load(self) -> list[HalfEntry]:
        """Read every entry into memory; returns those left COMMITTING by a crash."""
        it = self._cf.iter()
        it.seek_to_first()
        while it.valid():
            self._remember(HalfEntry.decode(it.key(), it.value()))
            it.next()
        return [e for e in self.entries.values() if e.state is HalfState.COMMITTING]

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, position: int) -> HalfEntry | None:
        return self.entries.get(position)

    # -- mutations (event loop only) -------------------------------------------------------------

    def put_many(self, entries: list[HalfEntry]) -> None:
        batch = self._index.batch()
        handle = self._index.handle(CF_TXN)
        for e in entries:
            batch.put(_KEY.pack(e.position), e.encode(), handle)
        self._index.write(batch)
        for e in entries:
            self._remember(e)

    def update(self, entry: HalfEntry) -> None:
        """Persist a changed entry (state, checks, next check) and reschedule it."""
        batch = self._index.batch()  # a batch, so that a replicated primary records it
        batch.put(_KEY.pack(entry.position), entry.encode(), self._index.handle(CF_TXN))
        self._index.write(batch)
        self._schedule(entry)

    def delete(self, entry: HalfEntry) -> None:
        batch = self._index.batch()
        batch.delete(_KEY.pack(entry.position), self._index.handle(CF_TXN))
        self._index.write(batch)
        if self.entries.pop(entry.position, None) is not None:
            left = self.per_topic.get(entry.topic, 1) - 1
            if left > 0:
                self.per_topic[entry.topic] = left
            else:
                self.per_topic.pop(entry.topic, None)

    # -- check-back order ------------------------------------------------------------------------

    def due(self, topic: str, now_ms: int) -> Iterator[HalfEntry]:
        """PENDING entries of `topic` due for a check-back (with checks left), earliest first.

        The caller must reschedule (`update`) or delete each entry it takes before asking for the next.
        """
        heap = self._due.get(topic)
        while heap and heap[0][0] <= now_ms:
            due_ms, position = heapq.heappop(heap)
            entry = self.entries.get(position)
            if entry is not None and self._in_topic_heap(entry) and entry.next_check_ms == due_ms:
                yield entry
        if heap is not None and not heap:
            self._due.pop(topic, None)

    def unanswered(self, now_ms: int) -> Iterator[HalfEntry]:
        """PENDING entries whose last allowed check-back went unanswered by now."""
        while self._final and self._final[0][0] <= now_ms:
            due_ms, position = heapq.heappop(self._final)
            entry = self.entries.get(position)
            if entry is not None and not self._in_topic_heap(entry) and entry.next_check_ms == due_ms:
                yield entry

    def _in_topic_heap(self, entry: HalfEntry) -> bool:
        return entry.state is HalfState.PENDING and entry.checks < self._max_checks

    def _remember(self, entry: HalfEntry) -> None:
        if entry.position not in self.entries:
            self.per_topic[entry.topic] = self.per_topic.get(entry.topic, 0) + 1
        self.entries[entry.position] = entry
        self._schedule(entry)

    def requeue(self, entry: HalfEntry) -> None:
        """Put back an entry taken from `due` without changing it."""
        self._schedule(entry)

    def _schedule(self, entry: HalfEntry) -> None:
        if entry.state is not HalfState.PENDING:
            return  # a COMMITTING entry is finished by its committer (or at startup), never checked
        item = (entry.next_check_ms, entry.position)
        if self._in_topic_heap(entry):
            heapq.heappush(self._due.setdefault(entry.topic, []), item)
        else:
            heapq.heappush(self._final, item)
