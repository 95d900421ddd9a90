"""The epoch truncation rule and the member's local epoch file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.replication.epochs import Epoch, LocalEpoch, check_history, end_of_epoch, truncation_point

HISTORY = [Epoch(1, 0), Epoch(2, 900), Epoch(4, 1500)]


def test_end_of_epoch_is_the_start_of_the_next_one() -> None:
    assert end_of_epoch(HISTORY, 1, 2000) == 900
    assert end_of_epoch(HISTORY, 2, 2000) == 1500
    assert end_of_epoch(HISTORY, 3, 2000) == 1500  # an epoch that never wrote on this primary's line
    assert end_of_epoch(HISTORY, 4, 2000) == 2000  # the current epoch ends at the primary's log end
    assert end_of_epoch(HISTORY, 0, 2000) == 0  # a member that never held data keeps nothing


def test_a_deposed_primary_drops_the_tail_the_next_term_never_had() -> None:
    # It led epoch 1 and wrote up to 1100; epoch 2 began at 900 on another member.
    assert truncation_point(HISTORY, 1, 1100, 2000) == 900
    # A replica of the current epoch that is behind keeps everything it has.
    assert truncation_point(HISTORY, 4, 1700, 2000) == 1700
    # A wiped member starts from scratch.
    assert truncation_point(HISTORY, 0, 0, 2000) == 0


def test_history_order_is_checked() -> None:
    check_history(HISTORY)
    with pytest.raises(ValueError):
        check_history([Epoch(2, 0), Epoch(2, 10)])
    with pytest.raises(ValueError):
        check_history([Epoch(1, 10), Epoch(2, 5)])


def test_local_epoch_survives_reopen_and_never_goes_back(tmp_path: Path) -> None:
    local = LocalEpoch(tmp_path / "replication")
    assert local.value == 0
    local.set(3)
    assert LocalEpoch(tmp_path / "replication").value == 3
    with pytest.raises(ValueError):
        local.set(2)
