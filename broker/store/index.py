"""The store's RocksDB: column families, topic interning, and the read-side index queries.

One RocksDB instance per broker (via rocksdict, raw bytes keys). Column families are listed in
keys.py; other broker modules (pop state, metadata) add their own through `extra_cfs`, so a
single WriteBatch can update the store and broker state atomically.

Thread-safety: RocksDB handles are thread-safe. Topic interning is done by the writer thread
(which runs the dispatch) only (`intern_topic`); lookups (`topic_id`) may run on any thread.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import rocksdict

from broker.store import keys as K
from broker.store.statelog import RecordingBatch, StateRecorder
from common.config import ConfigError


class StoreLocked(ConfigError):
    """The index's RocksDB lock is held: by another process, or by this one's handles of a store it
    closed but whose last references (a call still in flight on it) are not gone yet."""


@dataclass(frozen=True, slots=True)
class CqEntry:
    queue_offset: int
    physical_offset: int
    size: int
    tag_hash: int
    store_timestamp_ms: int


def _options(cache: rocksdict.Cache) -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    opts.increase_parallelism(2)
    return opts


_DEFAULT_CF = "default"  # RocksDB's own, always present


class Index:
    def __init__(
        self, path: Path, *, cache_bytes: int = 64 << 20, write_buffer_bytes: int = 128 << 20,
        extra_cfs: Sequence[str] = (),
    ) -> None:  # fmt: skip
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        # One block cache and one memtable budget for every column family: memory is bounded by
        # configuration, not by how many column families features add or how much they hold.
        cache = rocksdict.Cache(cache_bytes)
        opts = _options(cache)
        opts.set_db_write_buffer_size(write_buffer_bytes)
        names = list(K.STORE_CFS) + [n for n in extra_cfs if n not in K.STORE_CFS]
        # RocksDB refuses to open a database without naming every column family it holds, so
        # those this opener does not use (one a layout change retired, or a feature's this
        # opener leaves out) are opened too; `unused_cfs` names them and `drop_cf` removes one.
        existing = rocksdict.Rdict.list_cf(str(path), opts) if (path / "CURRENT").exists() else []
        self.unused_cfs = frozenset(existing) - {*names, _DEFAULT_CF}
        try:
            self.db = rocksdict.Rdict(
                str(path), opts, column_families={n: _options(cache) for n in [*names, *sorted(self.unused_cfs)]}
            )
        except Exception as exc:  # rocksdict raises a bare Exception carrying RocksDB's status text
            if "lock" in str(exc).lower():
                raise StoreLocked(
                    f"data directory {path.parent} is in use by another process (RocksDB lock {path / 'LOCK'}): "
                    "is another broker or sluice up running on it? give each its own --data-dir"
                ) from None
            raise
        self._cf = {n: self.db.get_column_family(n) for n in [*names, *self.unused_cfs]}
        self._handles = {n: self.db.get_column_family_handle(n) for n in self._cf}
        self._topic_ids: dict[str, int] = {}
        self._topic_names: dict[int, str] = {}
        self._intern_lock = threading.Lock()
        # Topic -> CommitLog position of its last deletion record (deletion.py), for the topics
        # deleted since the oldest record the CommitLog still holds (`forget_deletions_before`).
        self._deleted: dict[str, int] = {}
        # A replicated primary's recorder of consumer state changes (statelog.py); None: batches
        # are plain RocksDB WriteBatches, as without replication.
        self.recorder: StateRecorder | None = None
        self._load_topics()

    # -- plumbing ------------------------------------------------------------------------------

    def cf(self, name: str) -> rocksdict.Rdict:
        return self._cf[name]

    def handle(self, name: str) -> rocksdict.ColumnFamily:
        return self._handles[name]

    def drop_cf(self, name: str) -> None:
        """Drop an unused column family and everything it holds (a layout change's migration,
        once it has moved what it needs out of it); nothing if there is no such unused one."""
        if name not in self.unused_cfs:
            return
        self._cf.pop(name).close()
        del self._handles[name]
        self.db.drop_column_family(name)
        self.unused_cfs -= {name}

    def batch(self) -> rocksdict.WriteBatch:
        recorder = self.recorder
        if recorder is None:
            return rocksdict.WriteBatch(raw_mode=True)
        return RecordingBatch(recorder.names)  # WriteBatch's methods, recorded

    def write(self, batch: rocksdict.WriteBatch | RecordingBatch) -> int:
        """Apply `batch`; the number of the replicated state change it recorded (statelog.py), 0
        when it recorded none (no recorder, or nothing on a replicated column family)."""
        if type(batch) is not RecordingBatch:
            self.db.write(batch)
            return 0
        recorder = self.recorder
        if not batch.ops or recorder is None:
            self.db.write(batch.wb)
            return 0
        with recorder.lock:  # numbered in the order RocksDB applies them (statelog.py)
            self.db.write(batch.wb)
            recorder.record(batch.ops)
            return recorder.seq

    def close(self) -> None:
        """Flush and release the database. RocksDB keeps its lock while any handle (column family,
        iterator) is alive, so every reference is dropped before closing."""
        self.db.flush()
        for cf in self._cf.values():
            cf.close()
        self._cf.clear()
        self._handles.clear()
        self.db.close()
        del self.db
        gc.collect()

    def size_bytes(self) -> int:
        """Bytes of live SST files and memtables across all column families."""
        total = 0
        for name in self._cf:
            cf = self._cf[name]
            for prop in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
                total += cf.property_int_value(prop) or 0
        return total

    # -- topics ----------------------------------------------------------------------------------

    def _load_topics(self) -> None:
        meta = self._cf[K.CF_META]
        for key, value in meta.items(from_key=K.META_TOPIC_PREFIX):
            if not key.startswith(K.META_TOPIC_PREFIX):
                break
            tid = int.from_bytes(value, "big")
            name = key[len(K.META_TOPIC_PREFIX) :].decode("utf-8")
            self._topic_ids[name] = tid
            self._topic_names[tid] = name
        for key, value in meta.items(from_key=K.META_DELETED_PREFIX):
            if not key.startswith(K.META_DELETED_PREFIX):
                break
            self._deleted[key[len(K.META_DELETED_PREFIX) :].decode("utf-8")] = int(K.U64.unpack(value)[0])

    def topic_id(self, name: str) -> int | None:
        return self._topic_ids.get(name)

    def topic_name(self, topic_id: int) -> str | None:
        return self._topic_names.get(topic_id)

    def topics(self) -> list[str]:
        return sorted(self._topic_ids)

    def intern_topic(self, name: str, batch: rocksdict.WriteBatch) -> int:
        """The id of `name`, allocating one (persisted through `batch`) if it is new."""
        tid = self._topic_ids.get(name)
        if tid is not None:
            return tid
        with self._intern_lock:
            tid = self._topic_ids.get(name)
            if tid is not None:
                return tid
            tid = len(self._topic_ids) + 1
            meta = self._handles[K.CF_META]
            batch.put(K.topic_name_key(name), tid.to_bytes(4, "big"), meta)
            batch.put(K.topic_id_key(tid), name.encode("utf-8"), meta)
            self._topic_ids[name] = tid
            self._topic_names[tid] = name
            return tid

    # -- deleted topics (deletion.py) ---------------------------------------------------------------

    def deleted_at(self, topic: str) -> int:
        """The CommitLog position of the topic's last deletion record (-1: not deleted since the
        oldest record the log holds): every record of the topic stored before it is gone."""
        return self._deleted.get(topic, -1)

    def note_deleted(self, topic: str, position: int) -> None:
        """Remember a deletion the dispatcher wrote (after its batch is written; writer thread)."""
        self._deleted[topic] = position

    def forget_deletions_before(self, position: int) -> None:
        """Forget the deletions older than the oldest record the CommitLog still holds (retention
        moved it to `position`): no record they could hide is left."""
        stale = [t for t, at in list(self._deleted.items()) if at < position]  # a copy: the writer adds
        if not stale:
            return
        batch = self.batch()
        meta = self._handles[K.CF_META]
        for topic in stale:
            batch.delete(K.deleted_key(topic), meta)
        self.write(batch)
        for topic in stale:
            self._deleted.pop(topic, None)

    def incarnation_floor(self, topic_id: int, queue_id: int) -> int:
        """The first offset of the queue since its topic was last deleted (0: never deleted)."""
        raw = self._cf[K.CF_META].get(K.incarnation_key(topic_id, queue_id))
        return 0 if raw is None else int(K.U64.unpack(raw)[0])

    def incarnation_floors(self, topic_id: int) -> dict[int, int]:
        """`incarnation_floor` of every queue of the topic that held messages when it was deleted."""
        return {qid: floor for qid, floor in self._queue_values(K.incarnation_prefix(topic_id))}

    def queue_floors(self, topic_id: int) -> dict[int, int]:
        """The floor of each queue of the topic that has one (retention or a deletion emptied it)."""
        return dict(self._queue_values(K.queue_floor_prefix(topic_id)))

    def _queue_values(self, prefix: bytes) -> Iterator[tuple[int, int]]:
        """(queue id, u64 value) of the `meta` keys `prefix` (a two-byte kind, topic id) + queue id."""
        for key, value in self._prefix_scan(K.CF_META, prefix):
            yield int(K.U32BE.unpack_from(key, len(prefix))[0]), int(K.U64.unpack(value)[0])

    # -- checkpoint ------------------------------------------------------------------------------

    def checkpoint(self) -> int | None:
        raw = self._cf[K.CF_META].get(K.META_CHECKPOINT)
        return None if raw is None else int(K.U64.unpack(raw)[0])

    def put_checkpoint(self, batch: rocksdict.WriteBatch, position: int) -> None:
        batch.put(K.META_CHECKPOINT, K.U64.pack(position), self._handles[K.CF_META])

    # -- consume queue ---------------------------------------------------------------------------

    # ConsumeQueue keys name the first offset of a block of entries (keys.py): the block holding
    # offset o is the last key <= (topic, queue, o), if it reaches o.

    def cq_entries(self, topic_id: int, queue_id: int, start_offset: int) -> Iterator[CqEntry]:
        """ConsumeQueue entries of one queue from `start_offset` upward, in offset order."""
        prefix = K.queue_prefix(topic_id, queue_id)
        target = K.cq_key(topic_id, queue_id, start_offset)
        it = self._cf[K.CF_CQ].iter()
        it.seek_for_prev(target)
        skip = 0
        if not it.valid():
            it.seek(target)
        else:
            key = it.key()
            if key.startswith(prefix) and K.cq_block_end(key, it.value()) > start_offset:
                skip = start_offset - K.cq_key_parse(key)[2]  # the start is inside this block
            else:
                it.next()  # the first key after the target: the first block above it
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            offset = K.cq_key_parse(key)[2] + skip
            for phys, size, tag_hash, ts in islice(K.CQ_VALUE.iter_unpack(it.value()), skip, None):
                yield CqEntry(offset, phys, size, tag_hash, ts)
                offset += 1
            skip = 0
            it.next()

    def cq_heads(self, topic_id: int, positions: Sequence[tuple[int, int]]) -> list[tuple[CqEntry | None, bool]]:
        """For each (queue, offset) of one topic: the ConsumeQueue entry at exactly that offset (None
        when no stored block holds it: the queue ends there, or retention deleted it) and whether
        the queue holds an entry after it. A lite topic's pop reads the heads of up to 32 queues.

        A head usually starts a block (a send spread over many lite topics stores one entry per lite
        topic and dispatch round), so the keys at each offset and the one after come from one
        multi-get: a block there holding more than one entry, or a block right after it, means another
        entry follows (a queue's blocks are contiguous: the next one starts where one ends). A head
        inside a longer block takes a seek of one iterator shared by those heads."""
        cq = self._cf[K.CF_CQ]
        pack = K.CQ_KEY.pack
        raws = cq.get([pack(topic_id, q, o + k) for q, o in positions for k in (0, 1)])
        unpack = K.CQ_VALUE.unpack_from
        out: list[tuple[CqEntry | None, bool]] = []
        it = None
        for i, (queue_id, offset) in enumerate(positions):
            block = raws[2 * i]
            if block is not None:
                phys, size, tag_hash, ts = unpack(block)
                more = len(block) > K.CQ_ENTRY or raws[2 * i + 1] is not None
                out.append((CqEntry(offset, phys, size, tag_hash, ts), more))
                continue
            if it is None:
                it = cq.iter()
            out.append(self._cq_head_in_block(it, topic_id, queue_id, offset))
        return out

    @staticmethod
    def _cq_head_in_block(
        it: rocksdict.RdictIter, topic_id: int, queue_id: int, offset: int
    ) -> tuple[CqEntry | None, bool]:
        """`cq_heads` of one offset that starts no block: the block before it, if it reaches it."""
        prefix = K.queue_prefix(topic_id, queue_id)
        it.seek_for_prev(K.cq_key(topic_id, queue_id, offset))
        if not it.valid() or not it.key().startswith(prefix):
            return None, False
        key, value = it.key(), it.value()
        first = K.cq_key_parse(key)[2]
        end = first + len(value) // K.CQ_ENTRY
        if end <= offset:
            return None, False
        phys, size, tag_hash, ts = K.CQ_VALUE.unpack_from(value, (offset - first) * K.CQ_ENTRY)
        more = end > offset + 1
        if not more:
            it.next()
            more = it.valid() and it.key().startswith(prefix)
        return CqEntry(offset, phys, size, tag_hash, ts), more

    def cq_block(self, topic_id: int, queue_id: int, queue_offset: int) -> tuple[int, bytes] | None:
        """(first offset, entries) of the ConsumeQueue block holding `queue_offset`, if any."""
        it = self._cf[K.CF_CQ].iter()
        it.seek_for_prev(K.cq_key(topic_id, queue_id, queue_offset))
        if not it.valid():
            return None
        key = it.key()
        if not key.startswith(K.queue_prefix(topic_id, queue_id)):
            return None
        value: bytes = it.value()
        first = int(K.cq_key_parse(key)[2])
        return (first, value) if first + len(value) // K.CQ_ENTRY > queue_offset else None

    def segment_queue_max(self, topic_id: int, queue_id: int, listed: int, segment_end: int) -> int:
        """The highest offset of a queue whose record lies below `segment_end`, from `listed`, an
        offset of the queue in that segment (its `segq` value): a binary search over the
        ConsumeQueue, as a queue's records lie in offset order. The dispatcher lists a queue in a
        segment once, not with every round (keys.py), so the highest offset is found here. Entries
        already gone (tiering's local eviction) are not searched: `listed` if none is left."""
        low, high = self.queue_bounds(topic_id, queue_id)
        best, lo, hi = listed, max(listed, low), high
        while lo < hi:
            mid = (lo + hi) // 2
            block = self.cq_block(topic_id, queue_id, mid)
            if block is not None and K.CQ_VALUE.unpack_from(block[1], (mid - block[0]) * K.CQ_ENTRY)[0] < segment_end:
                best, lo = mid, mid + 1
            else:
                hi = mid
        return best

    def cq_entry(self, topic_id: int, queue_id: int, queue_offset: int) -> CqEntry | None:
        block = self.cq_block(topic_id, queue_id, queue_offset)
        if block is None:
            return None
        first, value = block
        phys, size, tag_hash, ts = K.CQ_VALUE.unpack_from(value, (queue_offset - first) * K.CQ_ENTRY)
        return CqEntry(queue_offset, phys, size, tag_hash, ts)

    def delete_cq_below(self, batch: rocksdict.WriteBatch, topic_id: int, queue_id: int, end: int) -> None:
        """Delete (through `batch`) a queue's ConsumeQueue entries below offset `end`, keeping those
        from `end` on. A range delete takes a block starting below `end` whole, so the part of a
        block that holds `end` is put back as a block of its own starting at `end`."""
        cq = self._handles[K.CF_CQ]
        straddling = self.cq_block(topic_id, queue_id, end)
        batch.delete_range(K.cq_key(topic_id, queue_id, 0), K.cq_key(topic_id, queue_id, end), cq)
        if straddling is not None and straddling[0] < end:
            first, value = straddling
            batch.put(K.cq_key(topic_id, queue_id, end), value[(end - first) * K.CQ_ENTRY :], cq)

    def queue_bounds(self, topic_id: int, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset + 1) of a queue's dispatched entries; (0, 0) when it never had any.

        A queue whose entries retention deleted entirely is (floor, floor): it still ends where it
        ended, so readers get OFFSET_TOO_SMALL and the writer continues its offsets after a restart.
        """
        prefix = K.queue_prefix(topic_id, queue_id)
        it = self._cf[K.CF_CQ].iter()
        it.seek(prefix)
        if not it.valid() or not it.key().startswith(prefix):
            raw = self._cf[K.CF_META].get(K.queue_floor_key(topic_id, queue_id))
            floor = 0 if raw is None else int(K.U64.unpack(raw)[0])
            return floor, floor
        low = K.cq_key_parse(it.key())[2]
        it.seek_for_prev(K.cq_key(topic_id, queue_id, K.MAX_U64))
        return low, K.cq_block_end(it.key(), it.value())

    def queue_ends(self, topic_id: int) -> dict[int, int]:
        """One past the last dispatched offset of each queue of the topic that holds entries (two
        seeks per queue, whatever it holds)."""
        out: dict[int, int] = {}
        it = self._cf[K.CF_CQ].iter()
        qid = 0
        while True:
            it.seek(K.queue_prefix(topic_id, qid))
            if not it.valid():
                return out
            tid, found, _ = K.cq_key_parse(it.key())
            if tid != topic_id:
                return out
            it.seek_for_prev(K.cq_key(topic_id, found, K.MAX_U64))
            out[found] = K.cq_block_end(it.key(), it.value())
            qid = found + 1

    def queue_ids(self, topic_id: int) -> list[int]:
        """Queue ids of a topic that hold at least one dispatched entry (skips along the keyspace)."""
        out: list[int] = []
        it = self._cf[K.CF_CQ].iter()
        qid = 0
        while True:
            it.seek(K.queue_prefix(topic_id, qid))
            if not it.valid():
                return out
            tid, found, _ = K.cq_key_parse(it.key())
            if tid != topic_id:
                return out
            out.append(found)
            qid = found + 1

    # -- lookups by id and key -------------------------------------------------------------------

    def _prefix_scan(self, cf: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._cf[cf].iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            yield it.key(), it.value()
            it.next()

    def find_by_id(self, segment_bases: Sequence[int], message_id: str) -> list[tuple[int, int]]:
        """(physical offset, size) of every record with this message id, oldest first."""
        mid = message_id.encode("utf-8")
        if len(mid) > 255:
            return []
        hits: list[tuple[int, int]] = []
        for base in segment_bases:
            for key, value in self._prefix_scan(K.CF_MSGID, K.msgid_prefix(base, mid)):
                hits.append((K.trailing_offset(key), K.U32.unpack(value)[0]))
        return hits

    def find_by_key(
        self, segment_bases: Sequence[int], topic_id: int, key: str, limit: int, after: int = -1
    ) -> list[tuple[int, int]]:
        """(physical offset, size) of up to `limit` records of the topic with this key, oldest
        first, of those stored after position `after` (the topic's deletion)."""
        kb = key.encode("utf-8")
        hits: list[tuple[int, int]] = []
        for base in segment_bases:
            for k, value in self._prefix_scan(K.CF_KEYIDX, K.keyidx_prefix(base, topic_id, kb)):
                phys = K.trailing_offset(k)
                if phys <= after:
                    continue
                hits.append((phys, K.U32.unpack(value)[0]))
                if len(hits) >= limit:
                    return hits
        return hits

    # -- consumer offsets ------------------------------------------------------------------------

    def get_offset(self, group: str, topic_id: int, queue_id: int) -> int | None:
        raw = self._cf[K.CF_OFFSETS].get(K.offsets_key(group, topic_id, queue_id))
        return None if raw is None else int(K.U64.unpack(raw)[0])

    def drop_offsets(self, topic_id: int) -> int:
        """Delete every group's committed offsets in the queues of a topic (one batch; a scan of
        every committed offset, which are keyed by group first). How many groups had some."""
        batch = self.batch()
        handle = self._handles[K.CF_OFFSETS]
        tid = K.U32BE.pack(topic_id)
        groups = 0
        it = self._cf[K.CF_OFFSETS].iter()
        it.seek_to_first()
        while it.valid():
            key = it.key()
            prefix = key[: K.U16BE.unpack_from(key)[0] + 2] + tid  # the group's offsets in the topic
            it.seek(prefix)
            if it.valid() and it.key().startswith(prefix):
                batch.delete_range(prefix, K.next_prefix(prefix), handle)
                groups += 1
            it.seek(K.next_prefix(key[: len(prefix) - 4]))  # the next group
        self.write(batch)
        return groups

    def put_offset(self, group: str, topic_id: int, queue_id: int, offset: int) -> None:
        batch = self.batch()  # a batch, so that a replicated primary records it
        batch.put(K.offsets_key(group, topic_id, queue_id), K.U64.pack(offset), self._handles[K.CF_OFFSETS])
        self.write(batch)
