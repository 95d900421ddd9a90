"""The CommitLog record codec (common/record.py) and the index key layouts (broker/store/keys.py).

Round trips keep every field; a sealed record with any single damaged byte, a truncated buffer or
arbitrary bytes only ever raise `MessageCorrupted`; over-long input raises `BadRequest`. Key
layouts sort numerically, and `next_prefix` is the tight exclusive end of a prefix range.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import keys as K
from common import record
from common.errors import BadRequest, MessageCorrupted
from common.record import (
    CRC_START,
    HEADER_FIELDS,
    HEADER_SIZE,
    MAGIC,
    MAX_U16,
    OFF_CRC,
    OFFSETS,
    MessageRecord,
    decode,
    encode,
    peek_size,
    placed,
    seal,
    seal_at,
)

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

# Fixed examples on every run: a failure is a bug, never a lucky draw.
PROPS = settings(deadline=None, derandomize=True, database=None)

# -- strategies --------------------------------------------------------------------------------------

texts = st.text(max_size=40)  # any code points but surrogates: protobuf strings are valid UTF-8
nonempty = st.text(min_size=1, max_size=40)
u64 = st.integers(0, U64_MAX)

records = st.builds(
    MessageRecord,
    topic=nonempty,
    queue_id=st.integers(0, U32_MAX),
    body=st.binary(max_size=2048),
    message_id=texts,
    tag=st.none() | nonempty,  # an empty tag means "no tag" and decodes as None
    keys=st.lists(texts, max_size=8).map(tuple),
    message_group=st.none() | nonempty,
    properties=st.dictionaries(texts, texts, max_size=8),
    system_properties=st.dictionaries(texts, texts, max_size=4),
    message_type=st.integers(0, 255),
    flags=st.integers(0, 0xFFFF),
    born_timestamp_ms=u64,
    born_host=texts,
    store_host=texts,
    delivery_timestamp_ms=u64,
    delivery_attempt=st.integers(0, U32_MAX),
)
seals = st.tuples(u64, u64, u64)  # queue offset, physical offset, store timestamp


def sealed(rec: MessageRecord, qoff: int = 7, phys: int = 4096, store_ts: int = 1_700_000_000_000) -> bytearray:
    buf = encode(rec)
    seal(buf, qoff, phys, store_ts)
    return buf


def expected(rec: MessageRecord, qoff: int, phys: int, store_ts: int, size: int) -> MessageRecord:
    return dataclasses.replace(
        rec, queue_offset=qoff, physical_offset=phys, store_timestamp_ms=store_ts, size=size, keys=tuple(rec.keys)
    )


def sample(**overrides: object) -> MessageRecord:
    fields: dict[str, object] = {
        "topic": "orders",
        "queue_id": 3,
        "body": b"hello world",
        "message_id": "01HZX",
        "tag": "paid",
        "keys": ("k1", "k2"),
        "message_group": "g",
        "properties": {"a": "1", "b": "2"},
        "system_properties": {"s": "x"},
        "born_timestamp_ms": 1_699_999_999_000,
        "born_host": "10.0.0.1",
        "store_host": "10.0.0.2",
    }
    fields.update(overrides)
    return MessageRecord(**fields)  # type: ignore[arg-type]


# -- round trips -------------------------------------------------------------------------------------


@settings(PROPS, max_examples=300)
@given(rec=records, offsets=seals)
def test_round_trip_keeps_every_field(rec: MessageRecord, offsets: tuple[int, int, int]) -> None:
    qoff, phys, store_ts = offsets
    buf = encode(rec)
    assert rec.size == len(buf)
    seal(buf, qoff, phys, store_ts)
    assert peek_size(buf) == (len(buf), MAGIC)
    assert decode(buf) == expected(rec, qoff, phys, store_ts, len(buf))


@settings(PROPS, max_examples=50)
@given(recs=st.lists(records, min_size=1, max_size=6))
def test_records_decode_at_their_position_in_a_larger_buffer(recs: list[MessageRecord]) -> None:
    log = bytearray(b"\xee" * 5)  # records need not start at 0
    starts = []
    for i, rec in enumerate(recs):
        starts.append(len(log))
        log += sealed(rec, qoff=i, phys=len(log))
    for i, (rec, start) in enumerate(zip(recs, starts, strict=True)):
        got = decode(bytes(log), start)
        assert got == expected(rec, i, start, 1_700_000_000_000, got.size)


@pytest.mark.parametrize("body_size", [0, 1, 64 << 10, 3 << 20])
def test_empty_and_large_bodies(body_size: int) -> None:
    body = bytes(range(256)) * (body_size // 256) + b"x" * (body_size % 256)
    rec = sample(body=body)
    buf = sealed(rec)
    assert decode(buf).body == body
    assert len(buf) == rec.size


def test_many_keys_and_properties_and_unicode() -> None:
    keys = tuple(f"ключ-{i}-🔑" for i in range(2000))
    props = {f"prop-{i}-ü": "值" * (i % 50) for i in range(3000)}
    rec = sample(topic="主题/ü/🚀", tag="タグ", keys=keys, properties=props, message_group="группа")
    got = decode(sealed(rec, qoff=1, phys=2, store_ts=3))
    assert got == expected(rec, 1, 2, 3, got.size)


def test_fields_at_their_maximum_size_round_trip() -> None:
    long = "é" * (MAX_U16 // 2) + "x"  # exactly 65535 UTF-8 bytes
    assert len(long.encode()) == MAX_U16
    rec = sample(topic=long, message_id=long, tag=long, message_group=long, born_host=long, keys=(long,))
    rec.properties = {long: long}
    got = decode(sealed(rec))
    assert (got.topic, got.message_id, got.tag, got.keys, got.properties) == (long, long, long, (long,), {long: long})


def test_unsealed_record_fails_its_crc() -> None:
    with pytest.raises(MessageCorrupted, match="CRC"):
        decode(encode(sample()))


def test_seal_rewrites_offsets_and_crc() -> None:
    buf = sealed(sample(), qoff=1, phys=2, store_ts=3)
    seal(buf, 10, 20, 30)
    got = decode(buf)
    assert (got.queue_offset, got.physical_offset, got.store_timestamp_ms) == (10, 20, 30)
    (crc,) = struct.unpack_from("<I", buf, OFF_CRC)
    assert crc == zlib.crc32(bytes(buf[CRC_START:]))


# -- the format itself --------------------------------------------------------------------------------

# One record with every field set, as format version 1 stores it (bytes written before the codec's
# structs were derived from its field table): the codec must keep writing exactly these.
GOLDEN = bytes.fromhex(
    "92000000534c5543d905a4ca01020100070000002a0000000000000000000000020000007b68e5cf8b0100000068e5cf8b"
    "010000887be5cf8b010000030000000500000006000400040001000a000a000100010001006f726465727330314142746167"
    "416731302e302e302e313a3131302e302e302e323a3202006b310100700100000076010073010000007768656c6c6f"
)
GOLDEN_RECORD = MessageRecord(
    topic="orders", queue_id=7, body=b"hello", message_id="01AB", tag="tagA", keys=("k1",), message_group="g",
    properties={"p": "v"}, system_properties={"s": "w"}, message_type=2, flags=1, born_timestamp_ms=1_700_000_000_000,
    born_host="10.0.0.1:1", store_host="10.0.0.2:2", delivery_timestamp_ms=1_700_000_005_000, delivery_attempt=3,
)  # fmt: skip


def test_format_v1_bytes_do_not_change() -> None:
    buf = encode(dataclasses.replace(GOLDEN_RECORD))
    seal(buf, 42, 1 << 33, 1_700_000_000_123)
    assert bytes(buf) == GOLDEN
    batch = [dataclasses.replace(GOLDEN_RECORD) for _ in range(5)]  # the store's append path
    buf, sizes = placed(batch, 1 << 20)
    assert sizes == [len(GOLDEN)] * 5
    seal_at(buf, memoryview(buf), 0, len(GOLDEN), 42, 1 << 33, 1_700_000_000_123)
    assert bytes(buf[: len(GOLDEN)]) == GOLDEN


def test_the_docstring_table_is_the_field_table() -> None:
    """The codec's docstring states the header field by field; its structs come from HEADER_FIELDS."""
    rows = re.findall(r"^\| (\d+) +\| (\d+) +\| (\w+)", record.__doc__ or "", re.MULTILINE)
    assert [(int(offset), int(size), name) for offset, size, name in rows] == [
        (OFFSETS[name], struct.calcsize("<" + code), name) for name, code in HEADER_FIELDS
    ]
    assert re.search(rf"^\| {HEADER_SIZE} +\| \.\.\. +\| variable part", record.__doc__ or "", re.MULTILINE)


