"""The cold reader: messages of offsets no longer on local disk, read back from tiered segments.

`read(topic, queue_id, offset, max_messages)` looks the offset up in the manifest, fetches only the
row groups it needs (fetch.py: one ranged GET each, plus one for a segment's footer), keeps decoded
row groups and footers in a byte-bounded LRU (`cache_bytes`), and keeps the next
`read_ahead_row_groups` row groups of the queue decoded or on their way in the background (a run of
them fetched with one GET of its span) so a consumer catching up reads from memory; `read_cached` is
the same read answered from memory only (None if it would need I/O), for the event loop.
Records come back exactly as the CommitLog held them (body, properties, ids, offsets).

Lookups: by message id and by key scan the id / keys columns of at most `lookup_max_segments`
segments (newest first, optionally within a store-time window); `offset_for_timestamp` prunes by
the manifest's time ranges first. `expire(now_s)` applies tiered retention (expiry.py).

Failures: a read that needs the object store while it is unreachable raises `Unavailable` naming
the object (bounded by the client's timeouts, never a hang); a corrupt or truncated object raises
`SegmentCorrupted` (a `MessageCorrupted`) naming it, and other segments stay readable.

Every method but `read_cached` and `bounds` is blocking (object store I/O): call it from a worker
thread. Thread-safe.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from broker.tiering import expiry
from broker.tiering.cache import LruCache
from broker.tiering.config import TieringConfig
from broker.tiering.fetch import fetch_footer, fetch_row_group, fetch_row_groups, scan_columns
from broker.tiering.manifest import Manifest, SegmentEntry
from broker.tiering.objectstore import ObjectStore
from broker.tiering.segment import table_to_records
from common.clock import SYSTEM_CLOCK, Clock
from common.logs import kv
from common.record import MessageRecord

log = logging.getLogger("sluice.tiering.reader")

_FOOTER = -1  # cache key index of a segment's footer
_LOOKUP_COLUMNS = ["queue_id", "queue_offset"]
_RECORD_OVERHEAD_BYTES = 600  # Python objects of one decoded record beyond its Arrow bytes (cache accounting)
_MAX_SPAN_BYTES = 16 << 20  # one read-ahead GET fetches at most this much (compressed)
_MAX_INFLIGHT_PER_READ_AHEAD = 4  # row groups prefetching at once, in units of read_ahead_row_groups


class ColdReader:
    def __init__(
        self, manifest: Manifest, objects: ObjectStore, config: TieringConfig, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.manifest = manifest
        self.objects = objects
        self.config = config
        self._clock = clock
        self._cache: LruCache[tuple[str, int], object] = LruCache(config.cache_bytes)
        self._prefetcher = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tier-readahead")
        # Row groups being prefetched; a read that needs one waits for it instead of fetching it twice.
        self._inflight: dict[tuple[str, int], threading.Event] = {}
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._prefetcher.shutdown(wait=True, cancel_futures=True)

    # -- segments and row groups -----------------------------------------------------------------

    def _footer(self, topic: str, entry: SegmentEntry) -> pq.FileMetaData:
        md = self._cache.get((entry.key, _FOOTER))
        if md is None:
            md = fetch_footer(self.objects, topic, entry)
            self._cache.put((entry.key, _FOOTER), md, md.serialized_size)
        assert isinstance(md, pq.FileMetaData)
        return md

    def _row_group(self, topic: str, entry: SegmentEntry, index: int) -> list[MessageRecord]:
        """The row group's records, decoded once and cached (reads of a few messages then cost a slice).

        Cached records are shared by every read: callers treat them as read-only."""
        key = (entry.key, index)
        records = self._cache.get(key)
        if records is None:
            with self._lock:
                prefetching = self._inflight.get(key)
            if prefetching is not None and prefetching.wait(self.config.read_timeout_s):
                records = self._cache.get(key)
        if records is None:
            records = self._load(topic, entry, index)
        assert isinstance(records, list)
        return records

    def _cached_row_group(self, topic: str, entry: SegmentEntry, index: int) -> list[MessageRecord] | None:
        records = self._cache.get((entry.key, index))
        assert records is None or isinstance(records, list)
        return records

    def _load(self, topic: str, entry: SegmentEntry, index: int) -> list[MessageRecord]:
        table = fetch_row_group(self.objects, entry, self._footer(topic, entry), index)
        return self._decoded(topic, entry, index, table)

    def _decoded(self, topic: str, entry: SegmentEntry, index: int, table: pa.Table) -> list[MessageRecord]:
        records = table_to_records(table, topic)
        self._cache.put((entry.key, index), records, table.nbytes + _RECORD_OVERHEAD_BYTES * len(records))
        return records

    # -- reads -----------------------------------------------------------------------------------

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(first offset still tiered, tiered end) of a queue. Offsets below the first are gone (tiered
        retention): the caller answers OFFSET_TOO_SMALL instead of reading."""
        return self.manifest.bounds(topic, queue_id)

    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32) -> list[MessageRecord]:
        """Up to `max_messages` tiered messages of the queue from `offset` on, in offset order.

        Stops at the tiered end; starts at the next tiered offset if `offset` itself is not tiered
        (a gap left by local retention before tiering). Empty when nothing at or after it is tiered.
        """
        out = self._collect(topic, queue_id, offset, max_messages, self._row_group)
        assert out is not None
        return out

    def read_cached(self, topic: str, queue_id: int, offset: int, max_messages: int = 32) -> list[MessageRecord] | None:
        """What `read` answers, from row groups already decoded in memory; None when one it needs is not
        (then call `read`, in a worker thread). No I/O and no decoding: safe on the event loop, so a
        consumer catching up through prefetched row groups does not pay a thread hop per batch."""
        return self._collect(topic, queue_id, offset, max_messages, self._cached_row_group)

    def _collect(
        self, topic: str, queue_id: int, offset: int, max_messages: int,
        row_group: Callable[[str, SegmentEntry, int], list[MessageRecord] | None],
    ) -> list[MessageRecord] | None:  # fmt: skip
        out: list[MessageRecord] = []
        nxt = offset
        while len(out) < max_messages:
            loc = self.manifest.locate(topic, queue_id, nxt)
            if loc is None:
                break
            entry, index = loc
            records = row_group(topic, entry, index)
            if records is None:
                return None
            rows = _queue_rows(records, entry, index, queue_id, nxt, max_messages - len(out))
            out.extend(rows)
            ref = entry.row_groups[index]
            if rows and len(out) >= max_messages:
                nxt = out[-1].queue_offset + 1
                break
            nxt = ref.last_offset + 1 if ref.last_queue == queue_id else entry.queues[queue_id][1] + 1
        if out and self.config.read_ahead_row_groups and not self._closed:
            self._read_ahead(topic, queue_id, nxt)
        return out

    def _read_ahead(self, topic: str, queue_id: int, offset: int) -> None:
        """Keep the next `read_ahead_row_groups` row groups of the queue after the one holding `offset`
        decoded or on their way. When one of them is neither, fetch that many from it on in the
        background, each run of adjacent row groups of one object with one GET of its span: a
        sequential reader then costs about one request per `read_ahead_row_groups` row groups, and
        decoding (pyarrow, off the GIL) overlaps the consumer's pulls."""
        ahead = self.config.read_ahead_row_groups
        runs: list[tuple[SegmentEntry, list[int]]] = []
        wanted = 0
        nxt = offset
        with self._lock:
            for looked in range(1 + 2 * ahead):
                loc = self.manifest.locate(topic, queue_id, nxt)
                if loc is None:
                    break
                entry, index = loc
                key = (entry.key, index)
                if key in self._inflight or key in self._cache:
                    if wanted or looked >= ahead:  # a run stops at what is there; a full window needs nothing
                        break
                else:
                    if len(self._inflight) >= _MAX_INFLIGHT_PER_READ_AHEAD * ahead:
                        break
                    self._inflight[key] = threading.Event()
                    last = runs[-1] if runs else None
                    if (
                        last is not None
                        and last[0].key == entry.key
                        and last[1][-1] == index - 1
                        and _span(entry, last[1][0], index) <= _MAX_SPAN_BYTES
                    ):
                        last[1].append(index)
                    else:
                        runs.append((entry, [index]))
                    wanted += 1
                    if wanted >= ahead:
                        break
                ref = entry.row_groups[index]
                nxt = ref.last_offset + 1 if ref.last_queue == queue_id else entry.queues[queue_id][1] + 1
        for entry, indices in runs:
            try:
                self._prefetcher.submit(self._prefetch, topic, entry, indices)
            except RuntimeError:  # shut down
                for index in indices:
                    self._prefetched(entry, index)

    def _prefetch(self, topic: str, entry: SegmentEntry, indices: list[int]) -> None:
        pending = list(indices)
        try:
            md = self._footer(topic, entry)
            for index, table in fetch_row_groups(self.objects, entry, md, indices):
                self._decoded(topic, entry, index, table)
                pending.remove(index)
                self._prefetched(entry, index)  # after the cache holds it: a waiting read finds it there
        except Exception as exc:  # a later read reports it; read-ahead is only a hint
            log.debug("read-ahead failed", extra=kv(key=entry.key, row_groups=indices, error=str(exc)))
        finally:
            for index in pending:
                self._prefetched(entry, index)

    def _prefetched(self, entry: SegmentEntry, index: int) -> None:
        with self._lock:
            done = self._inflight.pop((entry.key, index), None)
        if done is not None:
            done.set()

    # -- lookups ---------------------------------------------------------------------------------

    def _candidates(self, topic: str, begin_ms: int | None, end_ms: int | None) -> list[SegmentEntry]:
        segs = [
            s
            for s in self.manifest.segments(topic)
            if (begin_ms is None or s.max_store_ms >= begin_ms) and (end_ms is None or s.min_store_ms <= end_ms)
        ]
        return segs[::-1][: self.config.lookup_max_segments]

    def _lookup(self, topic: str, column: str, match: Callable[[pa.Table], pa.Array], limit: int,
                begin_ms: int | None, end_ms: int | None) -> list[MessageRecord]:  # fmt: skip
        out: list[MessageRecord] = []
        for entry in self._candidates(topic, begin_ms, end_ms):
            md = self._footer(topic, entry)
            table = scan_columns(self.objects, entry, md, range(len(entry.row_groups)), [*_LOOKUP_COLUMNS, column])
            hits = table.filter(match(table))
            for qid, off in zip(hits["queue_id"].to_pylist(), hits["queue_offset"].to_pylist(), strict=True):
                out.extend(r for r in self.read(topic, qid, off, 1) if r.queue_offset == off)
                if len(out) >= limit:
                    return out
        return out

    def find_by_id(self, topic: str, message_id: str, *, begin_ms: int | None = None, end_ms: int | None = None,
                   limit: int = 16) -> list[MessageRecord]:  # fmt: skip
        """Tiered messages of `topic` with this message id (newest segments first)."""
        return self._lookup(topic, "message_id", lambda t: pc.equal(t["message_id"], message_id), limit,
                            begin_ms, end_ms)  # fmt: skip

    def find_by_key(self, topic: str, key: str, *, begin_ms: int | None = None, end_ms: int | None = None,
                    limit: int = 64) -> list[MessageRecord]:  # fmt: skip
        """Tiered messages of `topic` carrying `key` among their keys (newest segments first)."""

        def match(t: pa.Table) -> pa.Array:
            keys = t["keys"].combine_chunks()
            rows = pc.list_parent_indices(keys).filter(pc.equal(pc.list_flatten(keys), key))
            return pc.is_in(pa.array(range(t.num_rows), pa.int64()), value_set=rows.cast(pa.int64()))

        return self._lookup(topic, "keys", match, limit, begin_ms, end_ms)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first tiered offset of the queue stored at or after `timestamp_ms`; None if all are older."""
        scanned = 0
        for entry in self.manifest.queue_segments(topic, queue_id):
            if entry.max_store_ms < timestamp_ms:
                continue
            if scanned >= self.config.lookup_max_segments:
                break
            scanned += 1
            groups = [i for i, g in enumerate(entry.row_groups) if g.first_queue <= queue_id <= g.last_queue]
            md = self._footer(topic, entry)
            table = scan_columns(self.objects, entry, md, groups, [*_LOOKUP_COLUMNS, "store_timestamp"])
            stored = pc.cast(table["store_timestamp"], pa.int64())
            mask = pc.and_(pc.equal(table["queue_id"], queue_id), pc.greater_equal(stored, timestamp_ms))
            hits = table.filter(mask)["queue_offset"]
            if len(hits):
                return int(pc.min(hits).as_py())
        return None

    # -- tiered retention ------------------------------------------------------------------------

    def expire(self, now_s: float | None = None) -> int:
        """Delete whole objects whose newest message is older than the topic's tiered retention."""
        return expiry.expire(
            self.manifest, self.objects, self.config, self._clock.now_ms() / 1000 if now_s is None else now_s
        )


