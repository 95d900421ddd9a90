"""The tiered segment codec (broker/tiering/segment.py) and its configuration.

Every field of `MessageRecord` survives a segment round trip, whatever its value (hypothesis); rows
are sorted by (queue_id, queue_offset); row groups respect both the row and the byte bound and the
recorded references match the file; the file's key-value metadata says what the format promises;
anything that is not a segment of this version is `SegmentCorrupted`.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from types import MappingProxyType

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.tiering.config import TieringConfig
from broker.tiering.format import (
    COLUMNS,
    DICTIONARY_COLUMNS,
    FORMAT_VERSION,
    SCHEMA,
    STATISTICS_COLUMNS,
    SegmentCorrupted,
)
from broker.tiering.segment import NOT_ARCHIVED, decode_segment, encode_segment, records_to_table, table_to_records
from common.config import ConfigError, load_config
from common.record import RECORD_FIELDS, MessageRecord

PROPS = settings(deadline=None, derandomize=True, database=None, max_examples=60)
TOPIC = "orders-ü"
I64 = (1 << 63) - 1

text = st.text(max_size=12)
records = st.builds(
    MessageRecord,
    topic=st.just(TOPIC),
    queue_id=st.integers(0, (1 << 31) - 1),
    body=st.binary(max_size=300),
    message_id=text,
    tag=st.none() | text,
    keys=st.lists(text, max_size=4).map(tuple),
    message_group=st.none() | text,
    properties=st.dictionaries(text, text, max_size=4),
    system_properties=st.dictionaries(text, text, max_size=3),
    message_type=st.integers(0, 255),
    flags=st.integers(0, 0xFFFF),
    born_timestamp_ms=st.integers(0, I64),
    born_host=text,
    store_host=text,
    delivery_timestamp_ms=st.integers(0, I64),
    delivery_attempt=st.integers(0, (1 << 32) - 1),
    queue_offset=st.integers(0, I64),
    physical_offset=st.integers(0, I64),
    store_timestamp_ms=st.integers(0, I64),
    size=st.integers(0, 1 << 32),
)


def unique_positions(recs: list[MessageRecord]) -> list[MessageRecord]:
    seen: set[tuple[int, int]] = set()
    out = []
    for r in recs:
        if (r.queue_id, r.queue_offset) not in seen:
            seen.add((r.queue_id, r.queue_offset))
            out.append(r)
    return out


@PROPS
@given(st.lists(records, min_size=1, max_size=40).map(unique_positions), st.integers(1, 9))
def test_round_trip_keeps_every_field(recs: list[MessageRecord], rg_rows: int) -> None:
    seg = encode_segment(recs, topic=TOPIC, cluster="c", broker="b", row_group_rows=rg_rows, row_group_bytes=1 << 20)
    info, back = decode_segment(seg.data)
    expected = sorted(recs, key=lambda r: (r.queue_id, r.queue_offset))
    assert back == expected  # dataclass equality: every field, None vs "" included
    assert info.rows == len(recs) and info.topic == TOPIC and info.format_version == FORMAT_VERSION
    assert info.min_store_ms == min(r.store_timestamp_ms for r in recs)
    assert info.max_store_ms == max(r.store_timestamp_ms for r in recs)
    for q in {r.queue_id for r in recs}:
        offsets = [r.queue_offset for r in recs if r.queue_id == q]
        assert info.queues[q] == (min(offsets), max(offsets))


@PROPS
@given(st.lists(records, min_size=1, max_size=40).map(unique_positions), st.integers(1, 9), st.data())
def test_any_slice_of_rows_decodes_to_the_same_records(recs: list[MessageRecord], rg_rows: int,
                                                       data: st.DataObject) -> None:  # fmt: skip
    """table_to_records works column-wise over list and map offsets: a slice (non-zero array offset)
    and a table of several chunks (one per row group) must give exactly the rows they hold."""
    seg = encode_segment(recs, topic=TOPIC, cluster="c", broker="b", row_group_rows=rg_rows, row_group_bytes=1 << 20)
    table = pq.ParquetFile(io.BytesIO(seg.data)).read()
    expected = sorted(recs, key=lambda r: (r.queue_id, r.queue_offset))
    start = data.draw(st.integers(0, len(recs)))
    stop = data.draw(st.integers(start, len(recs)))
    assert table_to_records(table.slice(start, stop - start), TOPIC) == expected[start:stop]
    chunk = table.combine_chunks().slice(start, stop - start)
    assert table_to_records(chunk, TOPIC) == expected[start:stop]


def sample(n: int, queues: int = 3, body: int = 100) -> list[MessageRecord]:
    return [
        MessageRecord(topic=TOPIC, queue_id=q, body=bytes([o % 251]) * body, queue_offset=o, physical_offset=o * 10 + q,
                      store_timestamp_ms=1000 + o, message_id=f"m{q}-{o}", size=body + 100)
        for o in range(n) for q in reversed(range(queues))
    ]  # fmt: skip


def test_row_groups_respect_rows_and_bytes_and_match_the_file() -> None:
    recs = sample(200)
    seg = encode_segment(recs, topic=TOPIC, cluster="c", broker="b", row_group_rows=50, row_group_bytes=3_000)
    pf = pq.ParquetFile(io.BytesIO(seg.data))
    assert pf.metadata.num_row_groups == len(seg.row_groups) > 1
    table = pf.read()
    keys = list(zip(table["queue_id"].to_pylist(), table["queue_offset"].to_pylist(), strict=True))
    assert keys == sorted(keys)
    start = 0
    for i, ref in enumerate(seg.row_groups):
        assert ref.rows <= 50 and ref.rows * 200 <= 3_000  # estimated 200 bytes per message
        assert (ref.first_queue, ref.first_offset) == keys[start]
        assert (ref.last_queue, ref.last_offset) == keys[start + ref.rows - 1]
        assert pf.metadata.row_group(i).num_rows == ref.rows
        # The byte range alone holds the row group: decoding from just those bytes works.
        sparse = bytearray(len(seg.data))
        sparse[ref.start : ref.end] = seg.data[ref.start : ref.end]
        footer_len = int.from_bytes(seg.data[-8:-4], "little")
        sparse[-footer_len - 8 :] = seg.data[-footer_len - 8 :]
        part = pq.ParquetFile(io.BytesIO(bytes(sparse))).read_row_group(i)
        assert part.num_rows == ref.rows
        start += ref.rows
    assert seg.row_groups[0].start == 4 and seg.row_groups[-1].end <= len(seg.data) - footer_len - 8


def test_schema_compression_and_metadata_are_the_documented_ones() -> None:
    seg = encode_segment(sample(20), topic=TOPIC, cluster="c1", broker="b1")
    pf = pq.ParquetFile(io.BytesIO(seg.data))
    assert pf.schema_arrow.equals(SCHEMA)
    assert pf.schema_arrow.field("store_timestamp").type == pa.timestamp("ms", tz="UTC")
    assert {pf.metadata.row_group(0).column(i).compression for i in range(len(SCHEMA))} == {"ZSTD"}
    meta = {k.decode(): v.decode() for k, v in pf.metadata.metadata.items() if k.startswith(b"sluice.")}
    assert meta == {
        "sluice.format_version": "1", "sluice.topic": TOPIC, "sluice.cluster": "c1", "sluice.broker": "b1",
        "sluice.queues": json.dumps({"0": [0, 19], "1": [0, 19], "2": [0, 19]}, separators=(",", ":")),
        "sluice.min_store_timestamp_ms": "1000", "sluice.max_store_timestamp_ms": "1019", "sluice.rows": "60",
        "sluice.sort": "queue_id,queue_offset",
    }  # fmt: skip


# The archive's layout, written out: existing segments in buckets and the Spark readers depend on
# it byte for byte (format version 1). A change here is a new format version, never an edit; a new
# column is appended after these (readers ignore columns they do not know) and needs no edit here.
PINNED_SCHEMA = [
    ("queue_id", "int32", False), ("queue_offset", "int64", False), ("message_id", "string", False),
    ("tag", "string", True), ("keys", "list<item: string>", False), ("message_group", "string", True),
    ("properties", "map<string, string>", False), ("system_properties", "map<string, string>", False),
    ("body", "binary", False), ("body_gzip", "bool", False), ("flags", "int32", False),
    ("message_type", "int16", False), ("born_timestamp", "timestamp[ms, tz=UTC]", False),
    ("store_timestamp", "timestamp[ms, tz=UTC]", False), ("delivery_timestamp", "timestamp[ms, tz=UTC]", True),
    ("delivery_attempt", "int64", False), ("born_host", "string", False), ("store_host", "string", False),
    ("commitlog_position", "int64", False), ("commitlog_size", "int64", False),
]  # fmt: skip


def test_the_schema_is_pinned() -> None:
    assert [(f.name, str(f.type), f.nullable) for f in SCHEMA][: len(PINNED_SCHEMA)] == PINNED_SCHEMA
    assert SCHEMA.metadata is None
    pinned = {name for name, _, _ in PINNED_SCHEMA}
    assert {c for c in DICTIONARY_COLUMNS if c in pinned} == {
        "tag", "message_group", "born_host", "store_host", "message_type", "flags", "body_gzip",
    }  # fmt: skip
    assert {c for c in STATISTICS_COLUMNS if c in pinned} == {
        "queue_id", "queue_offset", "born_timestamp", "store_timestamp", "commitlog_position",
    }  # fmt: skip


def test_every_record_field_is_a_column_but_the_topic_and_buffers() -> None:
    """format.COLUMNS is the one statement of what a segment holds: each row names a real field, and
    every field is some row's (segment.py refuses to import otherwise)."""
    held = {c.field for c in COLUMNS}
    assert held <= set(RECORD_FIELDS)
    assert set(RECORD_FIELDS) - held == NOT_ARCHIVED == {"topic", "edge", "raw"}
    assert [c.name for c in COLUMNS if c.read is None] == ["body_gzip"]  # derived from flags


