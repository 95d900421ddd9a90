"""The tiered format, version 1 (docs/tiered-format.md): bucket layout, segment schema and metadata,
manifest mirrors, and ranged reads of a segment. Pure: no Sluice storage code, no object store client.

The one owner of the layout: the broker's writer (segment.py, manifest.py, uploader.py), its cold
reader (fetch.py) and the Spark source (spark_jobs/) all take names, schema, metadata keys and
footer/row-group reads from here. It imports only pyarrow and common (errors; record, for the
flag bit `body_gzip` shows), so the Spark `--py-files` archive ships it without the broker
(spark_jobs/package.py).

Bucket layout (names percent-encoded, RFC 3986 unreserved characters kept):

    <prefix>/<cluster>/<broker>/<topic>/<sequence:010d>-<epoch>.parquet    a segment
    <prefix>/<cluster>/<broker>/<topic>/manifest.json                       the topic's manifest mirror

A segment is one Parquet object of `SCHEMA` (derived from `COLUMNS`, the one statement of the
columns and of how each maps to a `MessageRecord` field), rows sorted by (queue_id, queue_offset), zstd, page
CRCs, and the key-value metadata `info_to_metadata` writes. A point read costs one GET for the
footer (the object's last `TAIL_BYTES`, a second GET only for a larger footer) and one GET per run
of row groups; `RangedFile` serves pyarrow from the fetched ranges and GETs anything else it is
asked for (so an unexpected read is slower, never wrong).
"""

from __future__ import annotations

import bisect
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import MessageCorrupted
from common.record import FLAG_BODY_GZIP

FORMAT_VERSION = 1
META_PREFIX = "sluice."
SORT_ORDER = "queue_id,queue_offset"
MANIFEST_NAME = "manifest.json"
MANIFEST_KIND = "sluice-tier-manifest"
SEGMENT_SUFFIX = ".parquet"
TAIL_BYTES = 64 << 10  # one GET of the tail usually holds a segment's whole footer
_MAGIC = b"PAR1"
_FOOTER_TRAILER = 8  # u32 footer length + magic
_TS = pa.timestamp("ms", tz="UTC")
_MAP = pa.map_(pa.string(), pa.string())

_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


# -- segment columns -----------------------------------------------------------------------------
# How a `MessageRecord` field's values (one list per column, in row order) become a column's values
# and back. Each takes and returns whole columns: one pass in C or one comprehension per column.


def _as_is(values: list[Any]) -> list[Any]:
    return values


def _pylist(column: pa.ChunkedArray) -> list[Any]:
    return column.to_pylist()


def _queue_ids(values: list[int]) -> list[int]:
    if values and not 0 <= min(values) <= max(values) <= _INT32_MAX:
        raise ValueError("a queue id does not fit the segment format (int32)")
    return values


def _clamped(values: list[int]) -> list[int]:
    """Milliseconds beyond the int64 range (year 292 million) clamped to it."""
    if not values or max(values) <= _INT64_MAX:
        return values
    return [v if v <= _INT64_MAX else _INT64_MAX for v in values]


def _clamped_or_null(values: list[int]) -> list[int | None]:
    """A time where 0 means none (`delivery_timestamp_ms`): null for 0, clamped otherwise."""
    return [(v if v <= _INT64_MAX else _INT64_MAX) if v else None for v in values]


def _millis(column: pa.ChunkedArray) -> list[int]:
    """A timestamp column as epoch milliseconds (null as 0: only `delivery_timestamp` has any)."""
    column = column.cast(pa.int64())
    if column.null_count:
        column = column.fill_null(0)
    return column.to_pylist()


def _bodies(values: list[Any]) -> list[bytes]:
    return list(map(bytes, values))  # bytes(b) of a bytes object is b itself


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _tuples(column: pa.ChunkedArray) -> list[tuple[str, ...]]:
    """A list<string> column as tuples (pyarrow takes tuples as they are when writing)."""
    arr = _one_chunk(column)
    # Offsets are absolute into the unsliced child `values`, so the pair is consistent for slices too.
    bounds = arr.offsets.to_pylist()
    values = arr.values.to_pylist()
    return [tuple(values[a:b]) for a, b in pairwise(bounds)]


