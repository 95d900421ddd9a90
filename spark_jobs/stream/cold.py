"""The tiered part of a micro-batch, read from the archive's Parquet by the executors.

With the batch source's archive options (`bucket`, `endpoint`, `prefix`, ...), the driver reads
each (cluster, broker, topic) manifest of a batch and splits every queue range `[start, end)` at
what its segments hold (`split`):

- the pieces a segment holds become one `ColdPartition` per segment (every queue of the batch it
  holds, each with its own offset bounds); the executor reads them with the batch source's reader
  (scan.py: one GET of the object, or its footer and the row groups whose statistics overlap) and
  keeps exactly the rows of the pieces;
- the rest (not tiered yet, or no manifest) stays a `QueuePartition`, read through the broker.

Either tier yields the same row for a (queue, offset): the broker builds its rows with the
uploader's own conversion (docs/tiered-format.md); a cold row names its object in `object_key`.
A cold piece must hold every offset it covers (offsets are dense): an object that is gone, damaged
or short is a warning, and its pieces are read through the brokers instead (which report a data
loss if retention removed them there too).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from broker.tiering.format import SegmentRef, manifest_key, parse_manifest
from broker.tiering.objectstore import ObjectNotFound
from common.errors import SluiceError, Unavailable
from common.logs import kv
from spark_jobs.options import ScanOptions
from spark_jobs.planner import ScanTask
from spark_jobs.scan import read_task, shared_store
from spark_jobs.schema import without_properties
from spark_jobs.stream.discovery import QueueRange
from spark_jobs.stream.hot import QueuePartition, fault, read_partition
from spark_jobs.stream.offsets import QueueKey
from spark_jobs.stream.options import StreamOptions

log = logging.getLogger("sluice.spark.stream")

_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class ColdPartition(InputPartition):
    """The pieces of one segment a batch reads; each piece keeps its broker path as a fallback."""

    segment: SegmentRef
    pieces: tuple[QueuePartition, ...]


def split(
    wanted: Mapping[QueueKey, tuple[int, int]],
    ranges: Mapping[QueueKey, QueueRange],
    begin: Mapping[QueueKey, int],
    archive: ScanOptions,
) -> list[InputPartition]:
    """A batch's partitions: the tiered pieces per segment, the rest per queue through its broker."""
    by_location: dict[tuple[str, str, str], list[QueueKey]] = {}
    for key in sorted(wanted):
        by_location.setdefault((ranges[key].cluster, key.broker, key.topic), []).append(key)
    cold: dict[str, tuple[SegmentRef, list[QueuePartition]]] = {}
    hot: list[InputPartition] = []
    for (cluster, broker, topic), keys in sorted(by_location.items()):
        segments = _segments(archive, cluster, broker, topic)
        for key in keys:
            r, (lo, hi) = ranges[key], wanted[key]

            def piece(a: int, b: int, key: QueueKey = key, r: QueueRange = r) -> QueuePartition:
                return QueuePartition(key, r.cluster, r.address, a, b, fresh=key not in begin)

            at = lo
            held = sorted((s.queues[key.queue_id], s) for s in segments if key.queue_id in s.queues)
            for (first, last), seg in held:
                a, b = max(at, first), min(hi, last + 1)
                if b <= a:
                    continue
                if a > at:
                    hot.append(piece(at, a))
                cold.setdefault(seg.key, (seg, []))[1].append(piece(a, b))
                at = b
            if at < hi:
                hot.append(piece(at, hi))
    return [ColdPartition(seg, tuple(pieces)) for seg, pieces in cold.values()] + hot


def _segments(archive: ScanOptions, cluster: str, broker: str, topic: str) -> list[SegmentRef]:
    key = manifest_key(archive.prefix, cluster, broker, topic)
    try:
        raw = shared_store(archive.s3).get(key)
    except ObjectNotFound:
        return []  # nothing tiered yet
    except SluiceError as exc:  # the bucket is down: the brokers read their tiered part themselves
        log.warning("could not read a manifest; the batch reads through the brokers",
                    extra=kv(key=key, error=str(exc)))  # fmt: skip
        return []
    return list(parse_manifest(raw, f"{archive.s3.describe()}/{key}").segments)


def read_cold(part: ColdPartition, opts: StreamOptions) -> Iterator[pa.RecordBatch]:
    """The partition's rows from its object, or, when it cannot give every one, from the brokers."""
    assert opts.archive is not None
    try:
        table = _from_object(part, opts.archive)
    except (SluiceError, OSError, pa.ArrowException) as exc:  # gone, damaged, short, S3 down
        log.warning("a tiered object could not be read; its messages are read through the brokers",
                    extra=kv(object=part.segment.key, error=str(exc)))  # fmt: skip
        for piece in part.pieces:
            yield from read_partition(piece, opts)
        return
    for i, batch in enumerate((table if opts.include_properties else without_properties(table)).to_batches()):
        yield batch
        if i == 0:
            fault(opts, batch.num_rows)


def _from_object(part: ColdPartition, archive: ScanOptions) -> pa.Table:
    seg, pieces = part.segment, part.pieces
    scan = dataclasses.replace(
        archive, queues=frozenset(p.key.queue_id for p in pieces), from_offset=min(p.start for p in pieces),
        to_offset=max(p.end for p in pieces), from_ms=0, to_ms=_INT64_MAX, keys=None, message_ids=None,
    )  # fmt: skip
    whole = all(  # every message of the object is wanted: one GET, no footer round trip
        any(p.key.queue_id == q and p.start <= first and last < p.end for p in pieces)
        for q, (first, last) in seg.queues.items()
    )
    batches = list(read_task(ScanTask(seg, 0, seg.size, whole), scan, shared_store(archive.s3)))
    table = pa.Table.from_batches(batches) if batches else None
    kept = []
    for p in pieces:
        rows = table.filter(_piece_mask(table, p)) if table is not None else None
        offsets = sorted(rows["queue_offset"].to_pylist()) if rows is not None else []
        if offsets != list(range(p.start, p.end)):
            raise Unavailable(f"{seg.key} holds {len(offsets)} of the {p.end - p.start} messages [{p.start}, "
                              f"{p.end}) of {p.key} its manifest lists")  # fmt: skip
        kept.append(rows)
    return pa.concat_tables(kept)


def _piece_mask(table: pa.Table, p: QueuePartition) -> pa.Array:
    offsets = table["queue_offset"]
    return pc.and_(
        pc.equal(table["queue_id"], pa.scalar(p.key.queue_id, pa.int32())),
        pc.and_(pc.greater_equal(offsets, p.start), pc.less(offsets, p.end)),
    )
