"""A topic's deletion record (broker/store/deletion.py) draws one line through the CommitLog.

Appends of every shape go to a topic from many tasks at once while it is deleted twice (and a
batch of deletion records, a run of its own, deletes other topics); where each deletion record
landed in the log decides what is gone: every queue of the topic starts where it stood at its
last deletion, holds exactly the messages stored after it, and goes on from there; lookups by id
and key find only those. The index the live writer built, the index recovery rebuilds from the
CommitLog alone, and the index a replica builds from copies of the log are equal, so a restart or
a failover never brings an old message back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.store import keys as K
from broker.store.deletion import DELETION_TOPIC, deletion_record
from broker.store.store import MessageStore, ReadStatus
from broker.store.writer import AppendResult
from common.record import MessageRecord, peek_size
from tests.integration.test_store_append_paths import CONFIG, dump, message, shapes

TOPIC = "orders"  # the topic `shapes` sends most to, and the one deleted
COPY_CHUNK_RECORDS = 37  # a replica copies whole records, in pieces of this many


def deletions_of(appends: list[list[MessageRecord]], results: list[Sequence[AppendResult]], topic: str) -> list[int]:
    """Where the records deleting `topic` landed in the log, in order."""
    stored = (pair for batch, res in zip(appends, results, strict=True) for pair in zip(batch, res, strict=True))
    return sorted(r.physical_offset for rec, r in stored if rec.topic == DELETION_TOPIC and rec.keys == (topic,))


def dump_lines(store: MessageStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """`dump`, with each `segq` listing of a deleted topic's old messages only made one value: the
    offset a segment lists such a queue with depends on how dispatch rounds were cut, and nothing
    reads it (retention deletes no entry there, tiering needs none of them)."""
    out = dump(store)
    segq = []
    for key, value in out[K.CF_SEGQ]:
        _, tid, qid = K.segq_key_parse(key)
        old = K.U64.unpack(value)[0] < store.index.incarnation_floor(tid, qid)
        segq.append((key, b"old" if old else value))
    out[K.CF_SEGQ] = segq
    return out


async def copy_log(source: MessageStore, replica: MessageStore) -> None:
    """Copy `source`'s CommitLog into `replica` as a replica does: whole records, at the same offsets."""
    for seg in source.segments.all():
        data = seg.path.read_bytes()[: seg.size]
        start = pos = n = 0
        while pos < len(data):
            pos += peek_size(data, pos)[0]
            n += 1
            if n == COPY_CHUNK_RECORDS or pos == len(data):
                await replica.append_copy(seg.base, start, data[start:pos])
                start, n = pos, 0


