"""Tiered segment codec: `MessageRecord`s to a segment object and back (the format is format.py's).

One segment holds messages of one topic stored on one broker, every queue of the topic, rows
sorted by (queue_id, queue_offset), zstd-compressed, written in row groups of at most
`row_group_rows` rows and about `row_group_bytes` of uncompressed messages, so a point read fetches
one small row group. docs/tiered-format.md is the public contract; `format.COLUMNS` states the
columns once (name, type, nullability, the record field each holds and its conversions), and
`records_to_table` / `table_to_records` iterate it. Parquet key-value metadata:
`format.info_to_metadata`.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from broker.tiering.format import (
    COLUMNS,
    DICTIONARY_COLUMNS,
    FORMAT_VERSION,
    SCHEMA,
    STATISTICS_COLUMNS,
    Column,
    RowGroupRef,
    SegmentCorrupted,
    SegmentInfo,
    info_to_metadata,
    open_segment,
    read_row_groups,
    row_group_byte_ranges,
    segment_info,
)
from common.record import MessageRecord

_INT64_MAX = (1 << 63) - 1
_ROW_OVERHEAD_BYTES = 128  # estimate for a record whose encoded size is unknown
# Record fields a segment does not hold: the topic is in the key and the metadata, `edge` and `raw`
# are in-memory buffers of the CommitLog record. Every other field must be some column's (checked
# at import by `_read_plan`: a new field without a row in format.COLUMNS fails at once).
NOT_ARCHIVED = frozenset({"topic", "edge", "raw"})


@dataclass(frozen=True)
class EncodedSegment:
    data: bytes
    info: SegmentInfo
    row_groups: tuple[RowGroupRef, ...]


def _ts(value: int) -> int:
    return min(value, _INT64_MAX)


_WRITE = tuple((c, attrgetter(c.field)) for c in COLUMNS)


def records_to_table(records: Sequence[MessageRecord]) -> pa.Table:
    """The rows of `records`, in the given order (see `encode_segment` for sorting).

    Column-wise: per column of `format.COLUMNS`, its field of every record (one map() in C), its
    conversion, one `pa.array`: several times faster than appending field by field per record.
    """
    arrays = [pa.array(c.write(list(map(get, records))), type=c.type) for c, get in _WRITE]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _read_plan() -> tuple[tuple[str, Column | None, object], ...]:
    """MessageRecord's fields in their declared order, each with the column it is read from (None:
    the topic, given, or another field's default), up to the last field a column holds."""
    read = {c.field: c for c in COLUMNS if c.read is not None}
    plan: list[tuple[str, Column | None, object]] = []
    for f in dataclasses.fields(MessageRecord):
        column = read.get(f.name)
        if column is None and f.name not in NOT_ARCHIVED:
            raise TypeError(f"MessageRecord.{f.name} has no column: add its row to broker/tiering/format.py COLUMNS")
        if column is None and f.name != "topic" and f.default is dataclasses.MISSING:
            raise TypeError(f"MessageRecord.{f.name} is not archived and has no plain default to read back")
        plan.append((f.name, column, f.default))
    while plan[-1][1] is None:  # trailing fields left to their defaults (`edge`, `raw`)
        plan.pop()
    return tuple(plan)


_READ_PLAN = _read_plan()


def table_to_records(table: pa.Table, topic: str) -> list[MessageRecord]:
    """Records of `table` (any subset of rows of a segment, all columns) in row order.

    Column-wise: each column becomes a Python list once (pyarrow, in C, with its `read`
    conversion) and the records are built by one map() over those lists, passed in the order
    `MessageRecord` declares its fields (`_READ_PLAN`, derived from the dataclass): several times
    cheaper than indexing every column per row or passing keywords; the cold read path's main
    cost under the GIL.
    """
    present = set(table.column_names)
    missing = [f.name for f in SCHEMA if f.name not in present]
    if missing:
        raise SegmentCorrupted(f"segment rows lack column(s) {', '.join(missing)}")
    n = table.num_rows
    args: list[Iterable[Any]] = []
    for name, column, default in _READ_PLAN:
        if column is not None and column.read is not None:  # (always: the plan holds read columns only)
            args.append(column.read(table.column(column.name)))
        else:
            args.append(repeat(topic if name == "topic" else default, n))
    return list(map(MessageRecord, *args))


def _row_group_sizes(records: Sequence[MessageRecord], max_rows: int, max_bytes: int) -> list[int]:
    sizes: list[int] = []
    rows = used = 0
    for r in records:
        est = r.size if r.size > 0 else len(r.body) + _ROW_OVERHEAD_BYTES
        if rows and (rows >= max_rows or used + est > max_bytes):
            sizes.append(rows)
            rows = used = 0
        rows += 1
        used += est
    if rows:
        sizes.append(rows)
    return sizes


def encode_segment(
    records: Sequence[MessageRecord],
    *,
    topic: str,
    cluster: str,
    broker: str,
    row_group_rows: int = 1024,
    row_group_bytes: int = 1 << 20,
) -> EncodedSegment:
    """One Parquet object holding `records` (all of `topic`, any queues, any order; at least one)."""
    if not records:
        raise ValueError("a segment holds at least one record")
    ordered = sorted(records, key=lambda r: (r.queue_id, r.queue_offset))
    queues: dict[int, tuple[int, int]] = {}
    for r in ordered:
        if r.topic != topic:
            raise ValueError(f"record of topic {r.topic!r} in a segment of topic {topic!r}")
        first = queues.get(r.queue_id, (r.queue_offset, r.queue_offset))[0]
        queues[r.queue_id] = (first, r.queue_offset)
    stored = [_ts(r.store_timestamp_ms) for r in ordered]
    info = SegmentInfo(FORMAT_VERSION, topic, cluster, broker, queues, min(stored), max(stored), len(ordered))
    table = records_to_table(ordered)
    sizes = _row_group_sizes(ordered, row_group_rows, row_group_bytes)
    sink = io.BytesIO()
    writer = pq.ParquetWriter(
        sink, SCHEMA, compression="zstd", use_dictionary=DICTIONARY_COLUMNS, write_statistics=STATISTICS_COLUMNS,
        write_page_checksum=True,
    )  # fmt: skip
    try:
        start = 0
        for n in sizes:
            writer.write_table(table.slice(start, n), row_group_size=n)
            start += n
        writer.add_key_value_metadata(info_to_metadata(info))
    finally:
        writer.close()
    data = sink.getvalue()
    byte_ranges = row_group_byte_ranges(pq.ParquetFile(pa.BufferReader(data)).metadata)
    assert len(byte_ranges) == len(sizes), "one row group per chunk"
    refs: list[RowGroupRef] = []
    start = 0
    for n, (begin, end) in zip(sizes, byte_ranges, strict=True):
        head, tail = ordered[start], ordered[start + n - 1]
        refs.append(RowGroupRef(head.queue_id, head.queue_offset, tail.queue_id, tail.queue_offset, n, begin, end))
        start += n
    return EncodedSegment(data, info, tuple(refs))


def decode_segment(data: bytes, where: str = "segment") -> tuple[SegmentInfo, list[MessageRecord]]:
    """Every record of a whole segment object, in (queue_id, queue_offset) order."""
    pf = open_segment(pa.BufferReader(data), where)
    info = segment_info(pf.metadata, where)
    table = read_row_groups(pf, range(pf.metadata.num_row_groups), where)
    return info, table_to_records(table, info.topic)
