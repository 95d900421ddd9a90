"""Batch encoding and sealing of the CommitLog codec (common/record.py).

`encode_columns` (its vector path and its per-record path) + `seal_at` are the store's append path;
they must produce exactly the bytes of `encode` + `seal` record by record (the on-disk format v1 is
a contract), and reject bad input with the same errors.
"""

from __future__ import annotations

import dataclasses
import zlib
from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import BadRequest
from common.record import (
    CRC_START,
    MessageRecord,
    crc32,
    decode,
    encode,
    encode_columns,
    seal,
    seal_at,
)

PROPS = settings(deadline=None, derandomize=True, database=None)
NO_LIMIT = 1 << 30
STORE_TS = 1_700_000_000_123

texts = st.text(max_size=20)
records = st.builds(
    MessageRecord,
    topic=st.sampled_from(["orders", "pay-ü", "日志"]),
    queue_id=st.sampled_from([0, 1, 7]),
    body=st.binary(max_size=600),
    message_id=texts,
    tag=st.none() | st.text(min_size=1, max_size=10),
    keys=st.lists(texts, max_size=3).map(tuple),
    message_group=st.none() | st.text(min_size=1, max_size=10),
    properties=st.dictionaries(texts, texts, max_size=3),
    system_properties=st.dictionaries(texts, texts, max_size=2),
    born_timestamp_ms=st.integers(0, (1 << 64) - 1),
    born_host=st.sampled_from(["", "10.0.0.1:1", "h"]),
    store_host=st.sampled_from(["", "10.0.0.2:2"]),
    # Offsets a caller left in a record are not stored: the writer assigns them.
    queue_offset=st.integers(-1, 5),
    physical_offset=st.integers(-1, 5),
    store_timestamp_ms=st.integers(0, 5),
)


def reference(recs: list[MessageRecord], first_qoff: int, first_phys: int) -> bytes:
    """The log `encode` + `seal` writes for `recs` at consecutive offsets."""
    out = bytearray()
    for i, rec in enumerate(recs):
        buf = encode(dataclasses.replace(rec))
        seal(buf, first_qoff + i, first_phys + len(out), STORE_TS)
        out += buf
    return bytes(out)


@settings(PROPS, max_examples=200)
@given(recs=st.lists(records, min_size=1, max_size=8), first_qoff=st.integers(0, 1 << 40))
def test_batch_encoding_and_sealing_write_the_same_bytes_as_record_by_record(
    recs: list[MessageRecord], first_qoff: int
) -> None:
    first_phys = 1 << 33
    expected = reference(recs, first_qoff, first_phys)
    enc = encode_columns(recs, NO_LIMIT)
    buf, sizes = enc.buf, enc.sizes
    assert sizes == [len(encode(dataclasses.replace(r))) for r in recs]
    assert enc.one_queue == (len({(r.topic, r.queue_id) for r in recs}) == 1)
    starts = list(accumulate(sizes, initial=0))[:-1]
    physs = [first_phys + s for s in starts]

    one_by_one = bytearray(buf)
    view = memoryview(one_by_one)
    for i, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        seal_at(one_by_one, view, start, size, first_qoff + i, physs[i], STORE_TS)
    assert bytes(one_by_one) == expected

    for i, (start, rec) in enumerate(zip(starts, recs, strict=True)):
        got = decode(expected, start)
        assert (got.topic, got.queue_id, got.body, got.keys) == (rec.topic, rec.queue_id, rec.body, rec.keys)
        assert (got.queue_offset, got.physical_offset, got.store_timestamp_ms) == (first_qoff + i, physs[i], STORE_TS)


