"""Tiered segment codec: `MessageRecord`s to a segment object and back (the format is format.py's).

One segment holds messages of one topic stored on one broker, every queue of the topic, rows
sorted by (queue_id, queue_offset), zstd-compressed, written in row groups of at most
`row_group_rows` rows and about `row_group_bytes` of uncompressed messages, so a point read fetches
one small row group. docs/tiered-format.md is the public contract; format.SCHEMA its schema:

| column             | Arrow type                  | null | meaning                                        |
|--------------------|-----------------------------|------|------------------------------------------------|
| queue_id           | int32                       | no   | message queue id                               |
| queue_offset       | int64                       | no   | offset in the queue                            |
| message_id         | string                      | no   | producer-assigned message id ("" if none)      |
| tag                | string                      | yes  |                                                |
| keys               | list<string>                | no   | message keys, in order                         |
| message_group      | string                      | yes  | FIFO message group                             |
| properties         | map<string, string>         | no   | user properties, in order                      |
| system_properties  | map<string, string>         | no   | system properties, in order                    |
| body               | binary                      | no   | the body exactly as stored (see body_gzip)     |
| body_gzip          | bool                        | no   | body is gzip-compressed (flags bit 0)          |
| flags              | int32                       | no   | the record's raw u16 flags                     |
| message_type       | int16                       | no   | NORMAL 1, FIFO 2, DELAY 3, TRANSACTION 4       |
| born_timestamp     | timestamp[ms, tz=UTC]       | no   | when the producer created it                   |
| store_timestamp    | timestamp[ms, tz=UTC]       | no   | when the broker stored it                      |
| delivery_timestamp | timestamp[ms, tz=UTC]       | yes  | timer messages' delivery time; null = at once  |
| delivery_attempt   | int64                       | no   |                                                |
| born_host          | string                      | no   |                                                |
| store_host         | string                      | no   |                                                |
| commitlog_position | int64                       | no   | physical offset in the broker's CommitLog      |
| commitlog_size     | int64                       | no   | encoded record size in the CommitLog           |

Timestamps beyond the int64 range (year 292 million) are clamped to it. Parquet key-value
metadata: `format.info_to_metadata`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from broker.tiering.format import (
    DICTIONARY_COLUMNS,
    FORMAT_VERSION,
    SCHEMA,
    STATISTICS_COLUMNS,
    RowGroupRef,
    SegmentCorrupted,
    SegmentInfo,
    info_to_metadata,
    open_segment,
    read_row_groups,
    row_group_byte_ranges,
    segment_info,
)
from common.record import FLAG_BODY_GZIP, MessageRecord

_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_ROW_OVERHEAD_BYTES = 128  # estimate for a record whose encoded size is unknown


@dataclass(frozen=True)
class EncodedSegment:
    data: bytes
    info: SegmentInfo
    row_groups: tuple[RowGroupRef, ...]


def _ts(value: int) -> int:
    return min(value, _INT64_MAX)


def records_to_table(records: Sequence[MessageRecord]) -> pa.Table:
    """The rows of `records`, in the given order (see `encode_segment` for sorting)."""
    rs = records
    if rs and not 0 <= min(r.queue_id for r in rs) <= max(r.queue_id for r in rs) <= _INT32_MAX:
        raise ValueError("a queue id does not fit the segment format (int32)")
    big = _INT64_MAX
    # One comprehension per column: several times faster than appending field by field per record.
    cols: dict[str, list[Any]] = {
        "queue_id": [r.queue_id for r in rs],
        "queue_offset": [r.queue_offset for r in rs],
        "message_id": [r.message_id for r in rs],
        "tag": [r.tag for r in rs],
        "keys": [list(r.keys) for r in rs],
        "message_group": [r.message_group for r in rs],
        "properties": [list(r.properties.items()) for r in rs],
        "system_properties": [list(r.system_properties.items()) for r in rs],
        "body": [bytes(r.body) for r in rs],
        "body_gzip": [bool(r.flags & FLAG_BODY_GZIP) for r in rs],
        "flags": [r.flags for r in rs],
        "message_type": [r.message_type for r in rs],
        "born_timestamp": [r.born_timestamp_ms if r.born_timestamp_ms <= big else big for r in rs],
        "store_timestamp": [r.store_timestamp_ms if r.store_timestamp_ms <= big else big for r in rs],
        "delivery_timestamp": [min(r.delivery_timestamp_ms, big) if r.delivery_timestamp_ms else None for r in rs],
        "delivery_attempt": [r.delivery_attempt for r in rs],
        "born_host": [r.born_host for r in rs],
        "store_host": [r.store_host for r in rs],
        "commitlog_position": [r.physical_offset for r in rs],
        "commitlog_size": [r.size for r in rs],
    }
    arrays = [pa.array(cols[f.name], type=f.type) for f in SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _ints(column: pa.ChunkedArray) -> list[int]:
    """An integer or timestamp column as Python ints (nulls as 0: only `delivery_timestamp` has any)."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    if column.null_count:
        column = column.fill_null(0)
    return column.to_pylist()


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _tuples(column: pa.ChunkedArray) -> list[tuple[str, ...]]:
    arr = _one_chunk(column)
    # Offsets are absolute into the unsliced child `values`, so the pair is consistent for slices too.
    bounds = arr.offsets.to_pylist()
    values = arr.values.to_pylist()
    return [tuple(values[a:b]) for a, b in pairwise(bounds)]


def _dicts(column: pa.ChunkedArray) -> list[dict[str, str]]:
    arr = _one_chunk(column)
    bounds = arr.offsets.to_pylist()
    if bounds[0] == bounds[-1]:  # every map empty (user properties often are): no per-row slicing
        return [{} for _ in range(len(arr))]
    keys, items = arr.keys.to_pylist(), arr.items.to_pylist()
    return [dict(zip(keys[a:b], items[a:b], strict=True)) for a, b in pairwise(bounds)]


def table_to_records(table: pa.Table, topic: str) -> list[MessageRecord]:
    """Records of `table` (any subset of rows of a segment, all columns) in row order.

    Column-wise: each column becomes a Python list once (pyarrow, in C) and the records are built by
    one map() over those lists, several times cheaper than indexing every column per row; this is
    the cold read path's main cost under the GIL.
    """
    present = set(table.column_names)
    missing = [f.name for f in SCHEMA if f.name not in present]
    if missing:
        raise SegmentCorrupted(f"segment rows lack column(s) {', '.join(missing)}")
    c = table.column
    n = table.num_rows
    # Positional arguments in MessageRecord's field order (record.RECORD_FIELDS, checked at its import);
    # map() walks the columns in C.
    return list(map(
        MessageRecord, repeat(topic, n), _ints(c("queue_id")), c("body").to_pylist(), c("message_id").to_pylist(),
        c("tag").to_pylist(), _tuples(c("keys")), c("message_group").to_pylist(), _dicts(c("properties")),
        _dicts(c("system_properties")), _ints(c("message_type")), _ints(c("flags")), _ints(c("born_timestamp")),
        c("born_host").to_pylist(), c("store_host").to_pylist(), _ints(c("delivery_timestamp")),
        _ints(c("delivery_attempt")), _ints(c("queue_offset")), _ints(c("commitlog_position")),
        _ints(c("store_timestamp")), _ints(c("commitlog_size")),
    ))  # fmt: skip


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
