"""The streaming source's driver decisions without a cluster: data loss in `latestOffset` (fail, or
skip and count in the offsets Spark shows in the progress), `maxBytesPerTrigger`, and the split of
a batch's queue ranges at what the archive's manifest holds. The cluster's answer (`discover`) and
the manifest (`_segments`) are given; the real ones are exercised in
tests/e2e/test_spark_stream_tiers.py."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from broker.tiering.format import SegmentRef
from common.errors import BadRequest, OffsetNotFound
from spark_jobs.stream import cold, reader
from spark_jobs.stream.discovery import QueueRange
from spark_jobs.stream.hot import QueuePartition
from spark_jobs.stream.offsets import QueueKey, from_json, lost_from_json, to_json
from spark_jobs.stream.options import StreamOptions
from spark_jobs.stream.reader import SluiceStreamReader, cap

A0, A1 = QueueKey("orders", "broker-a", 0), QueueKey("orders", "broker-a", 1)
BASE = {"namesrv": "127.0.0.1:9876", "topics": "orders"}


def ranges(*entries: tuple[QueueKey, int, int, int]) -> dict[QueueKey, QueueRange]:
    """(key, min_offset, max_offset, message_bytes) -> QueueRange (acked = max)."""
    return {k: QueueRange(k, "c", "127.0.0.1:1", lo, hi, hi, size) for k, lo, hi, size in entries}


def test_lost_counts_round_trip_and_leave_plain_documents_unchanged() -> None:
    assert to_json({A0: 5}, {A0: 0}) == to_json({A0: 5}) == {"queues": {"orders": {"broker-a": {"0": 5}}}, "version": 1}
    doc = to_json({A0: 5, A1: 9}, {A1: 3})
    assert json.dumps(doc) == json.dumps(doc, sort_keys=True)
    assert (from_json(doc), lost_from_json(doc)) == ({A0: 5, A1: 9}, {A1: 3})


def test_removed_messages_fail_latest_offset_naming_queue_and_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "discover", lambda opts: ranges((A0, 40, 100, 10), (A1, 0, 50, 10)))
    source = SluiceStreamReader(StreamOptions.parse(BASE))
    with pytest.raises(OffsetNotFound, match=r"\[10, 40\) of orders queue 0 on broker broker-a were removed"):
        source.latestOffset(to_json({A0: 10, A1: 0}), ReadAllAvailable())


def test_without_fail_on_data_loss_skipped_messages_are_counted_in_the_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = ranges((A0, 40, 100, 10), (A1, 0, 50, 10))
    monkeypatch.setattr(reader, "discover", lambda opts: cluster)
    source = SluiceStreamReader(StreamOptions.parse({**BASE, "failOnDataLoss": "false"}))
    end = source.latestOffset(to_json({A0: 10, A1: 0}), ReadMaxRows(30))
    # The budget goes to what can be read: 60 readable on queue 0, 50 on queue 1.
    assert from_json(end) == {A0: 40 + 17, A1: 13}
    assert lost_from_json(end) == {A0: 30}
    # Later losses add up; a batch that moves nowhere (nothing new) counts nothing.
    cluster.update(ranges((A0, 90, 100, 10), (A1, 0, 50, 10)))
    later = source.latestOffset(end, ReadAllAvailable())
    assert from_json(later) == {A0: 100, A1: 50} and lost_from_json(later) == {A0: 30 + 33}
    assert lost_from_json(source.latestOffset(later, ReadAllAvailable())) == {A0: 63}


def test_max_bytes_per_trigger_counts_each_queue_at_its_message_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "discover", lambda opts: ranges((A0, 0, 100, 100), (A1, 0, 100, 1000)))
    source = SluiceStreamReader(StreamOptions.parse({**BASE, "maxBytesPerTrigger": "11000"}))
    end = from_json(source.latestOffset(to_json({A0: 0, A1: 0}), ReadAllAvailable()))
    assert end == {A0: 10, A1: 10}  # 10 x 100 + 10 x 1000 bytes
    assert cap({A0: 0}, {A0: 100}, 5, {A0: 1000}) == {A0: 1}  # smaller than one message: still one
    assert cap({A0: 0}, {A0: 3}, 1 << 30, {A0: 1000}) == {A0: 3}
    with pytest.raises(BadRequest, match="maxBytesPerTrigger"):
        StreamOptions.parse({**BASE, "maxBytesPerTrigger": "0"})


def segment(key: str, queues: dict[int, tuple[int, int]]) -> SegmentRef:
    return SegmentRef("c", "broker-a", "orders", 1, key, 1000, 10, queues, 0, 1)


def test_a_batch_is_split_at_what_the_manifest_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    segments = [segment("s1", {0: (0, 49), 1: (0, 9)}), segment("s2", {0: (50, 79)})]
    monkeypatch.setattr(cold, "_segments", lambda archive, cluster, broker, topic: segments)
    archive = StreamOptions.parse({**BASE, "bucket": "tier", "endpoint": "http://127.0.0.1:1"}).archive
    assert archive is not None and archive.s3.bucket == "tier"
    known = ranges((A0, 0, 100, 10), (A1, 0, 30, 10))
    parts = cold.split({A0: (20, 90), A1: (5, 30)}, known, {A0: 20}, archive)
    pieces = {
        p.segment.key: sorted((q.key.queue_id, q.start, q.end, q.fresh) for q in p.pieces)
        for p in parts
        if isinstance(p, cold.ColdPartition)
    }
    assert pieces == {"s1": [(0, 20, 50, False), (1, 5, 10, True)], "s2": [(0, 50, 80, False)]}
    hot = sorted((p.key.queue_id, p.start, p.end) for p in parts if isinstance(p, QueuePartition))
    assert hot == [(0, 80, 90), (1, 10, 30)]
    # Nothing tiered: the whole range goes through the broker.
    monkeypatch.setattr(cold, "_segments", lambda archive, cluster, broker, topic: [])
    only = cold.split({A0: (20, 90)}, known, {A0: 20}, archive)
    assert [(p.start, p.end) for p in only if isinstance(p, QueuePartition)] == [(20, 90)] and len(only) == 1
