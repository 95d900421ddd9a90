"""Pop state on real RocksDB: what a batch leaves in memory (in-flight counters, FIFO lanes, the due
index) is what a broker restarted on the same data rebuilds, whichever way the batch wrote it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.lite.keys import LITE_QUEUE_BASE
from broker.popstate import POP_CFS, EntryState, PopEntry, PopState, first_version, next_version
from broker.store.index import Index
from broker.store.statelog import StateRecorder


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "index"


@pytest.fixture
def index(path: Path) -> Iterator[Index]:
    idx = Index(path, extra_cfs=POP_CFS)
    try:
        yield idx
    finally:
        idx.close()


def memory(state: PopState) -> tuple[dict[tuple[str, str, int], int], dict[object, tuple[int, list[int]]]]:
    inflight = {k: n for k, n in state.inflight.items() if n}
    lanes = {
        (qk, mg): (lane.outstanding, list(lane.waiting)) for qk, ls in state.fifo.items() for mg, lane in ls.items()
    }
    return inflight, lanes


def test_first_deliveries_acks_and_fifo_lanes_match_a_rebuild(index: Index) -> None:
    state = PopState(index)
    batch = state.batch()
    for offset in range(10):  # plain messages, the hot path
        batch.add_inflight("g", "t", 1, offset, 5_000 + offset, "")
    batch.add_inflight("g", "t", 2, 0, 9_000, "mg-a")  # FIFO: lane a in flight...
    batch.put("g", "t", 2, 1, PopEntry(EntryState.WAITING, 0, 0, 0, "mg-a"), None)  # ...its successor held
    batch.put("g", "t", 2, 2, PopEntry(EntryState.WAITING, 0, 0, 0, "mg-a"), None)
    batch.set_cursor("g", "t", 1, 10)
    batch.commit()
    assert memory(state)[0] == {("g", "t", 1): 10, ("g", "t", 2): 1}
    assert memory(state)[1] == {(("g", "t", 2), "mg-a"): (1, [1, 2])}

    raws = state.entries("g", "t", [(1, 3), (2, 0), (1, 99)])
    assert raws[2] is None
    assert PopEntry.decode(raws[0] or b"") == PopEntry(EntryState.INFLIGHT, 1, 1, 5_003, "")
    assert PopEntry.decode(raws[1] or b"") == PopEntry(EntryState.INFLIGHT, 1, 1, 9_000, "mg-a")
    assert [(t, q, o) for _, t, q, o in state.due("g", 5_004, 100)] == [("t", 1, o) for o in range(5)]

    acks = state.batch()
    for offset in (0, 3, 4):
        acks.remove("g", "t", 1, offset, PopEntry(EntryState.INFLIGHT, 1, 1, 5_000 + offset, ""))
    acks.remove("g", "t", 2, 0, PopEntry(EntryState.INFLIGHT, 1, 1, 9_000, "mg-a"))  # lane a may go on
    acks.put("g", "t", 1, 1, PopEntry(EntryState.INFLIGHT, 2, 2, 20_000, ""),
             PopEntry(EntryState.INFLIGHT, 1, 1, 5_001, ""))  # redelivered: still one in flight  # fmt: skip
    acks.commit()
    assert memory(state) == ({("g", "t", 1): 7}, {(("g", "t", 2), "mg-a"): (0, [1, 2])})
    assert [o for _, _, _, o in state.due("g", 5_004, 100)] == [2]  # 0, 3, 4 acked; 1 moved to 20 000

    rebuilt = PopState(index)
    assert memory(rebuilt) == memory(state)
    assert rebuilt.cursor("g", "t", 1) == 10
    assert [o for _, _, _, o in rebuilt.due("g", 20_000, 100)] == [2, 5, 6, 7, 8, 9, 1]


def test_add_inflight_writes_what_put_writes(index: Index) -> None:
    state = PopState(index)
    batch = state.batch()
    batch.add_inflight("g", "t", 0, 7, 1_234, "")
    batch.put("g", "u", 0, 7, PopEntry(EntryState.INFLIGHT, 1, 1, 1_234, ""), None)
    batch.commit()
    a, b = state.entries("g", "t", [(0, 7)]), state.entries("g", "u", [(0, 7)])
    assert a == b and a[0] is not None
    assert sorted(t for _, t, _, _ in state.due("g", 1_234, 10)) == ["t", "u"]


def test_a_replicated_primarys_entries_start_at_versions_of_its_term(index: Index) -> None:
    """Two terms never issue the same handle version for an entry each created at the same offset."""
    assert PopState(index).first_version == 1  # outside a replicated group: as before
    term_2, term_3 = PopState(index, term=2), PopState(index, term=3)
    assert term_2.first_version != term_3.first_version
    batch = term_3.batch()
    batch.add_inflight("g", "t", 0, 0, 1_000, "")
    batch.add_inflight("g", "t", 0, 1, 1_000, "mg")
    batch.commit()
    entries = [PopEntry.decode(raw or b"") for raw in term_3.entries("g", "t", [(0, 0), (0, 1)])]
    assert {e.version for e in entries} == {first_version(3)}
    assert next_version(term_3.waiting_version) == term_3.first_version  # a held FIFO message's first delivery
    assert next_version((1 << 32) - 1) == 0  # u32 versions wrap


def test_a_changed_entry_gets_a_version_of_the_term_that_changed_it(index: Index) -> None:
    """An entry an earlier term delivered (it came through the replication stream) and that both
    that term's deposed primary and its successor deliver again: the two new handles differ. Before,
    both bumped it to the same next version, so a handle of the old term matched the new delivery."""
    term_5, term_6 = PopState(index, term=5), PopState(index, term=6)
    inherited = term_5.first_version + 2  # delivered three times in term 5
    by_old, by_new = term_5.next_version(inherited), term_6.next_version(inherited)
    assert by_old != by_new
    assert by_new == term_6.first_version
    assert term_6.next_version(by_new) == by_new + 1  # within its own term: one more, as before
    assert term_6.next_version(term_6.waiting_version) == term_6.first_version
    assert PopState(index).next_version(41) == 42  # outside a replicated group: as before
    last_of_term = first_version(7) - 1  # a term's versions used up: start over in it, never enter the next
    assert term_6.next_version(last_of_term) == term_6.first_version


def test_cursors_kept_in_memory_follow_every_change(index: Index) -> None:
    """`cursors` answers from memory what it read or a batch set, and agrees with RocksDB (a fresh
    state on the same data) after sets, resets, a removed lite topic's cursor, a dropped group, and
    the cache emptying itself when full."""
    state = PopState(index)
    batch = state.batch()
    for qid in range(4):
        batch.set_cursor("g", "t", qid, 10 + qid)
    batch.set_cursor("h", "t", 0, 7)
    uncommitted = state.batch()
    uncommitted.set_cursor("g", "t", 0, 99)  # never committed: changes nothing

    def agree(expected_g: list[int | None], expected_h: int | None) -> None:
        for s in (state, PopState(index)):
            assert s.cursors("g", "t", [0, 1, 2, 3, 4]) == expected_g
            assert s.cursors("h", "t", [0]) == [expected_h]

    batch.commit()
    agree([10, 11, 12, 13, None], 7)
    state.reset_queue("g", "t", 1, 3)
    moved = state.batch()
    moved.set_cursor("g", "t", 2, 20)
    moved.commit()
    agree([10, 3, 20, 13, None], 7)
    state.delete_cursor("g", "t", 3)
    agree([10, 3, 20, None, None], 7)
    state.drop_group("h")
    agree([10, 3, 20, None, None], None)
    state._cursor_cache_size = 2  # as `[broker.pop] cursor_cache_size = 2` would make it
    full = state.batch()
    for qid in range(5, 8):
        full.set_cursor("g", "t", qid, qid)
    full.commit()
    assert len(state._cursor_cache) <= 3
    agree([10, 3, 20, None, None], None)
    assert state.cursors("g", "t", [5, 6, 7]) == [5, 6, 7]


def test_scans_of_a_group_stop_at_its_end(index: Index) -> None:
    """A group's scans (due deadlines, pending entries, cursors) see its own keys only, and answer
    nothing for a group with nothing live though a group after it in key order holds both acknowledged
    (deleted) and live entries: the scans are bounded by the group's key range, so RocksDB does not
    step over the later group's deleted keys looking for a live one (lite_bench.py's priority phase
    measures what that cost)."""
    state = PopState(index)
    inflight = PopEntry(EntryState.INFLIGHT, 1, 1, 1_000, "")
    busy = state.batch()  # "g-later" sorts after "g-a": names are length-prefixed
    for offset in range(200):
        busy.put("g-later", "t", 0, offset, inflight, None)
    busy.commit()
    acked = state.batch()
    for offset in range(199):
        acked.remove("g-later", "t", 0, offset, inflight)
    acked.commit()
    quiet = state.batch()
    quiet.put("g-a", "t", 0, 0, inflight, None)
    quiet.commit()
    done = state.batch()
    done.remove("g-a", "t", 0, 0, inflight)
    done.commit()
    assert list(state.due("g-a", 2_000, 100)) == []
    assert state.first_pending_offset("g-a", "t", 0) is None
    assert state.queue_keys("g-a") == []
    assert list(state.due("g-later", 2_000, 100)) == [(1_000, "t", 0, 199)]
    assert state.first_pending_offset("g-later", "t", 0) == 199


def test_a_fifo_lane_stays_closed_until_the_replicas_hold_its_ack(index: Index) -> None:
    """A replicated primary (its index records state changes): the batch that acks a message
    group's in-flight entry leaves its lane `settling` with that change's number, and the lane opens
    (`release_settled`) only once `acked_state` (the change every in-sync member holds) reaches it.
    Without a recorder (no replication) a lane opens at the ack, as before."""
    index.recorder = StateRecorder(POP_CFS, {cf: index.handle(cf) for cf in POP_CFS}, lambda: 0, 1 << 20)
    held = [0]
    state = PopState(index, acked_state=lambda: held[0])
    batch = state.batch()
    batch.add_inflight("g", "t", 0, 0, 9_000, "mg-a")
    batch.put("g", "t", 0, 1, PopEntry(EntryState.WAITING, 0, 0, 0, "mg-a"), None)
    batch.add_inflight("g", "t", 0, 2, 9_000, "mg-b")
    batch.commit()
    ack = state.batch()
    ack.remove("g", "t", 0, 0, PopEntry(EntryState.INFLIGHT, 1, 1, 9_000, "mg-a"))
    ack.remove("g", "t", 0, 2, PopEntry(EntryState.INFLIGHT, 1, 1, 9_000, "mg-b"))
    ack.commit()
    seq = index.recorder.seq
    lanes = state.fifo[("g", "t", 0)]
    assert (lanes["mg-a"].outstanding, lanes["mg-a"].settling, list(lanes["mg-a"].waiting)) == (0, seq, [1])
    assert lanes["mg-b"].settling == seq and not lanes["mg-b"].idle  # nothing held back, still closed
    held[0] = seq - 1
    assert state.release_settled() == set() and lanes["mg-a"].settling == seq
    held[0] = seq
    assert state.release_settled() == {"g"}
    assert lanes["mg-a"].settling == 0 and "mg-b" not in lanes  # an idle lane is forgotten
    assert state.release_settled() == set()


def test_without_replication_an_ack_opens_the_lane_at_once(index: Index) -> None:
    state = PopState(index)
    batch = state.batch()
    batch.add_inflight("g", "t", 0, 0, 9_000, "mg-a")
    batch.commit()
    ack = state.batch()
    ack.remove("g", "t", 0, 0, PopEntry(EntryState.INFLIGHT, 1, 1, 9_000, "mg-a"))
    ack.commit()
    assert state.fifo.get(("g", "t", 0), {}) == {}


def test_a_lite_topic_stays_closed_until_the_replicas_hold_its_ack(index: Index) -> None:
    """A lite topic (a queue from LITE_QUEUE_BASE of a bind topic) is one lane (`WHOLE_QUEUE`): the
    ack of its in-flight message leaves it `settling` like a FIFO message group's lane; a priority
    level's queue (same id range, not a bind topic) and a normal queue stay open. Once released,
    nothing is kept for it."""
    index.recorder = StateRecorder(POP_CFS, {cf: index.handle(cf) for cf in POP_CFS}, lambda: 0, 1 << 20)
    held = [0]
    lite, level = LITE_QUEUE_BASE + 3, LITE_QUEUE_BASE + 1
    state = PopState(index, acked_state=lambda: held[0], lite_topic=lambda topic: topic == "bind")
    batch = state.batch()
    for topic, qid in (("bind", lite), ("prio", level), ("bind", 0)):
        batch.add_inflight("g", topic, qid, 0, 9_000, "")
    batch.commit()
    ack = state.batch()
    for topic, qid in (("bind", lite), ("prio", level), ("bind", 0)):
        ack.remove("g", topic, qid, 0, PopEntry(EntryState.INFLIGHT, 1, 1, 9_000, ""))
    ack.commit()
    seq = index.recorder.seq
    assert state.settling("g", "bind", lite)
    assert not state.settling("g", "prio", level) and not state.settling("g", "bind", 0)
    assert set(state.fifo) == {("g", "bind", lite)}
    held[0] = seq
    assert state.release_settled() == {"g"}
    assert not state.settling("g", "bind", lite) and state.fifo == {}


def test_a_new_primarys_fifo_lanes_open_once_the_replicas_hold_its_starting_state(index: Index) -> None:
    held = [-1]  # acked_state: no in-sync replica has acknowledged this term's state yet
    state = PopState(index, acked_state=lambda: held[0])
    assert not state.fifo_open()
    held[0] = 0
    assert state.fifo_open()
    held[0] = -1  # (acked_state never goes back; once open, the state does not ask again)
    assert state.fifo_open()


def test_a_deleted_topics_entries_and_cursors_below_its_floors_go_and_the_rest_stays(index: Index) -> None:
    """What a topic's deletion drops (broker/topic_deletion.py): the groups' entries below
    each queue's first offset since the deletion, and cursors at or below it; entries and cursors
    of the next incarnation (a pop that raced the deletion), other topics and other groups stay, and
    memory matches a rebuild."""
    state = PopState(index)
    batch = state.batch()
    for group in ("g", "h"):
        for offset in range(6):
            batch.add_inflight(group, "t", 0, offset, 5_000 + offset, "")  # 0..3 old, 4 and 5 new
        batch.put(group, "t", 1, 2, PopEntry(EntryState.WAITING, 0, 0, 0, "mg"), None)  # old, FIFO-held
        batch.add_inflight(group, "other", 0, 1, 5_000, "")
        batch.set_cursor(group, "t", 0, 6)  # past the floor: a cursor of the next incarnation
        batch.set_cursor(group, "t", 1, 3)  # at the floor
        batch.set_cursor(group, "other", 0, 2)
    batch.commit()
    floors = {0: 4, 1: 3}

    old = state.entries_below("t", ["g", "h"], floors)
    assert sorted(old) == sorted([(g, 0, o) for g in "gh" for o in range(4)] + [("g", 1, 2), ("h", 1, 2)])
    gone_first = state.batch()
    gone_first.remove("g", "t", 0, 0, PopEntry(EntryState.INFLIGHT, 1, 1, 5_000, ""))  # acked meanwhile
    gone_first.commit()
    assert state.drop_entries("t", old) == len(old) - 1
    state.drop_cursors("t", ["g", "h"], floors)

    for group in ("g", "h"):
        assert state.entries_below("t", [group], {0: 1 << 62, 1: 1 << 62}) == [(group, 0, 4), (group, 0, 5)]
        assert state.cursors(group, "t", [0, 1]) == [6, None]
        assert state.cursor(group, "other", 0) == 2 and state.entry(group, "other", 0, 1) is not None
    assert memory(state) == memory(PopState(index))
    assert memory(state)[0] == {("g", "t", 0): 2, ("h", "t", 0): 2, ("g", "other", 0): 1, ("h", "other", 0): 1}
    assert memory(state)[1] == {}