# -- damage ------------------------------------------------------------------------------------------


def test_every_single_byte_flip_is_detected() -> None:
    buf = sealed(sample())
    for pos in range(len(buf)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(buf)
            bad[pos] ^= mask
            with pytest.raises(MessageCorrupted):
                decode(bytes(bad))


@settings(PROPS, max_examples=300)
@given(rec=records, data=st.data())
def test_a_flipped_byte_anywhere_raises_message_corrupted(rec: MessageRecord, data: st.DataObject) -> None:
    buf = sealed(rec)
    pos = data.draw(st.integers(0, len(buf) - 1), label="pos")
    buf[pos] ^= data.draw(st.integers(1, 255), label="mask")
    with pytest.raises(MessageCorrupted):
        decode(buf)


@settings(PROPS, max_examples=200)
@given(rec=records, data=st.data())
def test_truncated_records_raise_message_corrupted(rec: MessageRecord, data: st.DataObject) -> None:
    buf = sealed(rec)
    cut = data.draw(st.integers(0, len(buf) - 1), label="cut")
    with pytest.raises(MessageCorrupted):
        decode(bytes(buf[:cut]))


def test_every_truncation_of_a_small_record_is_detected() -> None:
    buf = bytes(sealed(sample()))
    for cut in range(len(buf)):
        with pytest.raises(MessageCorrupted):
            decode(buf[:cut])
    with pytest.raises(MessageCorrupted):
        decode(buf, len(buf))  # nothing at all at `pos`


@settings(PROPS, max_examples=500)
@given(raw=st.binary(max_size=600), pos=st.integers(0, 8))
def test_random_bytes_only_raise_message_corrupted(raw: bytes, pos: int) -> None:
    with pytest.raises(MessageCorrupted):
        decode(raw, min(pos, len(raw)))


def _fix_header(buf: bytearray) -> bytes:
    """Make `buf` pass every check before the variable part: size, magic, version and CRC."""
    struct.pack_into("<II", buf, 0, len(buf), MAGIC)
    buf[12] = 1
    struct.pack_into("<I", buf, OFF_CRC, zlib.crc32(bytes(buf[CRC_START:])))
    return bytes(buf)


@settings(PROPS, max_examples=500)
@given(raw=st.binary(min_size=HEADER_SIZE, max_size=400))
def test_random_bytes_behind_a_valid_header_never_raise_anything_else(raw: bytes) -> None:
    """A record whose CRC is right but whose lengths are nonsense (a writer bug, or a collision)."""
    buf = _fix_header(bytearray(raw))
    try:
        rec = decode(buf)
    except MessageCorrupted:
        return
    assert rec.size == len(buf)


@settings(PROPS, max_examples=300)
@given(rec=records, data=st.data())
def test_damaged_lengths_with_a_recomputed_crc_never_raise_anything_else(
    rec: MessageRecord, data: st.DataObject
) -> None:
    """Damage after the CRC was computed over it: every length field and the variable part."""
    buf = sealed(rec)
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        pos = data.draw(st.integers(13, len(buf) - 1), label="pos")  # after the version byte
        buf[pos] ^= data.draw(st.integers(1, 255), label="mask")
    fixed = _fix_header(buf)
    try:
        got = decode(fixed)
    except MessageCorrupted:
        return
    assert got.size == len(fixed)


# -- bad input ---------------------------------------------------------------------------------------

TOO_LONG = "x" * (MAX_U16 + 1)
TOO_LONG_UTF8 = "é" * (MAX_U16 // 2 + 1)  # 65536 bytes in fewer than 65536 characters


@pytest.mark.parametrize("text", [TOO_LONG, TOO_LONG_UTF8], ids=["ascii", "utf8"])
@pytest.mark.parametrize(
    "field",
    ["topic", "message_id", "tag", "message_group", "born_host", "store_host", "key", "property_key", "sys_key"],
)
def test_over_long_fields_raise_bad_request(field: str, text: str) -> None:
    overrides: dict[str, object] = {
        "key": {"keys": ("ok", text)},
        "property_key": {"properties": {"ok": "1", text: "v"}},
        "sys_key": {"system_properties": {text: "v"}},
    }.get(field, {field: text})
    with pytest.raises(BadRequest):
        encode(sample(**overrides))


@pytest.mark.parametrize("field", ["keys", "properties", "system_properties"])
def test_too_many_keys_or_properties_raise_bad_request(field: str) -> None:
    many = MAX_U16 + 1
    value: object = tuple("k" for _ in range(many)) if field == "keys" else {str(i): "" for i in range(many)}
    with pytest.raises(BadRequest):
        encode(sample(**{field: value}))


@pytest.mark.parametrize(
    "overrides",
    [
        {"queue_id": 1 << 32},
        {"message_type": 256},
        {"flags": 1 << 16},
        {"born_timestamp_ms": -1},
        {"born_timestamp_ms": 1 << 64},
        {"delivery_timestamp_ms": -5},
        {"delivery_attempt": 1 << 32},
    ],
    ids=lambda o: next(iter(o)),
)
def test_out_of_range_numbers_raise_bad_request(overrides: dict[str, int]) -> None:
    with pytest.raises(BadRequest):
        encode(sample(**overrides))


# -- key layouts -------------------------------------------------------------------------------------

cq_triples = st.tuples(st.integers(0, U32_MAX), st.integers(0, U32_MAX), u64)


@PROPS
@given(triples=st.lists(cq_triples, min_size=2, max_size=50))
def test_cq_keys_sort_by_topic_queue_offset_numerically(triples: list[tuple[int, int, int]]) -> None:
    by_key = sorted(triples, key=lambda t: K.cq_key(*t))
    assert by_key == sorted(triples)
    for t in triples:
        assert K.cq_key_parse(K.cq_key(*t)) == t


@PROPS
@given(a=cq_triples, b=cq_triples)
def test_a_queue_prefix_covers_exactly_its_queue(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    prefix = K.queue_prefix(a[0], a[1])
    key = K.cq_key(*b)
    inside = prefix <= key < K.next_prefix(prefix)
    assert inside == ((a[0], a[1]) == (b[0], b[1]))
    assert K.queue_prefix_parse(prefix) == (a[0], a[1])


@PROPS
@given(
    entries=st.lists(
        st.tuples(st.integers(0, 1 << 40), st.binary(min_size=1, max_size=255), st.integers(0, 1 << 40)),
        min_size=2,
        max_size=30,
    )
)
def test_msgid_keys_group_by_segment_then_id_then_position(entries: list[tuple[int, bytes, int]]) -> None:
    for base, mid, phys in entries:
        key = K.msgid_key(base, mid, phys)
        assert K.trailing_offset(key) == phys
        assert key.startswith(K.segment_prefix(base))
        for b2, m2, p2 in entries:
            other = K.msgid_key(b2, m2, p2)
            # A prefix scan for one id in one segment sees exactly that id's entries, oldest first.
            assert other.startswith(K.msgid_prefix(base, mid)) == ((b2, m2) == (base, mid))
            if (b2, m2) == (base, mid):
                assert (other < key) == (p2 < phys)
            if b2 != base:  # one range delete per segment
                assert (other < key) == (b2 < base)


@PROPS
@given(
    entries=st.lists(
        st.tuples(st.integers(0, 1 << 40), st.integers(0, U32_MAX), st.binary(max_size=40), st.integers(0, 1 << 40)),
        min_size=2,
        max_size=30,
    )
)
def test_keyidx_prefixes_do_not_leak_into_longer_keys(entries: list[tuple[int, int, bytes, int]]) -> None:
    for base, tid, key, phys in entries:
        full = K.keyidx_key(base, tid, key, phys)
        assert K.trailing_offset(full) == phys
        for b2, t2, k2, p2 in entries:
            other = K.keyidx_key(b2, t2, k2, p2)
            assert other.startswith(K.keyidx_prefix(base, tid, key)) == ((b2, t2, k2) == (base, tid, key))


@PROPS
@given(bases=st.lists(u64, min_size=2, max_size=20), data=st.data())
def test_segment_keyed_tables_sort_by_segment(bases: list[int], data: st.DataObject) -> None:
    tid, qid = data.draw(st.integers(0, U32_MAX)), data.draw(st.integers(0, U32_MAX))
    segq = sorted(bases, key=lambda b: K.segq_key(b, tid, qid))
    assert segq == sorted(bases)
    assert sorted(bases, key=K.segment_prefix) == sorted(bases)
    for b in bases:
        assert K.segq_key_parse(K.segq_key(b, tid, qid)) == (b, tid, qid)


@PROPS
@given(g1=texts, g2=texts, tid=st.integers(0, U32_MAX), qid=st.integers(0, U32_MAX))
def test_consumer_offset_keys_of_different_groups_never_share_a_prefix(g1: str, g2: str, tid: int, qid: int) -> None:
    key = K.offsets_key(g1, tid, qid)
    assert key.startswith(K.offsets_group_prefix(g1))
    assert key.startswith(K.offsets_group_prefix(g2)) == (g1 == g2)


@PROPS
@given(prefix=st.binary(max_size=12).filter(lambda b: b.strip(b"\xff") != b""), suffix=st.binary(max_size=12))
def test_next_prefix_is_above_every_key_with_the_prefix(prefix: bytes, suffix: bytes) -> None:
    end = K.next_prefix(prefix)
    assert prefix < end
    assert prefix + suffix < end
    assert not end.startswith(prefix)


@PROPS
@given(prefix=st.binary(min_size=1, max_size=8).filter(lambda b: b.strip(b"\xff") != b""), key=st.binary(max_size=12))
def test_next_prefix_is_the_tightest_bound(prefix: bytes, key: bytes) -> None:
    """Every key in [prefix, next_prefix(prefix)) starts with the prefix, so range deletes are exact."""
    if prefix <= key < K.next_prefix(prefix):
        assert key.startswith(prefix)
    elif key.startswith(prefix):
        raise AssertionError(f"{key!r} starts with {prefix!r} but lies outside its range")


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        (b"\x00", b"\x01"),
        (b"a\xff", b"b"),
        (b"\x01\xff\xff", b"\x02"),
        (b"ab", b"ac"),
        (b"\x00\x00\xfe", b"\x00\x00\xff"),
    ],
)
def test_next_prefix_examples(prefix: bytes, end: bytes) -> None:
    assert K.next_prefix(prefix) == end


@pytest.mark.parametrize("prefix", [b"", b"\xff", b"\xff\xff\xff"])
def test_next_prefix_of_all_ff_has_no_end(prefix: bytes) -> None:
    with pytest.raises(ValueError):
        K.next_prefix(prefix)


# -- the edge's records ------------------------------------------------------------------------------


@settings(PROPS, max_examples=300)
@given(rec=records, mtype=st.integers(1, 6))
def test_an_edge_record_received_and_placed_is_what_encode_writes(rec: MessageRecord, mtype: int) -> None:
    """`outgoing` leaves topic, queue and store host to the broker; `received` verifies and decodes
    it, `placed` writes them in: the bytes `encode_one` writes for the same message."""
    rec.message_type = mtype
    data = record.outgoing(
        rec.body, rec.message_id, rec.message_type, rec.tag, rec.keys, rec.message_group, rec.properties,
        rec.system_properties, rec.born_timestamp_ms, rec.born_host, rec.delivery_timestamp_ms,
        bool(rec.flags & record.FLAG_BODY_GZIP),
    )  # fmt: skip
    (got,) = record.received([data], rec.topic, rec.queue_id, rec.store_host)
    want = dataclasses.replace(rec, flags=rec.flags & record.FLAG_BODY_GZIP, delivery_attempt=0, keys=tuple(rec.keys))
    assert record.placed([got], 1 << 32)[0] == record.encode_one(want, 1 << 32)
    assert (got.body, got.message_id, got.tag, got.properties, got.system_properties) == (
        rec.body, rec.message_id, rec.tag, rec.properties, rec.system_properties
    )  # fmt: skip


def test_a_send_that_fails_a_check_is_refused_naming_its_message() -> None:
    good = [record.outgoing(b"body", f"id{i}", tag="t") for i in range(6)]
    flipped = bytearray(good[4])
    flipped[-1] ^= 1
    with pytest.raises(MessageCorrupted, match=r"message #4 of the send: .*CRC"):
        record.received([*good[:4], bytes(flipped), good[5]], "t", 0, "h")
    with pytest.raises(MessageCorrupted, match="message #2 of the send declares size"):
        record.received([*good[:2], good[2] + b"x", *good[3:]], "t", 0, "h")
    with pytest.raises(MessageCorrupted, match="message #1 of the send has unknown message type 9"):
        record.received([good[0], record.outgoing(b"body", "id", message_type=9)], "t", 0, "h")
    assert [r.message_id for r in record.received(good, "t", 0, "h")] == [f"id{i}" for i in range(6)]


def test_received_refuses_what_an_edge_does_not_write() -> None:
    good = record.outgoing(b"body", "id")
    assert record.received([good], "t", 0, "h")[0].body == b"body"
    flipped = bytearray(good)
    flipped[-1] ^= 1
    named = sealed(sample())  # names its topic and store host, carries offsets
    for bad in (bytes(flipped), good[:-1], good + b"x", b"", bytes(named)):
        with pytest.raises(MessageCorrupted):
            record.received([good, bad], "t", 0, "h")
    with pytest.raises(BadRequest):
        record.outgoing(b"x", "id", tag="")


@settings(PROPS, max_examples=200)
@given(rec=records, mtype=st.integers(1, 6), seals=seals)
def test_a_stored_message_copied_out_is_the_edge_record_of_its_fields(
    rec: MessageRecord, mtype: int, seals: tuple[int, int, int]
) -> None:
    """`outgoing_copy` of a record read back from the CommitLog is `outgoing` of every field an edge
    record carries (body_gzip from the flags, never dedup); `changes` replace fields by name."""
    rec.message_type = mtype
    stored = decode(bytes(sealed(rec, *seals)))
    gzip = bool(rec.flags & record.FLAG_BODY_GZIP)
    assert record.outgoing_copy(stored) == record.outgoing(
        rec.body, rec.message_id, mtype, rec.tag, rec.keys, rec.message_group, rec.properties, rec.system_properties,
        rec.born_timestamp_ms, rec.born_host, rec.delivery_timestamp_ms, gzip,
    )  # fmt: skip
    changed = record.outgoing_copy(stored, message_id="01NEW", properties={"p": "1"}, delivery_timestamp_ms=0)
    (got,) = record.received([changed], "t", 0, "h")
    assert (got.message_id, got.properties, got.delivery_timestamp_ms, got.body, got.keys) == (
        "01NEW", {"p": "1"}, 0, rec.body, tuple(rec.keys)
    )  # fmt: skip
    assert got.flags == (record.FLAG_BODY_GZIP if gzip else 0)


def test_outgoing_copy_carries_every_field_an_edge_record_has() -> None:
    """Every `outgoing` parameter named like a record field is copied (so a field added to both is
    carried with no edit elsewhere); the others are options of one send or the flags' bits."""
    params = record.outgoing.__code__.co_varnames[: record.outgoing.__code__.co_argcount]
    assert set(params) - set(record._EDGE_FIELDS) == {"body_gzip", "dedup"}
    with pytest.raises(TypeError):
        record.outgoing_copy(sample(), no_such_field=1)