def _span(entry: SegmentEntry, first: int, last: int) -> int:
    """Bytes of row groups first..last of a segment (adjacent in the object)."""
    return entry.row_groups[last].end - entry.row_groups[first].start


def _queue_rows(
    records: list[MessageRecord], entry: SegmentEntry, index: int, queue_id: int, offset: int, limit: int
) -> list[MessageRecord]:
    """Up to `limit` records of the queue from `offset` on in one decoded row group.

    Rows are sorted by (queue_id, queue_offset) and a queue's offsets in a segment are consecutive,
    so the manifest's ranges give the slice directly (no scan of the row group); the slice's first and
    last records are checked, and anything unexpected falls back to scanning the row group.
    """
    ref = entry.row_groups[index]
    start = 0
    first = last = -1
    for q in sorted(entry.queues):
        if q < ref.first_queue or q > queue_id:
            continue
        q_first = ref.first_offset if q == ref.first_queue else entry.queues[q][0]
        q_last = ref.last_offset if q == ref.last_queue else entry.queues[q][1]
        if q == queue_id:
            first = max(offset, q_first)
            last = min(q_last, first + limit - 1)
            start += first - q_first
            break
        start += q_last - q_first + 1
    if 0 <= first <= last:
        rows = records[start : start + last - first + 1]
        if len(rows) == last - first + 1 and (rows[0].queue_id, rows[0].queue_offset, rows[-1].queue_id,
                                              rows[-1].queue_offset) == (queue_id, first, queue_id, last):  # fmt: skip
            return rows
    return [r for r in records if r.queue_id == queue_id and r.queue_offset >= offset][:limit]
