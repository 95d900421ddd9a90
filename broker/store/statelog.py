"""Changes to replicated RocksDB state, recorded as they are written (docs/replication.md, "State").

Off unless the store's durability records state (a replicated primary's `AckGate.attach` gives
the store's `Index` a `StateRecorder` as the store opens; broker/store/durability.py): then
`Index.batch()` hands out `RecordingBatch`es, which write to a RocksDB WriteBatch as before and
also keep the operations that touch a replicated column family. `Index.write` applies such a batch
and appends its operations to the recorder **under the recorder's lock**, as one numbered change
(`seq`, strictly increasing) tagged with the CommitLog's written position at that moment. So:

- changes are numbered in the order RocksDB applied them (replicas apply them in that order);
- a snapshot (`snapshot()`: one point-in-time iterator per column family, taken under the same
  lock) is exactly the state after change `seq` and before change `seq + 1`;
- a change never refers to a message beyond its position (it was dispatched, so written), and the
  primary sends a change only after the CommitLog up to that position.

Batches touching only other column families (the dispatcher's indexes) bypass the lock.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import rocksdict

PUT, DELETE, DELETE_RANGE = 1, 2, 3
# (kind, column family, key, value); a DELETE_RANGE's value is the (exclusive) end key.
Op = tuple[int, str, bytes, bytes]


@dataclass(frozen=True, slots=True)
class StateChange:
    seq: int
    position: int  # the CommitLog's written position when the change was made
    ops: list[Op]
    size: int  # bytes of keys and values, for the backlog bound


class RecordingBatch:
    """A RocksDB WriteBatch that also keeps its operations on replicated column families."""

    __slots__ = ("_names", "ops", "wb")

    def __init__(self, names: dict[int, str]) -> None:
        self.wb = rocksdict.WriteBatch(raw_mode=True)
        self.ops: list[Op] = []
        self._names = names  # id(column family handle) -> name, replicated families only

    def put(self, key: bytes, value: bytes, column_family: Any = None) -> None:
        self.wb.put(key, value, column_family)
        name = self._names.get(id(column_family))
        if name is not None:
            self.ops.append((PUT, name, key, value))

    def delete(self, key: bytes, column_family: Any = None) -> None:
        self.wb.delete(key, column_family)
        name = self._names.get(id(column_family))
        if name is not None:
            self.ops.append((DELETE, name, key, b""))

    def delete_range(self, begin: bytes, end: bytes, column_family: Any = None) -> None:
        self.wb.delete_range(begin, end, column_family)
        name = self._names.get(id(column_family))
        if name is not None:
            self.ops.append((DELETE_RANGE, name, begin, end))


class StateRecorder:
    """The numbered changes of a primary's replicated column families since replicas last caught up.

    Changes are kept only while someone streams them (`retain`, set by `snapshot()`), and at most
    `max_backlog_bytes` of them: a replica that needs a dropped change starts over from a snapshot.
    """

    def __init__(
        self, cfs: tuple[str, ...], handles: dict[str, Any], position: Callable[[], int], max_backlog_bytes: int
    ) -> None:
        self.cfs = cfs
        self.names = {id(handles[n]): n for n in cfs}
        self.lock = threading.Lock()
        self.seq = 0
        self.changes: collections.deque[StateChange] = collections.deque()
        self.retain = False
        self._backlog = 0
        self._max_backlog = max_backlog_bytes
        self._position = position
        self.on_change: Callable[[], None] | None = None  # wakes the senders (any thread)

    def record(self, ops: list[Op]) -> None:
        """Called by `Index.write` under `lock`, right after RocksDB applied the batch."""
        self.seq += 1
        if not self.retain:
            return
        size = sum(len(op[2]) + len(op[3]) for op in ops)
        self.changes.append(StateChange(self.seq, self._position(), ops, size))
        self._backlog += size
        while self._backlog > self._max_backlog and self.changes:
            self._backlog -= self.changes.popleft().size
        wake = self.on_change
        if wake is not None:
            wake()

    def since(self, seq: int) -> list[StateChange] | None:
        """The kept changes after `seq`, oldest first; None if some of them were dropped."""
        with self.lock:
            changes = self.changes
            if not changes:
                return [] if seq >= self.seq else None
            if changes[0].seq > seq + 1:
                return None
            skip = max(0, seq + 1 - changes[0].seq)
            return [changes[i] for i in range(skip, len(changes))]

    def release(self, upto: int | None) -> None:
        """Forget changes every stream has sent (`upto`); None: nobody streams, keep nothing."""
        with self.lock:
            if upto is None:
                self.retain = False
                upto = self.seq
            while self.changes and self.changes[0].seq <= upto:
                self._backlog -= self.changes.popleft().size

    def snapshot(self, cf: Callable[[str], rocksdict.Rdict]) -> tuple[int, list[tuple[str, Any]]]:
        """(seq, one point-in-time iterator per replicated column family): the state after change
        `seq`. From now on changes are kept for streaming."""
        with self.lock:
            self.retain = True
            iterators = [(name, cf(name).iter()) for name in self.cfs]
            return self.seq, iterators


def snapshot_ops(iterators: list[tuple[str, Any]]) -> Iterator[Op]:
    """The PUTs that rebuild a snapshot (reads RocksDB: run it off the event loop)."""
    for name, it in iterators:
        it.seek_to_first()
        while it.valid():
            yield PUT, name, it.key(), it.value()
            it.next()
