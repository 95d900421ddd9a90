"""Epochs: the term numbers of a group's primaries, and the truncation rule of a returning member.

A group's history is a list of `Epoch(number, start_offset)` kept in etcd (coordinator.py): the
primary of `number` began writing at CommitLog offset `start_offset`. Numbers strictly increase and
start offsets never decrease along the list.

A member remembers only the last epoch whose data it holds (`LocalEpoch`, one file in its data
directory). Joining a primary, it keeps its log up to `truncation_point(...)` and drops the rest:
that tail was written by an old primary after the next term had begun, so no in-sync member had it
when the term changed and it was never acknowledged (docs/replication.md).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Epoch:
    number: int
    start_offset: int


def end_of_epoch(history: Sequence[Epoch], epoch: int, log_end: int) -> int:
    """Where `epoch` ended in `history` (in order): the start of the first later epoch, else `log_end`."""
    for e in history:
        if e.number > epoch:
            return e.start_offset
    return log_end


def truncation_point(history: Sequence[Epoch], member_epoch: int, member_end: int, primary_end: int) -> int:
    """The offset a member whose last epoch is `member_epoch` and whose log ends at `member_end`
    keeps its log up to, joining a primary with `history` and log end `primary_end`."""
    return min(member_end, end_of_epoch(history, member_epoch, primary_end))


def check_history(history: Sequence[Epoch]) -> None:
    """Raise ValueError unless numbers strictly increase and start offsets never decrease."""
    for a, b in itertools.pairwise(history):
        if b.number <= a.number or b.start_offset < a.start_offset:
            raise ValueError(f"epoch history out of order: {a} then {b}")


class LocalEpoch:
    """The last epoch whose data this member holds (0: none), in `<dir>/epoch`, written atomically.

    Write it only after the log agrees with it: after truncating for a new primary, or on winning a
    term before accepting writes; a crash in between leaves the older value, which only truncates more.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / "epoch"
        self.value = int(self._path.read_text().strip() or 0) if self._path.exists() else 0

    def set(self, epoch: int) -> None:
        if epoch < self.value:
            raise ValueError(f"epoch cannot go back from {self.value} to {epoch}")
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(f"{epoch}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)
        fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.value = epoch
