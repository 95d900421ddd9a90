"""Reading one `ScanTask` on an executor: fetch the object (or only the row groups needed), filter, shape.

- A `whole` task is one GET of the object.
- Otherwise: one GET of the object's tail (the Parquet footer; a second one only if the footer is
  larger), then the row groups that start inside the task's byte range and whose statistics
  (`queue_id`, `queue_offset`, `store_timestamp`) overlap the wanted range, fetched as coalesced
  byte ranges (one GET per run of neighbouring row groups).

Page CRCs are verified and the file's `sluice.format_version` checked; a damaged or foreign object
raises `MessageCorrupted` naming the object. Rows are then filtered exactly (queues, offsets, time,
keys, message ids) with pyarrow compute and returned as Arrow record batches in `schema.ARROW_SCHEMA`.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import MessageCorrupted
from common.logs import kv
from spark_jobs.layout import FORMAT_VERSION
from spark_jobs.options import ScanOptions
from spark_jobs.planner import ScanTask
from spark_jobs.s3 import Bucket, S3Settings
from spark_jobs.schema import ARROW_SCHEMA, READ_COLUMNS

log = logging.getLogger("sluice.spark.scan")

TAIL_BYTES = 64 << 10  # one GET usually holds the whole footer of a segment
COALESCE_GAP_BYTES = 1 << 20  # neighbouring row groups closer than this are fetched in one GET
BATCH_ROWS = 8192
_DECODE_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError)
_FOOTER_TRAILER = 8  # u32 footer length + "PAR1"


class _SparseObject(io.RawIOBase):
    """A read-only file over the byte ranges of one object fetched so far; other reads GET what they need."""

    def __init__(self, bucket: Bucket, key: str, size: int) -> None:
        self._bucket, self._key, self._size = bucket, key, size
        self._ranges: list[tuple[int, bytes]] = []
        self._pos = 0

    def add(self, start: int, data: bytes) -> None:
        self._ranges.append((start, data))

    def fetch(self, start: int, end: int) -> bytes:
        data = self._bucket.get(self._key, start, end)
        self.add(start, data)
        return data

    def covered(self, start: int, end: int) -> bool:
        return any(base <= start and end <= base + len(data) for base, data in self._ranges)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        start, end = self._pos, self._pos + want
        for base, data in self._ranges:
            if base <= start and end <= base + len(data):
                buffer[:want] = data[start - base : end - base]
                break
        else:
            buffer[:want] = self.fetch(start, end)
        self._pos = end
        return want

    def footer(self, tail_bytes: int) -> pq.FileMetaData:
        """The file's metadata from its tail: one GET, a second one only for a footer larger than `tail_bytes`."""
        tail_start = max(0, self._size - tail_bytes)
        tail = self.fetch(tail_start, self._size)
        length = int.from_bytes(tail[-_FOOTER_TRAILER:-4], "little") + _FOOTER_TRAILER
        if tail[-4:] != b"PAR1" or length > self._size:
            raise ValueError("no Parquet footer at the end of the object")
        if length > len(tail):
            tail = self.fetch(self._size - length, tail_start) + tail
        return pq.read_metadata(pa.BufferReader(tail[len(tail) - length :]))


@dataclass(frozen=True)
class _Wanted:
    """Row-group pruning by statistics: does [min, max] of a column overlap the wanted range?"""

    opts: ScanOptions

    def row_group(self, meta: pq.RowGroupMetaData, columns: dict[str, int]) -> bool:
        q = _stats(meta, columns.get("queue_id"))
        if q is not None and self.opts.queues is not None and not any(q[0] <= x <= q[1] for x in self.opts.queues):
            return False
        o = _stats(meta, columns.get("queue_offset"))
        if o is not None and (o[1] < self.opts.from_offset or o[0] >= self.opts.to_offset):
            return False
        t = _stats(meta, columns.get("store_timestamp"))
        return t is None or not (_ms(t[1]) < self.opts.from_ms or _ms(t[0]) >= self.opts.to_ms)