@pytest.mark.parametrize("inline_bytes", [64 << 10, 0], ids=["loop", "thread"])
def test_a_deletion_ends_the_topic_where_it_lies_in_the_log_live_after_recovery_and_on_a_replica(
    tmp_path: Path, inline_bytes: int
) -> None:
    config = dataclasses.replace(
        CONFIG, commitlog=dataclasses.replace(CONFIG.commitlog, inline_append_max_bytes=inline_bytes)
    )
    appends = shapes()
    for at in (len(appends) // 3, 2 * len(appends) // 3):
        appends.insert(at, [deletion_record(TOPIC)])
    appends.insert(len(appends) // 2, [deletion_record(f"gone-{i}") for i in range(6)])  # a run of its own

    async def run() -> tuple[list[Sequence[AppendResult]], dict[str, list[tuple[bytes, bytes]]]]:
        store = MessageStore(tmp_path / "live", config)
        try:
            results = list(await asyncio.gather(*(store.append(a) for a in appends)))
            assert store.wait_dispatched(30)
            assert len(store.segments.all()) > 3, "the test needs segment rolls"
            check(store, results)
            replica = MessageStore(tmp_path / "replica", config)
            try:
                await copy_log(store, replica)
                assert replica.wait_dispatched(30)
                assert replica.dispatcher.failed is None
                assert dump_lines(replica) == dump_lines(store)
                check(replica, results)
            finally:
                replica.close()
            return results, dump_lines(store)
        finally:
            store.close()

    def check(store: MessageStore, results: list[Sequence[AppendResult]]) -> None:
        last = deletions_of(appends, results, TOPIC)[-1]
        assert store.deleted_at(TOPIC) == last
        assert all(store.deleted_at(f"gone-{i}") >= 0 for i in range(6))
        by_queue: dict[int, list[tuple[int, int, MessageRecord]]] = {}
        for batch, res in zip(appends, results, strict=True):
            for rec, r in zip(batch, res, strict=True):
                if rec.topic == TOPIC:
                    by_queue.setdefault(rec.queue_id, []).append((r.queue_offset, r.physical_offset, rec))
        for qid, stored in by_queue.items():
            stored.sort()
            assert [o for o, _, _ in stored] == list(range(len(stored))), "offsets go on through deletions"
            old = [s for s in stored if s[1] < last]
            kept = [s for s in stored if s[1] > last]
            assert old + kept == stored, f"queue {qid}: every message before the deletion is older"
            assert store.queue_bounds(TOPIC, qid) == (len(old), len(stored))
            assert store.incarnation_floor(TOPIC, qid) == len(old)
            read = store.read(TOPIC, qid, 0, max_messages=1000)
            assert read.status is ReadStatus.OFFSET_TOO_SMALL and read.next_offset == len(old)
            if kept:
                got = store.read(TOPIC, qid, len(old), max_messages=1000).messages
                assert [m.message_id for m in got] == [rec.message_id for _, _, rec in kept]
            for _, _, rec in old:
                if rec.message_id:
                    assert store.find_by_id(rec.message_id, TOPIC) == [], "an old message is found by id"
            for _, _, rec in kept:
                if rec.message_id:
                    assert [m.queue_id for m in store.find_by_id(rec.message_id, TOPIC)] == [qid]
        with_key = sum(1 for stored in by_queue.values() for _, p, rec in stored if p > last and "k2" in rec.keys)
        assert len(store.find_by_key(TOPIC, "k2", limit=1000)) == with_key
        assert store.queue_bounds("pay-ü", 0)[0] == 0, "other topics keep everything"

    results, live = asyncio.run(run())

    # Rebuild the index from the CommitLog alone: recovery re-applies the deletions where they lie.
    shutil.rmtree(tmp_path / "live" / "index")
    store = MessageStore(tmp_path / "live", config)
    try:
        assert store.recovery is not None and store.recovery.records == sum(map(len, appends))
        assert dump_lines(store) == live
        check(store, results)
        nxt = store.append_blocking([message(10_000, TOPIC, 0)])
        assert nxt[0].queue_offset == store.queue_bounds(TOPIC, 0)[1] - 1, "the next offset follows the last"
    finally:
        store.close()


def test_a_deletion_in_the_middle_of_a_round_ends_the_entries_before_it_in_that_round(tmp_path: Path) -> None:
    """Appends made in one event-loop iteration are one round (one dispatch batch) in the order they
    were made: the deletion record takes the round's entries before it (a lite send's, put at once,
    and a queue's open block) and leaves those after it. (The record is appended as any record here;
    `delete_topic` hands it to the writer thread, whose rounds gather what queued meanwhile alike.)"""
    old_lite = [message(i, TOPIC, 65536 + i % 3) for i in range(6)]
    old, new = message(50, TOPIC, 0), [message(100 + i, TOPIC, i % 2) for i in range(4)]

    async def run() -> None:
        store = MessageStore(tmp_path / "s", CONFIG)
        try:
            rounds = store.writer.rounds
            appends = [old_lite, [old], [deletion_record(TOPIC)], *([m] for m in new)]
            results = await asyncio.gather(*(store.append(a) for a in appends))
            assert store.writer.rounds == rounds + 1, "one round"
            assert [store.queue_bounds(TOPIC, q) for q in (0, 1, 65536, 65537, 65538)] == [
                (1, 3), (0, 2), (2, 2), (2, 2), (2, 2)
            ]  # fmt: skip
            assert store.deleted_at(TOPIC) == results[2][0].physical_offset
            assert [m.body for m in store.read(TOPIC, 0, 1).messages] == [new[0].body, new[2].body]
            assert [m.body for m in store.read(TOPIC, 1, 0).messages] == [new[1].body, new[3].body]
        finally:
            store.close()

    asyncio.run(run())
