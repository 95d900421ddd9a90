"""Ranged reads of one tiered segment object: its footer and single row groups, with few GETs.

A point read costs one GET for the footer (`format.read_footer`; the parsed footer is then cached
by the reader) and one GET per row group, whose byte range the manifest records; read-ahead fetches
a run of adjacent row groups with one GET of their span (`fetch_row_groups`). pyarrow decodes
through `format.RangedFile`.

Checks, each failing with `SegmentCorrupted` naming the object: the object is as long as the
manifest says (a short answer means it was truncated), the Parquet magic and footer parse, the
footer is a segment of this topic and supported version with the manifest's row groups and byte
ranges, every page's CRC (pyarrow verifies them), and a decoded row group holds exactly the rows
the manifest says. Object store errors (`Unavailable`, `ObjectNotFound`) pass through unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from broker.tiering.format import (
    RangedFile,
    SegmentCorrupted,
    open_segment,
    read_footer,
    read_row_group,
    row_group_byte_ranges,
    truncated,
)
from broker.tiering.manifest import SegmentEntry
from broker.tiering.objectstore import ObjectStore


def fetch_footer(objects: ObjectStore, topic: str, entry: SegmentEntry) -> pq.FileMetaData:
    """The object's Parquet footer, checked against the manifest entry."""
    key = entry.key
    md, info, _ = read_footer(objects, key, entry.size, f"tiered object {key}")
    if info.topic != topic or info.rows != entry.rows:
        raise SegmentCorrupted(
            f"tiered object {key} holds {info.rows} rows of topic {info.topic!r}; the manifest expects "
            f"{entry.rows} rows of {topic!r}"
        )
    expected = [(g.start, g.end) for g in entry.row_groups]
    if row_group_byte_ranges(md) != expected:
        raise SegmentCorrupted(f"tiered object {key} has row groups other than its manifest records")
    return md


def fetch_row_group(objects: ObjectStore, entry: SegmentEntry, metadata: pq.FileMetaData, index: int) -> pa.Table:
    """Row group `index` of the object, all columns, with one ranged GET."""
    ((_, table),) = fetch_row_groups(objects, entry, metadata, [index])
    return table


def fetch_row_groups(
    objects: ObjectStore, entry: SegmentEntry, metadata: pq.FileMetaData, indices: Sequence[int]
) -> Iterator[tuple[int, pa.Table]]:
    """Adjacent row groups `indices` (ascending, consecutive) of the object, all columns, with one ranged
    GET of their whole span (read-ahead: fewer requests, each one's overhead paid once).

    Yields (index, table) as each row group is decoded, so a reader waiting for the first need not wait
    for the decoding of the rest."""
    if any(b != a + 1 for a, b in itertools.pairwise(indices)) or not indices:
        raise ValueError(f"row groups {list(indices)} are not consecutive")
    first, last = entry.row_groups[indices[0]], entry.row_groups[indices[-1]]
    data = objects.get(entry.key, first.start, last.end)
    if len(data) != last.end - first.start:
        raise truncated(entry.key, entry.size)
    where = f"tiered object {entry.key}"
    pf = open_segment(RangedFile(objects, entry.key, entry.size, {first.start: data}), where, metadata)
    for index in indices:
        table = read_row_group(pf, index, where)
        _check_rows(table, entry, index)
        yield index, table


def _check_rows(table: pa.Table, entry: SegmentEntry, index: int) -> None:
    ref = entry.row_groups[index]
    qids, offs = table.column("queue_id"), table.column("queue_offset")
    n = table.num_rows
    found = (n, qids[0].as_py(), offs[0].as_py(), qids[n - 1].as_py(), offs[n - 1].as_py()) if n else (0,)
    if found != (ref.rows, ref.first_queue, ref.first_offset, ref.last_queue, ref.last_offset):
        raise SegmentCorrupted(
            f"tiered object {entry.key}: row group {index} holds (rows, first, last) {found}, the manifest "
            f"records {(ref.rows, ref.first_queue, ref.first_offset, ref.last_queue, ref.last_offset)}"
        )


def scan_columns(
    objects: ObjectStore, entry: SegmentEntry, metadata: pq.FileMetaData, row_groups: Sequence[int], columns: list[str]
) -> pa.Table:
    """Some columns of some row groups (lookups by id, key or time): GETs of just those column chunks."""
    if not row_groups:
        return pa.table({c: pa.array([], metadata.schema.to_arrow_schema().field(c).type) for c in columns})
    where = f"tiered object {entry.key}"
    pf = open_segment(RangedFile(objects, entry.key, entry.size), where, metadata)
    parts = [read_row_group(pf, i, where, columns) for i in row_groups]
    return pa.concat_tables(parts)