def _plain_dicts(values: list[Mapping[str, str]]) -> list[dict[str, str]]:
    """Maps as pyarrow writes them into a map column (in order): dicts, any other mapping copied."""
    return [m if type(m) is dict else dict(m) for m in values]


def _dicts(column: pa.ChunkedArray) -> list[dict[str, str]]:
    arr = _one_chunk(column)
    bounds = arr.offsets.to_pylist()
    if bounds[0] == bounds[-1]:  # every map empty (user properties often are): no per-row slicing
        return [{} for _ in range(len(arr))]
    keys, items = arr.keys.to_pylist(), arr.items.to_pylist()
    return [dict(zip(keys[a:b], items[a:b], strict=True)) for a, b in pairwise(bounds)]


def _gzip_bits(flags: list[int]) -> list[bool]:
    return [bool(f & FLAG_BODY_GZIP) for f in flags]


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a segment: its name, Arrow type and nullability; the `MessageRecord` field it
    holds (`common.record`); how that field's values become the column's (`write`) and the column's
    become the field's (`read`, None for a column derived from a field another column holds); and
    whether it gets a dictionary and min/max statistics (low-cardinality text; what readers prune by)."""

    name: str
    type: pa.DataType
    nullable: bool
    field: str
    write: Callable[[list[Any]], list[Any]] = _as_is
    read: Callable[[pa.ChunkedArray], list[Any]] | None = _pylist
    dictionary: bool = False
    statistics: bool = False


# The segment's columns, in file order: the one statement of them. `SCHEMA` and the column lists
# below are derived from it, and segment.py's `records_to_table` / `table_to_records` iterate it, so
# a new `MessageRecord` field is archived by one row here (and a line in docs/tiered-format.md,
# whose table tests/unit/test_tiering_segment.py holds equal to this one). The file layout is a
# public contract (format version 1): never change a row's name, type, nullability or place.
COLUMNS: tuple[Column, ...] = (
    Column("queue_id", pa.int32(), False, "queue_id", _queue_ids, statistics=True),
    Column("queue_offset", pa.int64(), False, "queue_offset", statistics=True),
    Column("message_id", pa.string(), False, "message_id"),
    Column("tag", pa.string(), True, "tag", dictionary=True),
    Column("keys", pa.list_(pa.string()), False, "keys", read=_tuples),
    Column("message_group", pa.string(), True, "message_group", dictionary=True),
    Column("properties", _MAP, False, "properties", _plain_dicts, _dicts),
    Column("system_properties", _MAP, False, "system_properties", _plain_dicts, _dicts),
    Column("body", pa.binary(), False, "body", _bodies),
    Column("body_gzip", pa.bool_(), False, "flags", _gzip_bits, None, dictionary=True),
    Column("flags", pa.int32(), False, "flags", dictionary=True),
    Column("message_type", pa.int16(), False, "message_type", dictionary=True),
    Column("born_timestamp", _TS, False, "born_timestamp_ms", _clamped, _millis, statistics=True),
    Column("store_timestamp", _TS, False, "store_timestamp_ms", _clamped, _millis, statistics=True),
    Column("delivery_timestamp", _TS, True, "delivery_timestamp_ms", _clamped_or_null, _millis),
    Column("delivery_attempt", pa.int64(), False, "delivery_attempt"),
    Column("born_host", pa.string(), False, "born_host", dictionary=True),
    Column("store_host", pa.string(), False, "store_host", dictionary=True),
    Column("commitlog_position", pa.int64(), False, "physical_offset", statistics=True),
    Column("commitlog_size", pa.int64(), False, "size"),
)  # fmt: skip
SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])
DICTIONARY_COLUMNS = [c.name for c in COLUMNS if c.dictionary]
STATISTICS_COLUMNS = [c.name for c in COLUMNS if c.statistics]
_DECODE_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError)


class SegmentCorrupted(MessageCorrupted):
    """A tiered object that is not a valid segment of a supported version; the message names it."""


# -- bucket layout -------------------------------------------------------------------------------


def encode_name(part: str) -> str:
    """A cluster, broker or topic name as it appears in object keys."""
    return quote(part, safe="-_.~")


def decode_name(part: str) -> str:
    return unquote(part)


def normalise_prefix(prefix: str) -> str:
    """The prefix as keys use it: leading and trailing `/` dropped (may be empty)."""
    return prefix.strip("/")


def join_key(*parts: str) -> str:
    """Key parts joined by `/`, empty ones dropped."""
    return "/".join(p for p in parts if p)


def topic_dir(prefix: str, cluster: str, broker: str, topic: str) -> str:
    """The key prefix of one (cluster, broker, topic), ending with `/`."""
    return join_key(normalise_prefix(prefix), encode_name(cluster), encode_name(broker), encode_name(topic)) + "/"


def segment_key(prefix: str, cluster: str, broker: str, topic: str, seq: int, epoch: str) -> str:
    return f"{topic_dir(prefix, cluster, broker, topic)}{seq:010d}-{epoch}{SEGMENT_SUFFIX}"


def manifest_key(prefix: str, cluster: str, broker: str, topic: str) -> str:
    return topic_dir(prefix, cluster, broker, topic) + MANIFEST_NAME


# -- segment metadata ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowGroupRef:
    """One row group: its first and last (queue_id, queue_offset) and its bytes [start, end) in the object."""

    first_queue: int
    first_offset: int
    last_queue: int
    last_offset: int
    rows: int
    start: int
    end: int


@dataclass(frozen=True)
class SegmentInfo:
    """What the file's key-value metadata says about a segment."""

    format_version: int
    topic: str
    cluster: str
    broker: str
    queues: dict[int, tuple[int, int]]  # queue id -> (first offset, last offset), inclusive
    min_store_ms: int
    max_store_ms: int
    rows: int


