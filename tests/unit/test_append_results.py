"""`AppendResults`: the results of a run, built from the writer's columns on access."""

from __future__ import annotations

import pytest

from broker.store.writer import AppendResult, AppendResults


def test_reads_like_the_list_of_results_it_stands_for() -> None:
    physs, sizes = [1000, 1100, 1250, 1300], [100, 150, 50, 70]
    lazy = AppendResults(range(7, 11), physs, sizes, 555)
    eager = [AppendResult(7 + i, physs[i], sizes[i], 555) for i in range(4)]
    assert len(lazy) == 4
    assert list(lazy) == eager and lazy == eager and lazy == AppendResults(range(7, 11), physs, sizes, 555)
    assert lazy != eager[:3]
    assert [lazy[i] for i in range(-4, 4)] == eager + eager
    assert lazy[1:3] == eager[1:3]
    assert lazy.queue_offsets == range(7, 11)
    for bad in (4, -5):
        with pytest.raises(IndexError):
            lazy[bad]
    assert lazy + eager[:1] == [*eager, eager[0]]
    assert eager[:1] + lazy == [eager[0], *eager]
    acc: list[AppendResult] = []
    acc += lazy
    assert acc == eager
    (a, b, c, d) = lazy
    assert (a.queue_offset, d.physical_offset, c.size, b.store_timestamp_ms) == (7, 1300, 50, 555)
    assert lazy.index(eager[2]) == 2 and eager[3] in lazy
    mixed = AppendResults([3, 0, 4, 1], physs, sizes, 555)  # an append to several queues
    assert [r.queue_offset for r in mixed] == [3, 0, 4, 1] and mixed[-1] == AppendResult(1, 1300, 70, 555)
