"""broker/tracekeys.py: key order (what lookups and retention rely on) and both value encodings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import tracekeys as K

texts = st.text(min_size=1, max_size=40)
u32 = st.integers(0, 2**32 - 1)
u63 = st.integers(0, 2**63 - 1)


@given(texts, u32, u63, u63, u32)
def test_position_keys_share_the_position_prefix(topic: str, qid: int, offset: int, t: int, seq: int) -> None:
    key = K.position_key(7, topic, qid, offset, t, seq)
    assert key.startswith(K.position_prefix(7, topic, qid, offset))
    assert [key] == list(K.position_keys_after(K.topic_prefix(7, topic), [qid], [offset], t, [seq]))
    assert K.position_time(key) == t


@given(texts, u32, st.lists(st.integers(1, 2**40), min_size=2, max_size=8, unique=True), st.integers(0, 2**40))
def test_range_seek_lands_on_the_first_range_ending_after_the_offset(
    topic: str, qid: int, ends: list[int], offset: int
) -> None:
    prefix = K.range_queue_prefix(K.KIND_SENT, 3, topic, qid)
    keys = sorted(K.range_key(K.KIND_SENT, 3, topic, qid, end, 0) for end in ends)
    seek = K.range_seek(prefix, offset)
    first = next((k for k in keys if k >= seek), None)
    after = [e for e in sorted(ends) if e > offset]
    assert (first is None) == (not after)
    if first is not None:
        assert first == K.range_key(K.KIND_SENT, 3, topic, qid, after[0], 0)


def test_buckets_order_keys_so_retention_is_a_range_deletion() -> None:
    old = K.position_key(5, "t", 0, 0, 1, 0)
    new = K.position_key(6, "t", 0, 0, 1, 0)
    assert K.bucket_prefix(K.KIND_POSITION, 0) <= old < K.bucket_prefix(K.KIND_POSITION, 6) <= new


def test_compact_and_json_values_round_trip() -> None:
    assert K.decode_value(K.encode_compact("delivered", 3, b"g1"), 99) == {
        "k": "delivered", "t": 99, "attempt": 3, "group": "g1",
    }  # fmt: skip
    assert K.decode_value(K.encode_compact("acked", 0, "grüppe".encode()), 5)["group"] == "grüppe"
    doc = K.decode_value(K.encode_value({"k": "invisible", "t": 4, "invisible_ms": 500}))
    assert doc == {"v": 1, "k": "invisible", "t": 4, "invisible_ms": 500}


@pytest.mark.parametrize("raw", [b"\x02\x09\x00\x00\x00\x01g", b'{"v": 9, "k": "acked"}', b"[]"])
def test_unknown_values_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        K.decode_value(raw)