@st.composite
def uniform_batches(draw: st.DrawFn) -> list[MessageRecord]:
    """Batches as a batched send makes them: one topic, tag, group and host pair, ids of one length,
    with or without keys and properties, or with as many user properties each and nothing else (a
    batched send of one client: their tails are cut from one run of all pairs) — the vector path of
    `encode_columns`."""
    shared = {
        "topic": draw(st.sampled_from(["orders", "pay-ü"])),
        "tag": draw(st.none() | st.text(min_size=1, max_size=10)),
        "message_group": draw(st.none() | st.text(min_size=1, max_size=10)),
        "born_host": draw(st.sampled_from(["", "10.0.0.1:1"])),
        "store_host": draw(st.sampled_from(["", "10.0.0.2:2"])),
    }
    id_len = draw(st.integers(0, 40))
    extras = draw(st.booleans())
    same_count = None if extras else draw(st.none() | st.integers(1, 3))  # user properties per record
    same_sys = 0 if extras else draw(st.integers(0, 2))  # system properties per record (a lite send: 1)
    one_queue = draw(st.booleans())
    alike = draw(st.booleans())  # type, flags, delivery time and attempt alike (the usual batch)
    plain = {
        "message_type": draw(st.sampled_from([1, 2, 3, 4])),
        "flags": draw(st.sampled_from([0, 1])),
        "delivery_timestamp_ms": draw(st.integers(0, 1 << 45)),
        "delivery_attempt": draw(st.integers(0, 20)),
    }
    out = []
    for i in range(draw(st.integers(4, 12))):
        if extras:
            props = draw(st.dictionaries(texts, texts, max_size=3))
        elif same_count is not None:
            props = draw(st.dictionaries(texts, texts, min_size=same_count, max_size=same_count))
        else:
            props = {}
        out.append(
            MessageRecord(
                **shared,  # type: ignore[arg-type]
                queue_id=0 if one_queue else draw(st.integers(0, 3)),
                body=draw(st.binary(max_size=300)),
                message_id=draw(st.text(alphabet="0123456789abcdef", min_size=id_len, max_size=id_len)),
                keys=draw(st.lists(texts, max_size=3).map(tuple)) if extras else (),
                properties=props,
                system_properties=draw(st.dictionaries(texts, texts, max_size=2))
                if extras
                else draw(st.dictionaries(texts, texts, min_size=same_sys, max_size=same_sys)),
                message_type=plain["message_type"] if alike else draw(st.sampled_from([1, 2, 3, 4])),
                flags=plain["flags"] if alike else draw(st.sampled_from([0, 1])),
                born_timestamp_ms=draw(st.integers(0, (1 << 64) - 1)),
                delivery_timestamp_ms=plain["delivery_timestamp_ms"] if alike else draw(st.integers(0, 1 << 45)),
                delivery_attempt=plain["delivery_attempt"] if alike else draw(st.integers(0, 20)),
                queue_offset=i,
            )
        )
    return out


@settings(PROPS, max_examples=300)
@given(recs=uniform_batches() | st.lists(records, min_size=1, max_size=8))
def test_encode_columns_writes_the_same_bytes_as_encode(recs: list[MessageRecord]) -> None:
    expected = b"".join(encode(dataclasses.replace(r, queue_offset=0, physical_offset=0, store_timestamp_ms=0))
                        for r in recs)  # fmt: skip
    enc = encode_columns(recs, NO_LIMIT)
    got = bytearray(enc.buf)
    for start in accumulate(enc.sizes[:-1], initial=0):  # the writer's fields are sealed later
        got[start + 20 : start + 44] = bytes(24)
    assert bytes(got) == expected
    assert enc.sizes == [len(encode(dataclasses.replace(r))) for r in recs]
    assert enc.message_ids == [r.message_id.encode() for r in recs]
    assert enc.queue_ids == [r.queue_id for r in recs]
    assert enc.one_queue == (len({(r.topic, r.queue_id) for r in recs}) == 1)
    shared = {(r.topic, r.tag, r.message_group, r.born_host, r.store_host, len(r.message_id.encode())) for r in recs}
    assert enc.uniform == (len(recs) >= 4 and len(shared) == 1)


def test_the_crc_is_zlibs_crc32() -> None:
    data = bytes(range(256)) * 9
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)[CRC_START:]) == zlib.crc32(data[CRC_START:])


@pytest.mark.parametrize("all_bad", [False, True])  # all bad: a uniform batch (the vector path)
@pytest.mark.parametrize("count", [1, 5])
def test_batch_encoding_rejects_what_encode_rejects(count: int, all_bad: bool) -> None:
    encoder = encode_columns
    good = MessageRecord(topic="t", queue_id=0, body=b"x")

    def batch(bad: MessageRecord) -> list[MessageRecord]:
        return [dataclasses.replace(bad) for _ in range(count)] if all_bad else [good] * (count - 1) + [bad]

    with pytest.raises(BadRequest, match="queue id -1 is negative"):
        encoder(batch(MessageRecord(topic="t", queue_id=-1, body=b"x")), NO_LIMIT)
    with pytest.raises(BadRequest, match="topic is too long"):
        encoder(batch(MessageRecord(topic="t" * 70_000, queue_id=0, body=b"x")), NO_LIMIT)
    with pytest.raises(BadRequest, match="message key is too long"):
        encoder(batch(MessageRecord(topic="t", queue_id=0, body=b"x", keys=("k" * 70_000,))), NO_LIMIT)
    with pytest.raises(BadRequest, match="out of range"):
        encoder(batch(MessageRecord(topic="t", queue_id=0, body=b"x", delivery_attempt=1 << 40)), NO_LIMIT)
    with pytest.raises(BadRequest, match="exceeds the store's record limit of 100 bytes"):
        encoder(batch(MessageRecord(topic="t", queue_id=0, body=b"x" * 200)), 100)
