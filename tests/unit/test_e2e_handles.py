"""The e2e tests' reading of receipt handles (tests/e2e/support/handles.py, which may not import the
broker's codec) says what the codec wrote: broker, queue, offset and version of any handle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client import receipt
from tests.e2e.support import handles

U32 = st.integers(0, (1 << 32) - 1)
U64 = st.integers(0, (1 << 64) - 1)


@given(
    broker=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    queue_id=U32, queue_offset=U64, version=U32, until=U64, topic_crc=U32, group_crc=U32,
)  # fmt: skip
def test_the_e2e_reading_matches_the_codec(
    broker: str, queue_id: int, queue_offset: int, version: int, until: int, topic_crc: int, group_crc: int
) -> None:
    handle = receipt.encode(broker, queue_id, queue_offset, version, until, topic_crc, group_crc)
    assert handles.fields(handle) == (broker, queue_id, queue_offset, version)


def test_a_handle_of_another_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        handles.fields("b1~" + "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")  # format byte 2