def _ms(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def _stats(meta: pq.RowGroupMetaData, index: int | None) -> tuple[Any, Any] | None:
    if index is None:
        return None
    stats = meta.column(index).statistics
    if stats is None or not stats.has_min_max:
        return None
    return stats.min, stats.max


def _row_group_span(meta: pq.RowGroupMetaData) -> tuple[int, int]:
    starts, ends = [], []
    for c in range(meta.num_columns):
        cc = meta.column(c)
        begin = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
        starts.append(begin)
        ends.append(begin + cc.total_compressed_size)
    return min(starts), max(ends)


def _coalesce(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] <= COALESCE_GAP_BYTES:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _open(source: object, where: str, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
    try:
        pf = pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True)
    except _DECODE_ERRORS as exc:
        raise MessageCorrupted(f"{where} is not a readable Parquet segment: {exc}") from None
    meta = {k.decode(): v.decode() for k, v in (pf.metadata.metadata or {}).items()}
    version = meta.get("sluice.format_version")
    if version != str(FORMAT_VERSION):
        raise MessageCorrupted(f"{where} has format version {version}; this reader supports {FORMAT_VERSION}")
    return pf


def _selected_row_groups(pf: pq.ParquetFile, task: ScanTask, opts: ScanOptions) -> tuple[list[int], list]:
    meta = pf.metadata
    columns = {meta.schema.column(i).name: i for i in range(meta.num_columns)}
    wanted = _Wanted(opts)
    picked, spans = [], []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        span = _row_group_span(rg)
        if task.start <= span[0] < task.end and wanted.row_group(rg, columns):
            picked.append(i)
            spans.append(span)
    return picked, spans


def _read_table(task: ScanTask, opts: ScanOptions, bucket: Bucket) -> pa.Table | None:
    seg = task.segment
    where = f"object {seg.key!r} in {opts.s3.describe()}"
    if task.whole:
        pf = _open(pa.BufferReader(bucket.get(seg.key)), where)
        groups = list(range(pf.metadata.num_row_groups))
    else:
        sparse = _SparseObject(bucket, seg.key, seg.size)
        try:
            metadata = sparse.footer(TAIL_BYTES)
        except _DECODE_ERRORS as exc:
            raise MessageCorrupted(f"{where} is not a readable Parquet segment: {exc}") from None
        pf = _open(pa.PythonFile(sparse, mode="r"), where, metadata)
        groups, spans = _selected_row_groups(pf, task, opts)
        for start, end in _coalesce(spans):
            if not sparse.covered(start, end):  # a small object came whole with its footer
                sparse.fetch(start, end)
    if not groups:
        return None
    names = set(pf.schema_arrow.names)
    missing = [c for c in READ_COLUMNS if c not in names]
    if missing:
        raise MessageCorrupted(f"{where} lacks column(s) {', '.join(missing)}")
    try:
        return pf.read_row_groups(groups, columns=READ_COLUMNS)
    except _DECODE_ERRORS as exc:
        raise MessageCorrupted(f"{where} is unreadable (row groups {groups}): {exc}") from None


def _row_filter(table: pa.Table, opts: ScanOptions) -> pa.Array | None:
    masks = []
    if opts.queues is not None:
        masks.append(pc.is_in(table["queue_id"], pa.array(sorted(opts.queues), pa.int32())))
    if opts.from_offset > 0:
        masks.append(pc.greater_equal(table["queue_offset"], opts.from_offset))
    if opts.to_offset < (1 << 63) - 1:
        masks.append(pc.less(table["queue_offset"], opts.to_offset))
    stored = pc.cast(table["store_timestamp"], pa.int64())
    if opts.from_ms > 0:
        masks.append(pc.greater_equal(stored, opts.from_ms))
    if opts.to_ms < (1 << 63) - 1:
        masks.append(pc.less(stored, opts.to_ms))
    wanted = []  # a message with one of the keys OR one of the ids
    if opts.message_ids is not None:
        wanted.append(pc.is_in(table["message_id"], pa.array(sorted(opts.message_ids), pa.string())))
    if opts.keys is not None:
        keys = table["keys"].combine_chunks()
        hit = pc.is_in(pc.list_flatten(keys), pa.array(sorted(opts.keys), pa.string()))
        parents = pc.filter(pc.list_parent_indices(keys), hit)
        wanted.append(pc.is_in(pa.array(range(table.num_rows), pa.int64()), parents))
    if wanted:
        masks.append(wanted[0] if len(wanted) == 1 else pc.or_(wanted[0], wanted[1]))
    if not masks:
        return None
    mask = masks[0]
    for m in masks[1:]:
        mask = pc.and_(mask, m)
    return mask


def _shape(table: pa.Table, task: ScanTask) -> pa.Table:
    seg, n = task.segment, table.num_rows
    columns: list[pa.Array | pa.ChunkedArray] = [pa.array([seg.cluster] * n), pa.array([seg.broker] * n)]
    columns.append(pa.array([seg.topic] * n))
    for field in ARROW_SCHEMA:
        if field.name in table.column_names:
            columns.append(table[field.name].cast(field.type))
    columns.append(pa.array([seg.key] * n))
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


_buckets: dict[S3Settings, Bucket] = {}
_buckets_lock = threading.Lock()


def shared_bucket(settings: S3Settings) -> Bucket:
    """One client per settings per Python worker: building a boto3 client costs more than a small GET."""
    with _buckets_lock:
        bucket = _buckets.get(settings)
        if bucket is None:
            bucket = _buckets[settings] = Bucket(settings)
        return bucket


def read_task(task: ScanTask, opts: ScanOptions, bucket: Bucket | None = None) -> Iterator[pa.RecordBatch]:
    """The wanted rows of one task as record batches of at most BATCH_ROWS rows."""
    bucket = bucket or shared_bucket(opts.s3)
    table = _read_table(task, opts, bucket)
    if table is None:
        return
    mask = _row_filter(table, opts)
    if mask is not None:
        table = table.filter(mask)
    log.debug("task read", extra=kv(key=task.segment.key, rows=table.num_rows, gets=bucket.gets))
    yield from _shape(table, task).to_batches(max_chunksize=BATCH_ROWS)
