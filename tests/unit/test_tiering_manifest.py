"""The tiered manifest (broker/tiering/manifest.py) over `MemoryKV`, and the byte-bounded LRU cache.

Object keys are deterministic and percent-encoded; progress and segment entries change together;
`locate` finds the row group of the first message at or after an offset, across segments and gaps;
expiry keeps pending deletes until they are cleared; a reopened manifest sees the same state and
epoch; the mirror document has the documented shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.tiering.cache import LruCache
from broker.tiering.format import RowGroupRef
from broker.tiering.kv import MemoryKV
from broker.tiering.localstore import LocalDirObjectStore
from broker.tiering.manifest import Manifest, SegmentEntry
from common.errors import PreconditionFailed


def entry(manifest: Manifest, topic: str, seq: int, queues: dict[int, tuple[int, int]], per_rg: int) -> SegmentEntry:
    """A segment whose row groups hold `per_rg` rows each, queues in id order."""
    rows = [(q, o) for q, (a, b) in sorted(queues.items()) for o in range(a, b + 1)]
    groups = []
    for i in range(0, len(rows), per_rg):
        chunk = rows[i : i + per_rg]
        groups.append(RowGroupRef(*chunk[0], *chunk[-1], len(chunk), 4 + i * 10, 4 + (i + len(chunk)) * 10))
    return SegmentEntry(seq, manifest.object_key(topic, seq), 1000, "ab" * 32, len(rows), queues, 10 * seq,
                        10 * seq + 9, 0, tuple(groups))  # fmt: skip


def add(manifest: Manifest, topic: str, queues: dict[int, tuple[int, int]], per_rg: int = 4) -> SegmentEntry:
    seg = entry(manifest, topic, manifest.progress(topic).next_seq, queues, per_rg)
    manifest.add_segment(topic, seg, {q: last + 1 for q, (_, last) in queues.items()})
    return seg


def test_keys_are_deterministic_and_encoded() -> None:
    kv = MemoryKV()
    m = Manifest(kv, prefix="/archive/", cluster="c 1", broker="b")
    assert m.object_key("%RETRY%g/ü", 7) == f"archive/c%201/b/%25RETRY%25g%2F%C3%BC/0000000007-{m.epoch}.parquet"
    assert m.mirror_key("t") == "archive/c%201/b/t/manifest.json"
    again = Manifest(kv, prefix="archive", cluster="c 1", broker="b")
    assert again.epoch == m.epoch and len(m.epoch) == 12
    assert Manifest(MemoryKV(), prefix="", cluster="c", broker="b").object_key("t", 0).startswith("c/b/t/")
    assert Manifest(MemoryKV(), prefix="", cluster="c", broker="b").epoch != m.epoch


def test_segments_progress_and_locate() -> None:
    kv = MemoryKV()
    m = Manifest(kv, prefix="p", cluster="c", broker="b")
    assert m.locate("t", 0, 0) is None and m.bounds("t", 0) == (0, 0)
    s0 = add(m, "t", {0: (0, 9), 1: (0, 2)})
    s1 = add(m, "t", {0: (10, 19), 2: (5, 6)})  # queue 2 starts at 5: a gap left by local retention
    assert m.progress("t").next_seq == 2 and m.progress("t").ends == {0: 20, 1: 3, 2: 7}
    assert m.bounds("t", 0) == (0, 20) and m.bounds("t", 2) == (5, 7) and m.bounds("t", 9) == (0, 0)
    assert m.locate("t", 0, 0) == (s0, 0)
    assert m.locate("t", 0, 9) == (s0, 2)  # rows 8, 9 of queue 0 share a group with queue 1's first two
    assert m.locate("t", 1, 2) == (s0, 3)
    assert m.locate("t", 0, 15) == (s1, 1)
    assert m.locate("t", 2, 0) == (s1, 2)  # below the gap: the first tiered offset after it
    assert m.locate("t", 0, 20) is None and m.locate("t", 1, 3) is None
    with pytest.raises(AssertionError):
        m.add_segment("t", entry(m, "t", 5, {0: (20, 21)}, 4), {0: 22})  # out of sequence
    assert not m.add_segment("t", entry(m, "t", 2, {0: (19, 21)}, 4), {0: 22})  # overlaps the tiered range
    reopened = Manifest(kv, prefix="p", cluster="c", broker="b")
    assert reopened.segments("t") == [s0, s1] and reopened.progress("t") == m.progress("t")
    assert reopened.topics() == ["t"]


def test_expiry_keeps_pending_deletes_until_cleared() -> None:
    kv = MemoryKV()
    m = Manifest(kv, prefix="p", cluster="c", broker="b")
    s0, s1 = add(m, "t", {0: (0, 4)}), add(m, "t", {0: (5, 9)})
    m.expire_segments("t", [s0.seq])
    assert m.segments("t") == [s1] and m.bounds("t", 0) == (5, 10)
    assert m.pending_deletes("t") == [(0, s0.key)]
    reopened = Manifest(kv, prefix="p", cluster="c", broker="b")
    assert reopened.pending_deletes("t") == [(0, s0.key)] and reopened.segments("t") == [s1]
    reopened.deleted("t", 0)
    assert reopened.pending_deletes("t") == []
    m.expire_segments("t", [s1.seq])
    assert m.bounds("t", 0) == (10, 10) and m.locate("t", 0, 0) is None


def test_mirror_document_and_staleness() -> None:
    m = Manifest(MemoryKV(), prefix="p", cluster="c", broker="b")
    seg = add(m, "t", {3: (0, 1)})
    assert m.mirror_stale("t")
    _, body = m.mirror_document("t")
    doc = json.loads(body)
    assert doc["kind"] == "sluice-tier-manifest" and doc["format_version"] == 1
    assert (doc["cluster"], doc["broker"], doc["topic"], doc["epoch"]) == ("c", "b", "t", m.epoch)
    assert doc["tiered_end"] == {"3": 2}
    assert doc["segments"] == [seg.to_json(row_groups=False)]
    assert SegmentEntry.from_json(seg.to_json()) == seg


def test_a_new_term_starts_a_new_epoch_on_the_same_state() -> None:
    kv = MemoryKV()
    old = Manifest(kv, prefix="p", cluster="c", broker="g1")
    add(old, "t", {0: (0, 9)})
    new = Manifest(kv, prefix="p", cluster="c", broker="g1", new_epoch=True)  # a replicated group's next primary
    assert new.epoch != old.epoch and new.progress("t").next_seq == 1
    assert new.segments("t")[0].key == old.object_key("t", 0)  # recorded objects keep their keys
    assert new.object_key("t", 1) != old.object_key("t", 1)  # the next uploads cannot collide with the old term's


def test_a_deposed_writer_cannot_replace_the_mirror_of_the_next(tmp_path: Path) -> None:
    objects = LocalDirObjectStore(tmp_path)
    term_over = False
    deposed = Manifest(MemoryKV(), prefix="p", cluster="c", broker="g1", may_overwrite=lambda: not term_over)
    add(deposed, "t", {0: (0, 9)})
    deposed.write_mirror(objects, "t")
    successor = Manifest(MemoryKV(), prefix="p", cluster="c", broker="g1", new_epoch=True)
    add(successor, "t", {0: (0, 19)})
    successor.write_mirror(objects, "t")  # its first document replaces the old one
    term_over = True
    add(deposed, "t", {0: (10, 14)})
    with pytest.raises(PreconditionFailed, match="term is over"):
        deposed.write_mirror(objects, "t")
    assert json.loads(objects.get(successor.mirror_key("t")))["tiered_end"] == {"0": 20}
    # A writer whose term is valid replaces a document written behind its back (a deposed
    # primary's first write after waking up), and goes on from there.
    objects.put(successor.mirror_key("t"), b"{}")
    add(successor, "t", {0: (20, 29)})
    successor.write_mirror(objects, "t")
    assert json.loads(objects.get(successor.mirror_key("t")))["tiered_end"] == {"0": 30}


def test_lru_cache_is_bounded_by_bytes() -> None:
    cache: LruCache[str, int] = LruCache(100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3, 40)  # evicts b
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    cache.put("huge", 4, 101)  # larger than the whole budget: not cached, nothing evicted
    assert "huge" not in cache and "a" in cache
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (2, 80, 1)


def test_a_deleted_topics_segments_leave_and_its_tiered_ends_rise_to_the_next_incarnation() -> None:
    kv = MemoryKV()
    m = Manifest(kv, prefix="p", cluster="c", broker="b")
    s0, s1 = add(m, "t", {0: (0, 9), 1: (0, 2)}), add(m, "t", {0: (10, 19)})
    late = entry(m, "t", 2, {0: (20, 21)}, 4)  # being uploaded as the topic is deleted
    floors = {0: 25, 1: 3, 3: 4}  # where each queue ended (queue 3 was never tiered)

    assert m.drop_below("t", floors) == 2
    assert m.segments("t") == [] and m.pending_deletes("t") == [(0, s0.key), (1, s1.key)]
    assert m.progress("t").ends == {0: 25, 1: 3, 3: 4} and m.progress("t").next_seq == 2
    assert m.bounds("t", 0) == (25, 25) and m.locate("t", 0, 0) is None
    assert not m.add_segment("t", late, {0: 22}), "an old message uploaded late is not tiered"
    new = add(m, "t", {0: (25, 30)})
    assert new.seq == 2 and m.segments("t") == [new]
    assert m.drop_below("t", floors) == 0 and m.segments("t") == [new], "the next incarnation stays"
    reopened = Manifest(kv, prefix="p", cluster="c", broker="b")
    assert reopened.segments("t") == [new] and reopened.progress("t") == m.progress("t")
    assert m.drop_below("never-tiered", {0: 7}) == 0 and m.topics() == ["t"]
