"""The store against a simple in-memory model (hypothesis stateful testing).

Any sequence of appends (blocking, or concurrent async ones that the writer group-commits), reads,
lookups, consumer-offset commits, clean restarts and retention runs must give what the model says.
Segments are tiny so they roll often, and the writer's queue-offset cache holds only two queues, so
it keeps falling back to the index for a queue's next offset.

Retention is made deterministic: `run_retention(now_s)` far in the future deletes every sealed
segment, and the model drops exactly the messages whose physical offset lies below the new
`segments.min_offset()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from broker.store.config import CommitLogConfig, RetentionConfig, StoreConfig
from broker.store.store import MessageStore, ReadStatus
from broker.store.writer import AppendResult
from broker.tags import tag_hash
from common.errors import BadRequest, IllegalOffset, OffsetNotFound
from common.record import MessageRecord

TOPICS = ("orders", "pay-ü", "日志")
QUEUE_IDS = (0, 1, 2, 3)
TAGS = ("a", "b", "TagC")
KEYS = ("k1", "k2", "ключ")
MESSAGE_IDS = ("", "id-0", "id-1", "id-2", "id-3", "id-4", "id-5")
GROUPS = ("g1", "группа")
SEGMENT_BYTES = 8 << 10
FAR_FUTURE_S = 10.0**6
WAIT_S = 10.0

CONFIG = StoreConfig(
    commitlog=CommitLogConfig(segment_bytes=SEGMENT_BYTES, queue_offset_cache_size=2),
    retention=RetentionConfig(max_age_s=60.0, max_disk_used_ratio=1.0),
)

# Mostly small bodies, some that fill a good part of a segment, and some larger than a segment
# (such a record gets a segment of its own).
bodies = st.builds(
    lambda head, pad: head + b"." * pad,
    st.binary(max_size=48),
    st.sampled_from([0, 0, 0, 20, 300, 1500, 3000, SEGMENT_BYTES + 100]),
)
records = st.builds(
    MessageRecord,
    topic=st.sampled_from(TOPICS),
    queue_id=st.sampled_from(QUEUE_IDS),
    body=bodies,
    message_id=st.sampled_from(MESSAGE_IDS),
    tag=st.none() | st.sampled_from(TAGS),
    keys=st.lists(st.sampled_from(KEYS), max_size=3).map(tuple),
    message_group=st.none() | st.just("mg"),
    properties=st.dictionaries(st.sampled_from(("p", "ü", "trace")), st.text(max_size=8), max_size=2),
    born_timestamp_ms=st.integers(0, 1 << 42),
)
batches = st.lists(records, min_size=1, max_size=6)
topics = st.sampled_from(TOPICS)
queue_ids = st.sampled_from(QUEUE_IDS)


@dataclass
class ModelQueue:
    low: int = 0  # min offset: everything below was deleted by retention
    next: int = 0  # one past the last message (max offset)
    messages: dict[int, MessageRecord] = field(default_factory=dict)  # offsets low..next-1

    def drop_below(self, physical_offset: int) -> None:
        while self.low < self.next and self.messages[self.low].physical_offset < physical_offset:
            del self.messages[self.low]
            self.low += 1


@dataclass
class ExpectedRead:
    status: ReadStatus
    messages: list[MessageRecord]
    next_offset: int


def expected_read(q: ModelQueue, offset: int, max_messages: int, hashes: frozenset[int] | None) -> ExpectedRead:
    if offset < q.low:
        return ExpectedRead(ReadStatus.OFFSET_TOO_SMALL, [], q.low)
    if offset == q.next:
        return ExpectedRead(ReadStatus.NO_NEW_MESSAGES, [], offset)
    if offset > q.next:
        return ExpectedRead(ReadStatus.OFFSET_OVERFLOW, [], q.next)
    picked: list[MessageRecord] = []
    next_offset = offset
    for o in range(offset, q.next):
        msg = q.messages[o]
        next_offset = o + 1
        if hashes is None or tag_hash(msg.tag) in hashes:
            picked.append(msg)
            if len(picked) >= max_messages:
                break
    return ExpectedRead(ReadStatus.FOUND if picked else ReadStatus.NO_MATCH, picked, next_offset)


class StoreModel(RuleBasedStateMachine):
    base_dir: Path  # set by the test
    runs = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.dir = self.base_dir / f"run-{next(self.runs)}"
        self.store = MessageStore(self.dir, CONFIG)
        self.queues: dict[tuple[str, int], ModelQueue] = {}
        self.log: list[MessageRecord] = []  # surviving messages in physical order
        self.phys_end = 0
        self.segment_bases = [0]
        self.active_size = 0
        self.committed: dict[tuple[str, str, int], int] = {}

    def teardown(self) -> None:
        self.store.close()

    def queue(self, topic: str, queue_id: int) -> ModelQueue:
        return self.queues.get((topic, queue_id)) or ModelQueue()

    def draw_queue(self, data: st.DataObject) -> tuple[str, int, ModelQueue]:
        """Mostly a queue that has held messages; sometimes any queue, maybe one never used."""
        used = sorted(self.queues)
        if used and data.draw(st.integers(0, 3), label="used queue") > 0:
            topic, queue_id = data.draw(st.sampled_from(used), label="queue")
        else:
            topic, queue_id = data.draw(topics, label="topic"), data.draw(queue_ids, label="queue id")
        return topic, queue_id, self.queue(topic, queue_id)

    @staticmethod
    def draw_offset(data: st.DataObject, q: ModelQueue) -> int:
        """Mostly an offset inside the queue; sometimes anything from 0 to just past its end."""
        inside = st.integers(q.low, q.next - 1) if q.next > q.low else st.just(q.low)
        return data.draw(st.one_of(inside, inside, st.integers(0, q.next + 2)), label="offset")

    # -- appends ---------------------------------------------------------------------------------

    @initialize(batch=st.lists(records, min_size=1, max_size=20))
    def start_with_messages(self, batch: list[MessageRecord]) -> None:
        self.append_blocking(batch)

    @rule(batch=batches)
    def append_blocking(self, batch: list[MessageRecord]) -> None:
        self._applied([batch], [self.store.append_blocking(batch, timeout_s=WAIT_S)])

    @rule(topic=topics, queue_id=queue_ids, batch=st.lists(records, min_size=1, max_size=12))
    def append_to_one_queue(self, topic: str, queue_id: int, batch: list[MessageRecord]) -> None:
        for rec in batch:
            rec.topic, rec.queue_id = topic, queue_id
        self.append_blocking(batch)

    @rule(concurrent=st.lists(batches, min_size=2, max_size=4))
    def append_concurrently(self, concurrent: list[list[MessageRecord]]) -> None:
        async def run() -> list[Sequence[AppendResult]]:
            async with asyncio.timeout(WAIT_S):
                return list(await asyncio.gather(*(self.store.append(b) for b in concurrent)))

        self._applied(concurrent, asyncio.run(run()))

    def _applied(self, batches: Sequence[list[MessageRecord]], results: Sequence[Sequence[AppendResult]]) -> None:
        assert self.store.wait_dispatched(timeout_s=WAIT_S)
        pairs = [(r, rec) for b, rs in zip(batches, results, strict=True) for rec, r in zip(b, rs, strict=True)]
        for b, rs in zip(batches, results, strict=True):
            # Within one append, records keep their order.
            assert [r.physical_offset for r in rs] == sorted(r.physical_offset for r in rs), b
        # The writer assigns offsets in the order it writes: replay the appends in physical order.
        for result, rec in sorted(pairs, key=lambda p: p[0].physical_offset):
            self._place(result.size)
            assert result.physical_offset == self.phys_end, "physical offsets are contiguous"
            assert result.size == rec.size
            q = self.queues.setdefault((rec.topic, rec.queue_id), ModelQueue())
            assert result.queue_offset == q.next, f"queue offsets continue without gaps ({rec.topic}/{rec.queue_id})"
            stored = dataclasses.replace(
                rec,
                queue_offset=result.queue_offset,
                physical_offset=result.physical_offset,
                store_timestamp_ms=result.store_timestamp_ms,
            )
            q.messages[q.next] = stored
            q.next += 1
            self.log.append(stored)
            self.phys_end += result.size

    def _place(self, size: int) -> None:
        """The writer's rule: roll when a record does not fit into a non-empty active segment."""
        if self.active_size > 0 and self.active_size + size > SEGMENT_BYTES:
            self.segment_bases.append(self.segment_bases[-1] + self.active_size)
            self.active_size = 0
        self.active_size += size

    # -- reads -----------------------------------------------------------------------------------

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        topic, queue_id, q = self.draw_queue(data)
        offset = self.draw_offset(data, q)
        max_messages = data.draw(st.integers(1, 40), label="max_messages")
        tags = data.draw(st.none() | st.frozensets(st.sampled_from((*TAGS, None)), max_size=3), label="tags")
        hashes = None if tags is None else frozenset(tag_hash(t) for t in tags)
        got = self.store.read(topic, queue_id, offset, max_messages=max_messages, tag_hashes=hashes)
        event(f"read: {got.status.value}")
        want = expected_read(q, offset, max_messages, hashes)
        assert (got.status, got.next_offset, got.min_offset, got.max_offset) == (
            want.status,
            want.next_offset,
            q.low,
            q.next,
        )
        assert got.messages == want.messages

    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        topic, queue_id, q = self.draw_queue(data)
        offset = self.draw_offset(data, q)
        if q.low <= offset < q.next:
            assert self.store.get(topic, queue_id, offset) == q.messages[offset]
        else:
            with pytest.raises(OffsetNotFound):
                self.store.get(topic, queue_id, offset)

    @rule(message_id=st.sampled_from(MESSAGE_IDS), topic=st.none() | topics)
    def find_by_id(self, message_id: str, topic: str | None) -> None:
        want = [
            m for m in self.log if message_id and m.message_id == message_id and (topic is None or m.topic == topic)
        ]
        assert self.store.find_by_id(message_id, topic) == want

    @rule(topic=topics, key=st.sampled_from(KEYS), limit=st.integers(1, 10))
    def find_by_key(self, topic: str, key: str, limit: int) -> None:
        want = [m for m in self.log if m.topic == topic and key in m.keys][:limit]
        assert self.store.find_by_key(topic, key, limit) == want

    @rule(data=st.data())
    def offset_for_timestamp(self, data: st.DataObject) -> None:
        topic, queue_id, q = self.draw_queue(data)
        assert self.store.offset_for_timestamp(topic, queue_id, 0) == q.low
        assert self.store.offset_for_timestamp(topic, queue_id, 1 << 62) == q.next
        if not q.messages:
            return
        probe = q.messages[data.draw(st.integers(q.low, q.next - 1), label="probe")]
        found = self.store.offset_for_timestamp(topic, queue_id, probe.store_timestamp_ms)
        assert q.low <= found <= probe.queue_offset
        stamps = [q.messages[o].store_timestamp_ms for o in range(q.low, q.next)]
        if stamps == sorted(stamps):  # the wall clock did not step back during the test
            assert found == q.low + next(i for i, ts in enumerate(stamps) if ts >= probe.store_timestamp_ms)

    # -- consumer offsets ------------------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS), topic=topics, queue_id=queue_ids, offset=st.integers(0, 200))
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if any(t == topic for t, _ in self.queues):
            self.store.commit_offset(group, topic, queue_id, offset)
            self.committed[(group, topic, queue_id)] = offset
        else:
            with pytest.raises(OffsetNotFound):
                self.store.commit_offset(group, topic, queue_id, offset)

    # -- lifecycle -------------------------------------------------------------------------------

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = MessageStore(self.dir, CONFIG)
        report = self.store.recovery
        assert (report.records, report.truncated_bytes) == (0, 0), "a clean restart scans nothing"

    @rule()
    def retention(self) -> None:
        deleted = self.store.run_retention(now_s=time.time() + FAR_FUTURE_S)
        assert deleted == len(self.segment_bases) - 1, "every sealed, dispatched segment is old enough"
        self.segment_bases = self.segment_bases[-1:]
        floor = self.store.segments.min_offset()
        assert floor == self.segment_bases[0]
        self.log = [m for m in self.log if m.physical_offset >= floor]
        for q in self.queues.values():
            q.drop_below(floor)
        event("retention deleted segments" if deleted else "retention found nothing to delete")
        if any(q.low == q.next > 0 for q in self.queues.values()):
            event("retention emptied a queue")

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def segments_and_bounds_agree(self) -> None:
        assert self.store.segments.bases() == self.segment_bases
        assert self.store.segments.max_offset() == self.phys_end
        for topic in TOPICS:
            for queue_id in QUEUE_IDS:
                q = self.queue(topic, queue_id)
                assert self.store.queue_bounds(topic, queue_id) == (q.low, q.next), (topic, queue_id)
        for (group, topic, queue_id), offset in self.committed.items():
            assert self.store.committed_offset(group, topic, queue_id) == offset
        assert self.store.committed_offset("never-committed", TOPICS[0], 0) is None

    @invariant()
    def every_queue_reads_back_in_full(self) -> None:
        for (topic, queue_id), q in self.queues.items():
            if q.low > 0:
                below = self.store.read(topic, queue_id, q.low - 1)
                assert (below.status, below.next_offset, below.messages) == (ReadStatus.OFFSET_TOO_SMALL, q.low, [])
            got: list[MessageRecord] = []
            offset = q.low
            for _ in range(q.next - q.low + 1):
                result = self.store.read(topic, queue_id, offset, max_messages=64)
                if result.status is ReadStatus.NO_NEW_MESSAGES:
                    break
                assert result.status is ReadStatus.FOUND
                got.extend(result.messages)
                offset = result.next_offset
            assert [m.queue_offset for m in got] == list(range(q.low, q.next))
            assert got == [q.messages[o] for o in range(q.low, q.next)]


