"""ConsumeQueue blocks: one RocksDB entry per queue, segment and round (broker/store/keys.py).

Every reader of the `cq` column family must see exactly what one key per message gave: reads that
start inside a block, tag filters across blocks, queue bounds, offset-by-time, the index trim of
recovery, retention, tiering's local eviction, and stores written before blocks existed (one
24-byte entry per key, which is a one-entry block).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from broker.store import keys as K
from broker.store.config import CommitLogConfig, RetentionConfig, StoreConfig
from broker.store.store import MessageStore, ReadStatus
from broker.tags import tag_hash
from common.record import MessageRecord

CONFIG = StoreConfig(commitlog=CommitLogConfig(segment_bytes=1 << 20))
SMALL_SEGMENTS = StoreConfig(
    commitlog=CommitLogConfig(segment_bytes=16 << 10),
    retention=RetentionConfig(max_age_s=60.0, max_disk_used_ratio=1.0),
)
TOPIC = "blocks"


def msg(i: int, queue_id: int = 0, tag: str | None = None, size: int = 100) -> MessageRecord:
    return MessageRecord(TOPIC, queue_id, f"m{i}|".encode().ljust(size, b"."), message_id=f"id-{i}", tag=tag)


def blocks(store: MessageStore, topic: str = TOPIC, queue_id: int = 0) -> list[tuple[int, int]]:
    """(first offset, entries) of a queue's ConsumeQueue blocks, in key order."""
    tid = store.index.topic_id(topic)
    assert tid is not None
    prefix = K.queue_prefix(tid, queue_id)
    out = []
    for key, value in store.index.cf(K.CF_CQ).items(from_key=prefix):
        if not key.startswith(prefix):
            break
        assert value and len(value) % K.CQ_ENTRY == 0
        out.append((K.cq_key_parse(key)[2], len(value) // K.CQ_ENTRY))
    return out


def offsets(store: MessageStore, start: int, count: int, **kw: object) -> list[int]:
    return [m.queue_offset for m in store.read(TOPIC, 0, start, max_messages=count, **kw).messages]  # type: ignore[arg-type]


def test_an_append_is_one_block_and_long_ones_split_at_the_cap(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        store.append_blocking([msg(i) for i in range(40)])
        store.append_blocking([msg(i) for i in range(40, 40 + 2 * K.CQ_BLOCK_MAX + 10)])
        n = 40 + 2 * K.CQ_BLOCK_MAX + 10
        assert blocks(store) == [(0, 40), (40, K.CQ_BLOCK_MAX), (40 + K.CQ_BLOCK_MAX, K.CQ_BLOCK_MAX), (n - 10, 10)]
        # A mixed-queue append gives one block per queue.
        store.append_blocking([msg(i, queue_id=1 + i % 2) for i in range(10)])
        assert blocks(store, queue_id=1) == [(0, 5)] and blocks(store, queue_id=2) == [(0, 5)]
        assert store.queue_bounds(TOPIC, 0) == (0, n)
    finally:
        store.close()


def test_reads_start_inside_blocks_and_cross_them(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        for start in range(0, 100, 20):
            store.append_blocking([msg(i) for i in range(start, start + 20)])
        assert [b for b, _ in blocks(store)] == [0, 20, 40, 60, 80]
        for start in (0, 1, 19, 20, 37, 59, 99):
            assert offsets(store, start, 30) == list(range(start, min(start + 30, 100)))
            assert store.get(TOPIC, 0, start).message_id == f"id-{start}"
        assert store.read(TOPIC, 0, 100).status is ReadStatus.NO_NEW_MESSAGES
        assert store.read(TOPIC, 0, 101).status is ReadStatus.OFFSET_OVERFLOW
    finally:
        store.close()


def test_tag_filter_across_blocks(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        tags = ["a" if i % 7 == 0 else "b" for i in range(120)]
        for start in range(0, 120, 30):
            store.append_blocking([msg(i, tag=tags[i]) for i in range(start, start + 30)])
        want = [i for i in range(120) if tags[i] == "a"]
        for start in (0, 3, 29, 31, 65):
            got = offsets(store, start, 100, tag_hashes=frozenset({tag_hash("a")}))
            assert got == [i for i in want if i >= start]
    finally:
        store.close()


def test_offset_for_timestamp_searches_blocks_then_inside_one(tmp_path: Path) -> None:
    """Hand-made blocks of one queue with rising (and repeating) store times, checked against a
    linear scan for every time around them."""
    rng = random.Random(7)
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        batch = store.index.batch()
        tid = store.index.intern_topic(TOPIC, batch)
        stamps: list[int] = []
        t = 1_000
        offset = 0
        while offset < 700:
            n = rng.choice((1, 1, 3, 50, K.CQ_BLOCK_MAX))
            entries = []
            for _ in range(n):
                t += rng.choice((0, 0, 1, 5))
                stamps.append(t)
                entries.append(K.cq_value(offset * 100, 100, 0, t))
                offset += 1
            batch.put(K.cq_key(tid, 0, offset - n), b"".join(entries), store.index.handle(K.CF_CQ))
        store.index.write(batch)
        assert store.queue_bounds(TOPIC, 0) == (0, len(stamps))
        for ts in range(stamps[0] - 2, stamps[-1] + 3):
            expected = next((i for i, s in enumerate(stamps) if s >= ts), len(stamps))
            assert store.offset_for_timestamp(TOPIC, 0, ts) == expected, ts
    finally:
        store.close()


def test_store_written_before_blocks_reads_and_continues(tmp_path: Path) -> None:
    """One 24-byte entry per key (the layout before blocks) reads as one-entry blocks, and new
    appends continue the queue in blocks."""
    data_dir = tmp_path / "s"
    store = MessageStore(data_dir, CONFIG)
    results = store.append_blocking([msg(i) for i in range(30)])
    # Rewrite the index as the old dispatcher wrote it: one key per message.
    tid = store.index.topic_id(TOPIC)
    assert tid is not None
    batch = store.index.batch()
    cq = store.index.handle(K.CF_CQ)
    for key, _ in list(store.index.cf(K.CF_CQ).items()):
        batch.delete(key, cq)
    for r in results:
        value = K.cq_value(r.physical_offset, r.size, 0, r.store_timestamp_ms)
        batch.put(K.cq_key(tid, 0, r.queue_offset), value, cq)
    store.index.write(batch)
    del batch, cq  # RocksDB keeps its lock while a handle is alive
    store.close()

    store = MessageStore(data_dir, CONFIG)
    try:
        assert blocks(store) == [(i, 1) for i in range(30)]
        assert store.queue_bounds(TOPIC, 0) == (0, 30)
        assert offsets(store, 7, 5) == [7, 8, 9, 10, 11]
        more = store.append_blocking([msg(i) for i in range(30, 60)])
        assert [r.queue_offset for r in more] == list(range(30, 60))
        assert blocks(store)[-1] == (30, 30)
        assert offsets(store, 25, 10) == list(range(25, 35))
        assert store.offset_for_timestamp(TOPIC, 0, 0) == 0
        assert store.offset_for_timestamp(TOPIC, 0, more[0].store_timestamp_ms) <= 30
    finally:
        store.close()


def test_index_trim_shortens_a_block_the_log_lost_part_of(tmp_path: Path) -> None:
    data_dir = tmp_path / "s"
    store = MessageStore(data_dir, CONFIG)
    results = store.append_blocking([msg(i) for i in range(20)])
    store.close()
    (segment,) = sorted((data_dir / "commitlog").glob("*.log"))
    with segment.open("r+b") as fh:  # the log lost records 12.. after they were dispatched
        fh.truncate(results[12].physical_offset + 5)

    store = MessageStore(data_dir, CONFIG)
    try:
        assert blocks(store) == [(0, 12)]
        assert store.queue_bounds(TOPIC, 0) == (0, 12)
        assert offsets(store, 10, 10) == [10, 11]
        more = store.append_blocking([msg(i) for i in range(100, 103)])
        assert [r.queue_offset for r in more] == [12, 13, 14]
        assert [m.message_id for m in store.read(TOPIC, 0, 11).messages] == ["id-11", "id-100", "id-101", "id-102"]
    finally:
        store.close()


def test_blocks_stay_inside_one_segment_and_retention_drops_exactly_theirs(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "s", SMALL_SEGMENTS)
    try:
        n = 0
        for size in (5, 40, 3, 60, 1, 25):  # appends that roll segments in their middle
            store.append_blocking([msg(i, size=300) for i in range(n, n + size)])
            n += size
        segs = store.segments.all()
        assert len(segs) >= 4
        tid = store.index.topic_id(TOPIC)
        assert tid is not None
        for first, count in blocks(store):
            block = store.index.cq_block(tid, 0, first)
            assert block is not None and block[0] == first
            physs = [e[0] for e in K.CQ_VALUE.iter_unpack(block[1])]
            assert len(physs) == count
            assert len({next(s.base for s in segs if s.base <= p < s.end) for p in physs}) == 1, first
        deleted = store.run_retention(now_s=time.time() + 10**6)
        assert deleted == len(segs) - 1
        first_kept = min(e.queue_offset for e in store.index.cq_entries(tid, 0, 0))
        active = store.segments.all()[0]
        assert store.queue_bounds(TOPIC, 0) == (first_kept, n)
        # Exactly the records of the active segment are left, every one readable.
        kept = offsets(store, first_kept, 500)
        assert kept == list(range(first_kept, n))
        assert all(store.index.cq_entry(tid, 0, o).physical_offset >= active.base for o in kept)  # type: ignore[union-attr]
    finally:
        store.close()


@pytest.mark.parametrize(("end", "expect"), [(50, [(50, 30)]), (63, [(63, 17)]), (79, [(79, 1)]), (80, [])])
def test_delete_below_an_offset_inside_a_block_keeps_the_rest(
    tmp_path: Path, end: int, expect: list[tuple[int, int]]
) -> None:
    """Tiering's local eviction drops a queue's entries below its tiered end, which may fall inside
    a block (broker/tiering/runtime.py)."""
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        store.append_blocking([msg(i) for i in range(50)])
        store.append_blocking([msg(i) for i in range(50, 80)])
        store.append_blocking([msg(i, queue_id=1) for i in range(5)])  # a neighbour left alone
        tid = store.index.topic_id(TOPIC)
        assert tid is not None
        batch = store.index.batch()
        store.index.delete_cq_below(batch, tid, 0, end)
        store.index.write(batch)
        assert blocks(store) == expect
        assert blocks(store, queue_id=1) == [(0, 5)]
        if expect:
            assert store.queue_bounds(TOPIC, 0) == (end, 80)
            assert offsets(store, end, 100) == list(range(end, 80))
            assert store.get(TOPIC, 0, end).message_id == f"id-{end}"
    finally:
        store.close()


def test_retention_of_queues_listed_once_per_segment(tmp_path: Path) -> None:
    """Appends to many queues at once (lite sends) over several rounds and segments: the dispatcher
    lists each queue in a segment once, with an offset it had then, and retention still deletes
    exactly the entries of each deleted segment (it finds the highest from the listed one); after a
    restart (the listing forgotten) the same holds."""
    queues = [65536 + q for q in range(7)]

    def sends(store: MessageStore, start: int, rounds: int) -> int:
        n = start
        for _ in range(rounds):
            store.append_blocking([msg(n + i, queue_id=queues[(n + i) % len(queues)], size=300) for i in range(9)])
            n += 9
        return n

    store = MessageStore(tmp_path / "s", SMALL_SEGMENTS)
    try:
        n = sends(store, 0, 40)
    finally:
        store.close()
    store = MessageStore(tmp_path / "s", SMALL_SEGMENTS)
    try:
        n = sends(store, n, 40)
        segs = store.segments.all()
        assert len(segs) >= 4
        tid = store.index.topic_id(TOPIC)
        assert tid is not None
        listed = [K.segq_key_parse(k) for k, _ in store.index.cf(K.CF_SEGQ).items()]
        assert len(listed) == len(set(listed))
        deleted = store.run_retention(now_s=time.time() + 10**6)
        assert deleted == len(segs) - 1
        active = store.segments.all()[0]
        for q in queues:
            kept = [e for e in store.index.cq_entries(tid, q, 0)]
            assert kept and all(e.physical_offset >= active.base for e in kept), q
            assert store.queue_bounds(TOPIC, q) == (kept[0].queue_offset, kept[-1].queue_offset + 1)
            assert [m.queue_offset for m in store.read(TOPIC, q, kept[0].queue_offset, max_messages=500).messages] == [
                e.queue_offset for e in kept
            ]
    finally:
        store.close()


def test_an_append_to_distinct_queues_puts_an_entry_each_and_reads_like_blocks(tmp_path: Path) -> None:
    """A mixed append whose records all go to different queues (a lite send) puts each entry as a
    block of one at once; one that repeats a queue (a priority send) gathers blocks. A queue written
    both ways in one round (two runs), and across rounds, reads in order, and each queue is listed
    in the segment (`segq`) for retention."""
    from broker.store.dispatcher import index_runs
    from broker.store.index import Index
    from broker.store.writer import AppendResults, Columns, Run

    index = Index(tmp_path / "index")
    try:

        def run(qids: list[int], qoffs: list[int], first_phys: int) -> Run:
            n = len(qids)
            cols = Columns([TOPIC] * n, qids, [0] * n, [f"p{first_phys + i}".encode() for i in range(n)], [()] * n)
            physs = [first_phys + 100 * i for i in range(n)]
            return Run(cols, AppendResults(qoffs, physs, [100] * n, 1), None, 0)

        touched = index_runs(index, [run([1, 2, 3], [0, 0, 0], 0), run([1, 1, 2], [1, 2, 1], 300)])
        index_runs(index, [run([3, 1, 2], [1, 3, 2], 600)])
        assert touched == {TOPIC: {1, 2, 3}}
        tid = index.topic_id(TOPIC)
        assert tid is not None
        got = {q: [(e.queue_offset, e.physical_offset) for e in index.cq_entries(tid, q, 0)] for q in (1, 2, 3)}
        assert got == {
            1: [(0, 0), (1, 300), (2, 400), (3, 700)],
            2: [(0, 100), (1, 500), (2, 800)],
            3: [(0, 200), (1, 600)],
        }
        assert [index.queue_bounds(tid, q) for q in (1, 2, 3)] == [(0, 4), (0, 3), (0, 2)]
        for q, offs in got.items():  # a read that starts inside what a round wrote
            assert [e.queue_offset for e in index.cq_entries(tid, q, 1)] == [o for o, _ in offs[1:]]
        listed = {K.segq_key_parse(key)[2] for key, _ in index.cf(K.CF_SEGQ).items()}
        assert listed == {1, 2, 3}
    finally:
        index.close()


def test_a_queue_noted_empty_starts_at_zero_without_asking_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new lite topic's queue is noted empty when it is created: its first append takes offset 0
    without the index lookup of where it ends; a queue not noted is looked up; the note is used once."""
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        asked: list[int] = []
        lookup = store.writer._lookup

        def counted(topic: str, qid: int) -> int:
            asked.append(qid)
            return lookup(topic, qid)

        monkeypatch.setattr(store.writer, "_lookup", counted)
        store.note_empty_queues(TOPIC, [5, 6])
        store.append_blocking([msg(i, queue_id=5 + i % 3) for i in range(6)])
        assert asked == [7]
        assert [store.queue_bounds(TOPIC, q) for q in (5, 6, 7)] == [(0, 2)] * 3
        store.append_blocking([msg(6 + i, queue_id=5) for i in range(2)])
        assert store.queue_bounds(TOPIC, 5) == (0, 4)
        assert [m.message_id for m in store.read(TOPIC, 5, 0).messages] == ["id-0", "id-3", "id-6", "id-7"]
    finally:
        store.close()


def test_cq_heads_at_block_starts_inside_blocks_and_past_the_end(tmp_path: Path) -> None:
    """A lite pop's head reads (`Index.cq_heads`): the entry at each offset and whether another
    follows, whether the offset starts a block (the multi-get), lies inside one (the seek), ends
    one with or without a block after it, or is past the queue's end; as `cq_entries` says."""
    store = MessageStore(tmp_path / "s", CONFIG)
    try:
        store.append_blocking([msg(0, queue_id=1)])  # queue 1: one-entry blocks [0], [1], then [2, 3, 4]
        store.append_blocking([msg(1, queue_id=1)])
        store.append_blocking([msg(i, queue_id=1) for i in range(2, 5)])
        store.append_blocking([msg(9, queue_id=2)])  # queue 2: one entry; queue 3: none
        assert blocks(store, queue_id=1) == [(0, 1), (1, 1), (2, 3)]
        tid = store.index.topic_id(TOPIC)
        assert tid is not None
        positions = [(1, o) for o in range(6)] + [(2, 0), (2, 1), (3, 0)]
        expected = []
        for qid, offset in positions:
            entries = [e for e in store.index.cq_entries(tid, qid, offset)]
            head = entries[0] if entries and entries[0].queue_offset == offset else None
            expected.append((head, head is not None and len(entries) > 1))
        got = store.index.cq_heads(tid, positions)
        assert got == expected
        assert [more for _, more in got] == [True, True, True, True, False, False, False, False, False]
        assert [e is None for e, _ in got] == [False] * 5 + [True, False, True, True]
    finally:
        store.close()
