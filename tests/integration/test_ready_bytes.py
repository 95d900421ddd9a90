"""`ReadyBytes` on a real store: the body bytes of a queue's ready offsets read from the records'
headers (neighbours with one read, a large record's size alone, interleaved queues apart), kept as
the queue grows and its consumed offset moves, read again when the offsets go backwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker import readybytes
from broker.readybytes import ReadBehind, ReadyBytes, body_sizes
from broker.store.config import StoreConfig
from broker.store.store import MessageStore
from common.record import MessageRecord


def message(body: bytes, queue_id: int = 0, topic: str = "q") -> MessageRecord:
    return MessageRecord(topic=topic, queue_id=queue_id, body=body, message_id=body[:8].hex() + f"{len(body):024x}")


@pytest.fixture
def store(tmp_path: Path) -> MessageStore:
    s = MessageStore(tmp_path / "s", StoreConfig())
    yield s  # type: ignore[misc]
    s.close()


def append(store: MessageStore, records: list[MessageRecord]) -> None:
    asyncio.run(store.append(records))
    assert store.wait_dispatched(30)


def test_body_sizes_reads_neighbours_large_records_and_interleaved_queues(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readybytes, "_SMALL_RECORD", 600)  # records above it: their body size alone
    monkeypatch.setattr(readybytes, "_COALESCE_BYTES", 1500)  # a run of neighbours stops at this
    want = [5, 900, 17, 300, 301, 302, 303, 2000, 1, 2]
    # queue 0 gets every message; queue 1 one after each of the first three (so not back to back)
    for i, n in enumerate(want):
        append(store, [message(bytes([65 + i]) * n, 0)] + ([message(b"other" * (i + 1), 1)] if i < 3 else []))
    tid = store.index.topic_id("q")
    assert tid is not None
    assert body_sizes(store, tid, 0, 0, 10) == list(enumerate(want))
    assert body_sizes(store, tid, 0, 3, 8) == [(o, want[o]) for o in range(3, 8)]
    assert body_sizes(store, tid, 1, 0, 3) == [(0, 5), (1, 10), (2, 15)]
    assert body_sizes(store, tid, 0, 10, 10) == []


def test_ready_bytes_follows_appends_cursor_consumed_and_due(store: MessageStore) -> None:
    rb = ReadyBytes(store, max_tracked=2)
    key = ("g", "q", 0)
    append(store, [message(b"a" * n) for n in (10, 20, 30)])
    assert rb.ready(key, 0, 0, 3, []) == 60
    assert rb.ready(key, 0, 2, 3, []) == 30  # two delivered, in flight
    assert rb.ready(key, 0, 2, 3, [1]) == 50  # the second requeued
    append(store, [message(b"b" * n) for n in (40, 50)])
    assert rb.ready(key, 1, 2, 5, [1]) == 20 + 30 + 40 + 50  # the first acknowledged
    assert rb.ready(key, 3, 4, 5, []) == 50
    assert rb.ready(key, 0, 0, 5, []) == 150  # reset backwards: read again
    assert rb.ready(key, 5, 5, 5, []) == 0 and len(rb) == 0  # nothing left: not tracked
    assert rb.ready(("g", "missing", 0), 0, 0, 3, []) == 0
    for n in range(3):  # at most max_tracked queues
        rb.ready((f"g{n}", "q", 0), 0, 0, 5, [])
    assert len(rb) == 2
    rb.forget("g2")  # a group deleted
    assert len(rb) == 1


def test_a_long_read_is_left_to_a_worker_thread(store: MessageStore) -> None:
    rb = ReadyBytes(store, inline_max=3)
    key = ("g", "q", 0)
    append(store, [message(b"a" * n) for n in range(1, 9)])  # 8 messages, 36 bytes
    assert rb.ready(key, 0, 0, 2, []) == 3  # two to read: inline
    with pytest.raises(ReadBehind) as behind:
        rb.ready(key, 0, 0, 8, [])
    assert (behind.value.start, behind.value.end) == (2, 8)
    asyncio.run(rb.catch_up(behind.value))
    assert rb.ready(key, 0, 0, 8, []) == 36
    with pytest.raises(ReadBehind) as stale:
        rb.ready(key, 8, 8, 8, []) or rb.ready(key, 0, 0, 8, [])  # untracked, then read again from 0
    rb.ready(key, 5, 5, 8, [])  # meanwhile the sums start over from 5 (read inline)
    asyncio.run(rb.catch_up(stale.value))  # an answer for sums since replaced is dropped
    assert rb.ready(key, 5, 6, 8, [5]) == 6 + 7 + 8