def test_store_matches_the_model(tmp_path: Path) -> None:
    machine = type("StoreModelRun", (StoreModel,), {"base_dir": tmp_path})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )


def test_bad_reads_and_appends_raise_typed_errors(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, CONFIG)
    try:
        with pytest.raises(IllegalOffset):
            store.read(TOPICS[0], 0, -1)
        with pytest.raises(BadRequest):
            store.read(TOPICS[0], 0, 0, max_messages=0)
        with pytest.raises(BadRequest):
            store.append_blocking([])
        with pytest.raises(BadRequest):
            store.append_blocking([MessageRecord(TOPICS[0], -1, b"x")])
        with pytest.raises(BadRequest):
            store.append_blocking([MessageRecord(TOPICS[0], 1 << 32, b"x")])
        store.append_blocking([MessageRecord(TOPICS[0], 0, b"x")])
        with pytest.raises(IllegalOffset):
            store.commit_offset(GROUPS[0], TOPICS[0], 0, -1)
        assert store.queue_bounds(TOPICS[0], 0) == (0, 1), "rejected appends leave no trace"
    finally:
        store.close()


def test_a_queue_emptied_by_retention_keeps_its_offsets(tmp_path: Path) -> None:
    """Regression: retention deleting all of a queue's entries used to reset it to (0, 0), and after a
    restart the writer handed out offset 0 again."""
    store = MessageStore(tmp_path, CONFIG)
    try:
        store.append_blocking([MessageRecord("quiet", 0, b"q" * 100) for _ in range(3)])
        for _ in range(40):  # fill segments with another topic until "quiet" is in a sealed one
            store.append_blocking([MessageRecord("busy", 0, b"b" * 500)])
        assert store.run_retention(now_s=time.time() + FAR_FUTURE_S) > 0
        assert store.queue_bounds("quiet", 0) == (3, 3)
        result = store.read("quiet", 0, 0)
        assert (result.status, result.next_offset) == (ReadStatus.OFFSET_TOO_SMALL, 3)
        store.close()
        store = MessageStore(tmp_path, CONFIG)
        assert store.queue_bounds("quiet", 0) == (3, 3)
        assert store.append_blocking([MessageRecord("quiet", 0, b"again")])[0].queue_offset == 3
        assert store.queue_bounds("quiet", 0) == (3, 4)
    finally:
        store.close()


def test_a_read_of_contiguous_records_spanning_segments_matches_single_gets(tmp_path: Path) -> None:
    """A read loads records back to back in one segment with one pread; a run that reaches the next
    segment, or a gap (another queue's records), starts a new read."""
    store = MessageStore(tmp_path, CONFIG)
    try:
        for i in range(3):
            store.append_blocking([MessageRecord("runs", 0, bytes([i]) * 700, properties={"i": str(n)})
                                   for n in range(20)])  # fmt: skip
            store.append_blocking([MessageRecord("runs", 1, b"other")])
        assert len(store.segments.all()) > 2  # 60 records of ~800 bytes in 8 KiB segments
        result = store.read("runs", 0, 0, max_messages=64)
        assert result.status is ReadStatus.FOUND
        assert [r.queue_offset for r in result.messages] == list(range(60))
        assert result.messages == [store.get("runs", 0, offset) for offset in range(60)]
        assert [r.properties["i"] for r in result.messages[18:22]] == ["18", "19", "0", "1"]
    finally:
        store.close()
