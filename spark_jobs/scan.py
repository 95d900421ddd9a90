"""Reading one `ScanTask` on an executor: fetch the object (or only the row groups needed), filter, shape.

- A `whole` task is one GET of the object.
- Otherwise: one GET of the object's tail (the Parquet footer; a second one only if the footer is
  larger), then the row groups that start inside the task's byte range and whose statistics
  (`queue_id`, `queue_offset`, `store_timestamp`) overlap the wanted range, fetched as coalesced
  byte ranges (one GET per run of neighbouring row groups).

Footer, metadata and ranged reads are broker/tiering/format.py's, the broker's own: page CRCs are
verified and the segment metadata checked; a damaged or foreign object raises `SegmentCorrupted`
(a `MessageCorrupted`) naming the object. Rows are then filtered exactly (queues, offsets, time,
keys, message ids) with pyarrow compute and returned as Arrow record batches in `schema.ARROW_SCHEMA`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from broker.tiering.format import (
    TAIL_BYTES,
    SegmentCorrupted,
    open_segment,
    read_footer,
    read_row_groups,
    row_group_span,
    segment_info,
)
from broker.tiering.objectstore import MeteredObjectStore, ObjectStore
from broker.tiering.s3settings import S3Settings
from broker.tiering.s3store import S3ObjectStore
from common.logs import kv
from spark_jobs.options import ScanOptions
from spark_jobs.planner import ScanTask
from spark_jobs.schema import READ_COLUMNS, shape

log = logging.getLogger("sluice.spark.scan")

COALESCE_GAP_BYTES = 1 << 20  # neighbouring row groups closer than this are fetched in one GET
BATCH_ROWS = 8192


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


def _coalesce(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] <= COALESCE_GAP_BYTES:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _selected_row_groups(pf: pq.ParquetFile, task: ScanTask, opts: ScanOptions) -> tuple[list[int], list]:
    meta = pf.metadata
    columns = {meta.schema.column(i).name: i for i in range(meta.num_columns)}
    wanted = _Wanted(opts)
    picked, spans = [], []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        span = row_group_span(rg)
        if task.start <= span[0] < task.end and wanted.row_group(rg, columns):
            picked.append(i)
            spans.append(span)
    return picked, spans


def _read_table(task: ScanTask, opts: ScanOptions, objects: ObjectStore) -> pa.Table | None:
    seg = task.segment
    where = f"object {seg.key!r} in {opts.s3.describe()}"
    if task.whole:
        pf = open_segment(pa.BufferReader(objects.get(seg.key)), where)
        segment_info(pf.metadata, where)
        groups = list(range(pf.metadata.num_row_groups))
    else:
        metadata, _, file = read_footer(objects, seg.key, seg.size, where, TAIL_BYTES)
        pf = open_segment(file, where, metadata)
        groups, spans = _selected_row_groups(pf, task, opts)
        for start, end in _coalesce(spans):
            if not file.covered(start, end):  # a small object came whole with its footer
                file.fetch(start, end)
    if not groups:
        return None
    names = set(pf.schema_arrow.names)
    missing = [c for c in READ_COLUMNS if c not in names]
    if missing:
        raise SegmentCorrupted(f"{where} lacks column(s) {', '.join(missing)}")
    return read_row_groups(pf, groups, where, READ_COLUMNS)


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


_stores: dict[S3Settings, S3ObjectStore] = {}
_stores_lock = threading.Lock()


def shared_store(settings: S3Settings) -> S3ObjectStore:
    """One client per settings per Python worker: building a boto3 client costs more than a small GET."""
    with _stores_lock:
        store = _stores.get(settings)
        if store is None:
            store = _stores[settings] = S3ObjectStore(settings)
        return store


def read_task(task: ScanTask, opts: ScanOptions, objects: ObjectStore | None = None) -> Iterator[pa.RecordBatch]:
    """The wanted rows of one task as record batches of at most BATCH_ROWS rows."""
    counted = MeteredObjectStore(objects or shared_store(opts.s3))
    table = _read_table(task, opts, counted)
    if table is None:
        return
    mask = _row_filter(table, opts)
    if mask is not None:
        table = table.filter(mask)
    log.debug("task read", extra=kv(key=task.segment.key, rows=table.num_rows, gets=counted.snapshot().gets))
    seg = task.segment
    yield from shape(table, seg.cluster, seg.broker, seg.topic, seg.key).to_batches(max_chunksize=BATCH_ROWS)