def _queues_json(queues: Mapping[int, tuple[int, int]]) -> dict[str, list[int]]:
    return {str(q): [first, last] for q, (first, last) in sorted(queues.items())}


def _queues_parse(doc: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    return {int(q): (int(r[0]), int(r[1])) for q, r in doc.items()}


def info_to_metadata(info: SegmentInfo) -> dict[str, str]:
    return {
        META_PREFIX + "format_version": str(info.format_version),
        META_PREFIX + "topic": info.topic,
        META_PREFIX + "cluster": info.cluster,
        META_PREFIX + "broker": info.broker,
        META_PREFIX + "queues": json.dumps(_queues_json(info.queues), separators=(",", ":")),
        META_PREFIX + "min_store_timestamp_ms": str(info.min_store_ms),
        META_PREFIX + "max_store_timestamp_ms": str(info.max_store_ms),
        META_PREFIX + "rows": str(info.rows),
        META_PREFIX + "sort": SORT_ORDER,
    }


def segment_info(metadata: pq.FileMetaData, where: str = "segment") -> SegmentInfo:
    """Parse and check a segment's key-value metadata. Raises SegmentCorrupted naming `where`."""
    raw = {k.decode("utf-8"): v.decode("utf-8") for k, v in (metadata.metadata or {}).items()}
    try:
        version = int(raw[META_PREFIX + "format_version"])
        if version != FORMAT_VERSION:
            raise SegmentCorrupted(f"{where} has format version {version}; this reader supports {FORMAT_VERSION}")
        return SegmentInfo(
            version, raw[META_PREFIX + "topic"], raw[META_PREFIX + "cluster"], raw[META_PREFIX + "broker"],
            _queues_parse(json.loads(raw[META_PREFIX + "queues"])),
            int(raw[META_PREFIX + "min_store_timestamp_ms"]), int(raw[META_PREFIX + "max_store_timestamp_ms"]),
            int(raw[META_PREFIX + "rows"]),
        )  # fmt: skip
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        raise SegmentCorrupted(f"{where} has missing or malformed sluice metadata: {exc!r}") from None


def row_group_span(rg: pq.RowGroupMetaData) -> tuple[int, int]:
    """Bytes [start, end) of one row group in the object, from its column chunks' offsets."""
    starts, ends = [], []
    for c in range(rg.num_columns):
        cc = rg.column(c)
        begin = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
        starts.append(begin)
        ends.append(begin + cc.total_compressed_size)
    return min(starts), max(ends)


def row_group_byte_ranges(metadata: pq.FileMetaData) -> list[tuple[int, int]]:
    """Bytes [start, end) of every row group in the object."""
    return [row_group_span(metadata.row_group(i)) for i in range(metadata.num_row_groups)]


# -- manifest mirrors ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment a manifest mirror lists: where it is and what it can hold (for pruning before any GET)."""

    cluster: str
    broker: str
    topic: str
    seq: int
    key: str
    size: int
    rows: int
    queues: Mapping[int, tuple[int, int]]  # queue id -> (first offset, last offset), inclusive
    min_store_ms: int
    max_store_ms: int


@dataclass(frozen=True)
class TopicManifest:
    cluster: str
    broker: str
    topic: str
    epoch: str
    tiered_end: Mapping[int, int]
    segments: tuple[SegmentRef, ...]


def segment_json(
    seq: int, key: str, size: int, sha256: str, rows: int, queues: Mapping[int, tuple[int, int]],
    min_store_ms: int, max_store_ms: int, uploaded_ms: int,
) -> dict[str, Any]:  # fmt: skip
    """One entry of a manifest's `segments`."""
    return {
        "seq": seq, "key": key, "size": size, "sha256": sha256, "rows": rows, "queues": _queues_json(queues),
        "min_store_timestamp_ms": min_store_ms, "max_store_timestamp_ms": max_store_ms, "uploaded_ms": uploaded_ms,
    }  # fmt: skip


def manifest_json(
    cluster: str, broker: str, topic: str, epoch: str, updated_ms: int, tiered_end: Mapping[int, int],
    segments: Sequence[Mapping[str, Any]],
) -> bytes:  # fmt: skip
    """A manifest.json document (segments as `segment_json` makes them)."""
    doc = {
        "kind": MANIFEST_KIND, "format_version": FORMAT_VERSION, "cluster": cluster, "broker": broker,
        "topic": topic, "epoch": epoch, "updated_ms": updated_ms,
        "tiered_end": {str(q): e for q, e in sorted(tiered_end.items())}, "segments": list(segments),
    }  # fmt: skip
    return json.dumps(doc, indent=1).encode()


def parse_manifest(raw: bytes, where: str) -> TopicManifest:
    """Parse and check a manifest.json; MessageCorrupted naming `where` if it is not one this reader knows."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageCorrupted(f"{where} is not valid JSON ({exc}); is this a Sluice tiered bucket?") from None
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        raise MessageCorrupted(f"{where} is not a Sluice tier manifest (kind {MANIFEST_KIND!r} expected)")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise MessageCorrupted(
            f"{where} has format version {version}; this reader supports {FORMAT_VERSION}: upgrade sluice spark_jobs"
        )
    try:
        cluster, broker, topic = str(doc["cluster"]), str(doc["broker"]), str(doc["topic"])
        segments = tuple(_segment_ref(cluster, broker, topic, s) for s in doc["segments"])
        tiered_end = {int(q): int(e) for q, e in doc.get("tiered_end", {}).items()}
        return TopicManifest(cluster, broker, topic, str(doc.get("epoch", "")), tiered_end, segments)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        raise MessageCorrupted(f"{where} has a missing or malformed field: {exc!r}") from None


def _segment_ref(cluster: str, broker: str, topic: str, doc: Mapping[str, Any]) -> SegmentRef:
    return SegmentRef(
        cluster=cluster, broker=broker, topic=topic, seq=int(doc["seq"]), key=str(doc["key"]), size=int(doc["size"]),
        rows=int(doc["rows"]), queues=_queues_parse(doc["queues"]), min_store_ms=int(doc["min_store_timestamp_ms"]),
        max_store_ms=int(doc["max_store_timestamp_ms"]),
    )  # fmt: skip


# -- ranged reads of one segment -----------------------------------------------------------------


class RangeGetter(Protocol):
    """What ranged reads need of an object store (`ObjectStore.get`)."""

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...


def truncated(key: str, size: int) -> SegmentCorrupted:
    return SegmentCorrupted(f"tiered object {key} is shorter than the {size} bytes its manifest records (truncated?)")


class RangedFile(io.RawIOBase):
    """A seekable read-only view of `size` bytes of an object, served from fetched ranges."""

    def __init__(self, objects: RangeGetter, key: str, size: int, ranges: dict[int, bytes] | None = None) -> None:
        super().__init__()
        self._objects = objects
        self._key = key
        self._size = size
        self._pos = 0
        self._starts: list[int] = []
        self._chunks: list[bytes] = []
        for start, data in sorted((ranges or {}).items()):
            self.add(start, data)

    def add(self, start: int, data: bytes) -> None:
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._chunks.insert(i, data)

    def fetch(self, start: int, end: int) -> bytes:
        """GET bytes [start, end) and keep them; SegmentCorrupted if the object is shorter."""
        data = self._objects.get(self._key, start, end)
        if len(data) != end - start:
            raise truncated(self._key, self._size)
        self.add(start, data)
        return data

    def covered(self, start: int, end: int) -> bool:
        return self._slice(start, end) is not None

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

    def _slice(self, start: int, end: int) -> bytes | None:
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and end - self._starts[i] <= len(self._chunks[i]):
            off = start - self._starts[i]
            return self._chunks[i][off : off + end - start]
        return None

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self._slice(self._pos, end)
        if data is None:
            data = self.fetch(self._pos, end)
        self._pos = end
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer)[: len(data)] = data
        return len(data)


def open_segment(source: object, where: str, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """A ParquetFile over `source` with page checksums verified; SegmentCorrupted naming `where` if unreadable."""
    try:
        return pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True)
    except _DECODE_ERRORS as exc:
        raise SegmentCorrupted(f"{where} is not a readable Parquet segment: {exc}") from None


def read_row_groups(
    pf: pq.ParquetFile, indices: Sequence[int], where: str, columns: Sequence[str] | None = None
) -> pa.Table:
    try:
        return pf.read_row_groups(list(indices), columns=list(columns) if columns is not None else None)
    except _DECODE_ERRORS as exc:
        raise SegmentCorrupted(f"{where}: row group(s) {list(indices)} unreadable: {exc}") from None


def read_row_group(pf: pq.ParquetFile, index: int, where: str, columns: Sequence[str] | None = None) -> pa.Table:
    try:
        return pf.read_row_group(index, columns=list(columns) if columns is not None else None)
    except _DECODE_ERRORS as exc:
        raise SegmentCorrupted(f"{where}: row group {index} is unreadable: {exc}") from None


def read_footer(
    objects: RangeGetter, key: str, size: int, where: str, tail_bytes: int = TAIL_BYTES
) -> tuple[pq.FileMetaData, SegmentInfo, RangedFile]:
    """A segment's footer and checked metadata with one GET of its tail (two for a larger footer).

    Returns the file's metadata, its `SegmentInfo`, and the `RangedFile` holding what was fetched
    (a small object may come whole with its footer). SegmentCorrupted naming `where` if the object
    is shorter than `size`, lacks the Parquet magic, or its footer or metadata do not parse.
    """
    tail_len = min(size, tail_bytes)
    file = RangedFile(objects, key, size)
    tail = file.fetch(size - tail_len, size) if tail_len else b""
    if tail[-4:] != _MAGIC:
        raise SegmentCorrupted(f"{where} is not a readable Parquet segment: it does not end with the Parquet magic")
    footer_len = int.from_bytes(tail[-_FOOTER_TRAILER:-4], "little")
    if footer_len + _FOOTER_TRAILER > size:
        raise SegmentCorrupted(f"{where} is not a readable Parquet segment: a {footer_len}-byte footer in {size} bytes")
    footer = tail[-footer_len - _FOOTER_TRAILER :]
    if footer_len + _FOOTER_TRAILER > tail_len:
        start = size - footer_len - _FOOTER_TRAILER
        head = objects.get(key, start, size - tail_len)
        if len(head) != size - tail_len - start:
            raise truncated(key, size)
        file.add(start, head)
        footer = head + tail
    # Parsed from these bytes alone: given this metadata, pyarrow reads no footer of its own.
    try:
        metadata = pq.read_metadata(pa.BufferReader(footer))
    except _DECODE_ERRORS as exc:
        raise SegmentCorrupted(f"{where} is not a readable Parquet segment: {exc}") from None
    return metadata, segment_info(metadata, where), file
