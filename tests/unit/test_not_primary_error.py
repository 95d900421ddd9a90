"""`NotPrimary` crosses the internal RPC: (code, message) rebuilds it, so a proxy can tell "this
member is not the group's primary" (wait for the new one and retry there) from other refusals."""

from __future__ import annotations

from common.codes import Code
from common.errors import NotPrimary, Unavailable, code_of, error_for_code


def test_not_primary_survives_the_internal_rpc() -> None:
    sent = NotPrimary("broker b1 is a replica of group g1, not its primary")
    assert code_of(sent) is Code.HA_NOT_AVAILABLE and sent.retriable
    got = error_for_code(code_of(sent), sent.message)
    assert type(got) is NotPrimary and got.message == sent.message
    assert NotPrimary(sent.message).message == sent.message  # the suffix is added once


def test_other_unavailable_refusals_stay_unavailable() -> None:
    got = error_for_code(Code.HA_NOT_AVAILABLE, "group g1 has 1 member(s) in sync, fewer than min_insync 2")
    assert type(got) is Unavailable
