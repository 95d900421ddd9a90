"""Timer index layouts and the recall handle: byte order is time order, handles round-trip, and
anything malformed is a BadRequest that names the problem."""

from __future__ import annotations

import pytest

from broker.client import recall as RC
from broker.timer import keys as TK
from common.errors import BadRequest


def test_keys_sort_by_due_time_then_position() -> None:
    pairs = [(2_000, 5), (1_000, 9), (1_000, 2), (10**13, 0), (2_000, 1)]
    keys = sorted(TK.timer_key(d, p) for d, p in pairs)
    assert [TK.parse_timer_key(k) for k in keys] == sorted(pairs)
    assert all(k < TK.MAX_KEY for k in keys)


def test_values_and_positions_round_trip() -> None:
    assert TK.parse_timer_value(TK.timer_value(4096, "orders-ü")) == (4096, "orders-ü")
    assert TK.parse_pos_key(TK.pos_key(123_456_789)) == 123_456_789
    assert TK.pos_key(1) < TK.pos_key(256)


@pytest.mark.parametrize(
    ("ms", "precision", "expected"),
    [(1_000, 1_000, 1_000), (1_001, 1_000, 2_000), (999, 1_000, 1_000), (1_234, 100, 1_300), (7, 1, 7)],
)
def test_round_up_never_early(ms: int, precision: int, expected: int) -> None:
    assert TK.round_up(ms, precision) == expected


def test_recall_handle_round_trips_and_names_its_broker() -> None:
    handle = RC.RecallHandle("broker-a~x", 1_700_000_000_000, 42, TK.topic_crc("t"))
    text = handle.encode()
    assert RC.decode_recall_handle(text) == handle
    assert RC.broker_of_recall_handle(text) == "broker-a~x"  # the last separator splits


@pytest.mark.parametrize(
    ("text", "says"),
    [("", "empty"), ("nobroker", "no broker name"), ("~AQAA", "no broker name"), ("b~!!!", "malformed"),
     ("b~AQAA", "malformed"), ("b~" + "A" * 600, "too long"),
     ("b~" + RC.RecallHandle("b", 1, 2, 3).encode().split("~")[1].replace("A", "C", 1), "unknown format")],
)  # fmt: skip
def test_malformed_recall_handles_are_bad_requests(text: str, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        RC.decode_recall_handle(text)