_DOC_TYPES = {
    "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "binary": pa.binary(),
    "bool": pa.bool_(), "list<string>": pa.list_(pa.string()),
    "map<string, string>": pa.map_(pa.string(), pa.string()), "timestamp[ms, UTC]": pa.timestamp("ms", tz="UTC"),
}  # fmt: skip


def test_the_documented_schema_table_is_format_columns() -> None:
    """docs/tiered-format.md's Schema table (the user-facing description) says what COLUMNS says."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "tiered-format.md").read_text()
    section = doc.split("## Schema", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `")]
    documented = [
        (name.strip().strip("`"), _DOC_TYPES[kind.replace("\\", "").split(" (")[0].strip()], null.strip() == "yes")
        for name, kind, null in rows
    ]
    assert documented == [(c.name, c.type, c.nullable) for c in COLUMNS]


def test_any_mapping_is_written_as_its_pairs_in_order() -> None:
    rec = dataclasses.replace(sample(1, 1)[0], properties=MappingProxyType({"b": "1", "a": "2"}))  # type: ignore[arg-type]
    table = records_to_table([rec])
    assert table["properties"].to_pylist() == [[("b", "1"), ("a", "2")]]
    assert table_to_records(table, TOPIC)[0].properties == {"b": "1", "a": "2"}


def test_timestamps_beyond_int64_are_clamped() -> None:
    rec = dataclasses.replace(sample(1, 1)[0], born_timestamp_ms=(1 << 64) - 1)
    _, (back,) = decode_segment(encode_segment([rec], topic=TOPIC, cluster="c", broker="b").data)
    assert back.born_timestamp_ms == I64


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        encode_segment([], topic=TOPIC, cluster="c", broker="b")
    with pytest.raises(ValueError, match="topic"):
        encode_segment(sample(1, 1), topic="other", cluster="c", broker="b")
    with pytest.raises(ValueError, match="queue id"):
        records_to_table([dataclasses.replace(sample(1, 1)[0], queue_id=1 << 31)])


def test_what_is_not_a_segment_is_segment_corrupted() -> None:
    data = encode_segment(sample(30), topic=TOPIC, cluster="c", broker="b").data
    with pytest.raises(SegmentCorrupted, match="obj-1"):
        decode_segment(b"garbage" * 10, "obj-1")
    with pytest.raises(SegmentCorrupted, match="obj-2"):
        decode_segment(data[: len(data) // 2], "obj-2")
    damaged = bytearray(data)
    damaged[200:260] = bytes(60)  # inside the first row group's pages: the page CRC catches it
    with pytest.raises(SegmentCorrupted, match="obj-3"):
        decode_segment(bytes(damaged), "obj-3")
    plain = io.BytesIO()
    pq.write_table(pa.table({"x": [1]}), plain)
    with pytest.raises(SegmentCorrupted, match="obj-4 has missing or malformed sluice metadata"):
        decode_segment(plain.getvalue(), "obj-4")


def test_config_loads_from_toml_and_checks_values() -> None:
    cfg = load_config(
        TieringConfig, section="tiering",
        data={"tiering": {"bucket": "bkt", "min_age_s": 5, "topic_retention_s": {"audit": 0, "orders": 3600}}},
    )  # fmt: skip
    assert cfg.enabled and cfg.min_age_s == 5.0
    assert cfg.retention_for("audit") == 0 and cfg.retention_for("orders") == 3600 and cfg.retention_for("x") > 0
    assert not TieringConfig().enabled
    with pytest.raises(ConfigError, match="addressing_style"):
        load_config(TieringConfig, section="tiering", data={"tiering": {"addressing_style": "sideways"}})
    with pytest.raises(ConfigError, match="multipart_part_bytes"):
        load_config(TieringConfig, section="tiering", data={"tiering": {"multipart_part_bytes": 1024}})
    with pytest.raises(ConfigError, match="together"):
        load_config(TieringConfig, section="tiering", data={"tiering": {"access_key_id": "k"}})
