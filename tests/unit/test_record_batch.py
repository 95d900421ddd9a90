"""Batch appends and sealing of the CommitLog codec (common/record.py).

`placed` (records a send's edge encoded, joined; records the broker made, encoded by `encode_one`)
+ `seal_at` are the store's one append path; they must produce exactly the bytes of `encode` +
`seal` record by record (the on-disk format v1 is a contract), and reject bad input with the same
errors.
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
    outgoing,
    placed,
    received,
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
    buf, sizes = placed(recs, NO_LIMIT)
    assert sizes == [len(encode(dataclasses.replace(r))) for r in recs]
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


def as_received(rec: MessageRecord) -> MessageRecord:
    """`rec` as a send brings it: encoded by an edge (`outgoing`), verified and placed (`received`)."""
    data = outgoing(rec.body, rec.message_id, rec.message_type, rec.tag, rec.keys, rec.message_group, rec.properties,
                    rec.system_properties, rec.born_timestamp_ms, rec.born_host, rec.delivery_timestamp_ms,
                    bool(rec.flags & 1))  # fmt: skip
    return received([data], rec.topic, rec.queue_id, rec.store_host)[0]


@settings(PROPS, max_examples=200)
@given(recs=st.lists(records, min_size=1, max_size=8), sent=st.lists(st.booleans(), min_size=8, max_size=8),
       moved=st.sampled_from([0, 3]))  # fmt: skip
def test_placed_writes_the_same_bytes_for_sent_and_broker_made_records(
    recs: list[MessageRecord], sent: list[bool], moved: int
) -> None:
    """A batch mixing records a send brought (their edge buffers, one moved to another queue after
    `received`, as lite and priority sends move them) and records the broker made (encoded by
    `encode_one`) is the bytes `encode` writes for each, writer fields 0."""
    batch = [as_received(r) if s else dataclasses.replace(r) for r, s in zip(recs, sent, strict=False)]
    for rec in batch:
        rec.queue_id += moved
    expected = b"".join(encode(dataclasses.replace(r, queue_offset=0, physical_offset=0, store_timestamp_ms=0))
                        for r in batch)  # fmt: skip
    buf, sizes = placed(batch, NO_LIMIT)
    assert bytes(buf) == expected
    assert sizes == [len(encode(dataclasses.replace(r))) for r in batch]


def test_the_crc_is_zlibs_crc32() -> None:
    data = bytes(range(256)) * 9
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)[CRC_START:]) == zlib.crc32(data[CRC_START:])


@pytest.mark.parametrize("all_bad", [False, True])
@pytest.mark.parametrize("count", [1, 5])
def test_batch_encoding_rejects_what_encode_rejects(count: int, all_bad: bool) -> None:
    def encoder(recs: list[MessageRecord], limit: int) -> None:
        placed(recs, limit)

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
