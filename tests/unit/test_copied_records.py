"""What a replica reads of the records it copies (record.verify_copied, store.copied_runs).

`verify_copied` checks what `decode` checks and returns exactly the fields `decode` would give
the dispatcher; `copied_runs` describes the records as the writer would have: one-queue runs for
a primary's appends, mixed runs for the rest, covering every record once in order.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.store import copied_runs
from broker.store.writer import RUN_MIN, AppendResults
from broker.tags import tag_hash
from common.errors import BadRequest, MessageCorrupted
from common.record import MessageRecord, decode, encode, seal, verify_copied

PROPS = settings(deadline=None, derandomize=True, database=None)
BASE = 1 << 20

records = st.builds(
    MessageRecord,
    topic=st.sampled_from(["a", "b", "ü"]),
    queue_id=st.integers(0, 2),
    body=st.binary(max_size=64),
    message_id=st.text(max_size=12),
    tag=st.none() | st.text(min_size=1, max_size=5),
    keys=st.lists(st.text(max_size=5), max_size=3).map(tuple),
    message_group=st.none() | st.text(min_size=1, max_size=5),
    properties=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)


def log_of(recs: list[tuple[MessageRecord, int, int]], at: int) -> bytes:
    """(record, queue offset, store time) sealed back to back from position `at`."""
    out = bytearray()
    for rec, qoff, stamp in recs:
        buf = encode(rec)
        seal(buf, qoff, at + len(out), stamp)
        out += buf
    return bytes(out)


@settings(PROPS, max_examples=100)
@given(recs=st.lists(st.tuples(records, st.integers(0, 9), st.integers(0, 2)), min_size=1, max_size=40))
def test_copied_runs_describe_every_record_as_decode_reads_it(recs: list[tuple[MessageRecord, int, int]]) -> None:
    data = log_of(recs, BASE + 100)
    runs = copied_runs(data, BASE, 100)
    rows = []
    for run in runs:
        assert run.segment_base == BASE
        cols = run.columns
        if run.queue is not None:
            assert isinstance(run.results, AppendResults) and len(run.results) >= RUN_MIN
            assert set(cols.topics) == {run.queue[0]} and set(cols.queue_ids) == {run.queue[1]}
        rows += zip(cols.topics, cols.queue_ids, cols.tag_hashes, cols.message_ids, cols.keys, run.results, strict=True)
    at = 0
    assert len(rows) == len(recs)
    for topic, qid, th, mid, keys, result in rows:
        rec = decode(data, at)
        assert (topic, qid, th, mid, keys) == (rec.topic, rec.queue_id, tag_hash(rec.tag), rec.message_id.encode(),
                                               rec.keys)  # fmt: skip
        assert tuple(result) == (rec.queue_offset, BASE + 100 + at, rec.size, rec.store_timestamp_ms)
        at += rec.size


def test_an_append_of_one_queue_becomes_one_run() -> None:
    rec = MessageRecord("t", 1, b"x" * 10, "id")
    data = log_of([(rec, 5 + i, 9) for i in range(8)] + [(rec, 0, 9)], BASE)
    runs = copied_runs(data, BASE, 0)
    assert [(r.queue, len(r.results)) for r in runs] == [(("t", 1), 8), (None, 1)]


def test_a_damaged_byte_or_a_wrong_position_is_refused() -> None:
    data = log_of([(MessageRecord("t", 1, b"body", "id"), 0, 1)] * 3, BASE)
    with pytest.raises(MessageCorrupted, match="says it lives at"):
        verify_copied(data, BASE + 1)
    for pos in range(0, len(data), 7):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(MessageCorrupted):
            verify_copied(bytes(bad), BASE)
    with pytest.raises(MessageCorrupted):
        verify_copied(data[:-1], BASE)
    with pytest.raises(BadRequest):
        copied_runs(b"", BASE, 0)
