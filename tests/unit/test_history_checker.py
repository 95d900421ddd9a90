"""The fault tests' history checker (tests/e2e/support/history.py): its order rule for ordered streams."""

from __future__ import annotations

from tests.e2e.support.history import History


def _ordered(*bodies: str) -> History:
    history = History()
    for body in bodies:
        history.sent(body, stream="g")
    return history


def test_in_order_with_acks_is_clean() -> None:
    history = _ordered("g:0", "g:1")
    history.delivered("g:0", (0, 0))
    history.acked("g:0", (0, 0))
    history.delivered("g:1", (0, 1))
    history.acked("g:1", (0, 1))
    verdict = history.verdict()
    assert not verdict.out_of_order and not verdict.lost and not verdict.redelivered_after_ack


def test_a_later_message_before_an_earlier_one_is_settled_is_out_of_order() -> None:
    history = _ordered("g:0", "g:1")
    history.delivered("g:0", (0, 0))
    history.delivered("g:1", (0, 1))  # g:0 neither acked nor failed yet
    assert history.verdict().out_of_order == ["g:1 (stream g: g:0 unsettled)"]


def test_skipping_an_acknowledged_message_is_out_of_order_and_lost() -> None:
    history = _ordered("g:0", "g:1")
    history.delivered("g:1", (0, 1))
    verdict = history.verdict()
    assert verdict.out_of_order and verdict.lost == ["g:0"]


def test_redelivery_after_a_failed_ack_is_allowed() -> None:
    history = _ordered("g:0", "g:1")
    history.delivered("g:0", (0, 0))
    history.ack_failed("g:0")  # the broker may have applied it, and then lost it in a failover
    history.delivered("g:1", (0, 1))
    history.delivered("g:0", (0, 0))
    history.acked("g:0", (0, 0))
    history.delivered("g:1", (0, 1))
    history.acked("g:1", (0, 1))
    verdict = history.verdict()
    assert not verdict.out_of_order and not verdict.redelivered_after_ack and verdict.duplicates == 2


def test_unordered_and_unknown_messages_take_no_part() -> None:
    history = History()
    history.sent("a")
    history.sent("g:0", stream="g")
    history.delivered("never-acknowledged", (1, 0))
    history.delivered("a", (0, 0))
    history.delivered("g:0", (2, 0))
    assert not history.verdict().out_of_order
