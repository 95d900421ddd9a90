"""`MessageStore.acked_end`: a queue's end that can never change, from the replicated primary's
acknowledged CommitLog position (its durability's `acked_position`); without replication, the queue's end."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.store.config import StoreConfig
from broker.store.durability import LocalDurability
from broker.store.store import MessageStore
from common.record import MessageRecord


def message(n: int, queue_id: int) -> MessageRecord:
    return MessageRecord(topic="orders", queue_id=queue_id, body=b"x" * (100 + n), message_id=f"{n:032x}")


class HeldUpTo(LocalDurability):
    """Appends as standalone; the in-sync members hold the log up to `position` (None: all of it)."""

    position: int | None = None

    def acked_position(self) -> int | None:
        return self.position


def test_acked_end_follows_the_acknowledged_position(tmp_path: Path) -> None:
    held = HeldUpTo()
    store = MessageStore(tmp_path / "s", StoreConfig(), durability=held)
    try:
        # Interleaved queues: queue 0's offsets sit at every other position of the CommitLog.
        results = [asyncio.run(store.append([message(n, n % 2)]))[0] for n in range(20)]
        assert store.wait_dispatched(30)
        assert store.acked_end("orders", 0) == 10 and store.acked_end("nothing", 0) == 0
        ends = [r.physical_offset + r.size for r in results]
        for cut in range(20):  # everything up to and including message `cut` is held
            held.position = ends[cut]
            assert store.acked_end("orders", 0) == cut // 2 + 1
            assert store.acked_end("orders", 1) == (cut + 1) // 2
        held.position = ends[0] - 1  # not even the first message
        assert (store.acked_end("orders", 0), store.acked_end("orders", 1)) == (0, 0)
    finally:
        store.close()
