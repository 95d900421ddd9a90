"""The uploader against a real store and a real S3-compatible server (moto on loopback).

A topic with several queues is tiered in order and reads back through the cold reader identical to
the local copy; `min_age_s`, `segment_max_age_s` and `upload_now` decide what goes when; retention
deletes a CommitLog segment only once everything in it is tiered, also when topics interleave; a
crash between the upload and the manifest write leaves neither a gap nor a duplicate range; while
S3 is down uploads are retried, local deletion is paused with a warning, cold reads fail fast with
`Unavailable`, and the backlog goes up once S3 is back. Data deleted locally before it could be tiered
leaves a logged gap, never a stall; a local directory (`file://`) can stand in for S3.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.store.store import ReadStatus
from broker.tiering.config import TieringConfig
from broker.tiering.localstore import LocalDirObjectStore
from broker.tiering.objectstore import MeteredObjectStore, ObjectInfo, ObjectStore
from broker.tiering.reader import ColdReader
from broker.tiering.stores import open_object_store, s3_store
from common.errors import Unavailable
from tests.helpers.tiering import TierRig, fill, open_rig

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]

TOPICS = ("orders", "audit")
QUEUES = 3
HOUR_S = 3600.0
WAIT_S = 20.0


@pytest.fixture
def config(s3_config: TieringConfig) -> TieringConfig:
    return dataclasses.replace(
        s3_config, min_age_s=60.0, segment_target_bytes=16 << 10, row_group_rows=16, row_group_bytes=8 << 10,
        read_ahead_row_groups=0, mirror_interval_s=0.0,
    )  # fmt: skip


@pytest.fixture
def rigs(tmp_path: Path) -> Iterator[Callable[..., TierRig]]:
    opened: list[TierRig] = []

    def make(config: TieringConfig, objects: ObjectStore | None = None) -> TierRig:
        rig = open_rig(tmp_path / "broker", config, objects or s3_store(config))
        opened.append(rig)
        return rig

    yield make
    for rig in opened:
        rig.close()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


async def tier_all(rig: TierRig, topics: tuple[str, ...] = TOPICS, rounds: int = 20) -> None:
    """Background rounds until nothing of `topics` is left to tier (bounded)."""
    for _ in range(rounds):
        await rig.uploader.run_once()
        if all(rig.uploader.topic_status(t).lag_messages == 0 for t in topics):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"tiering did not finish: {[rig.uploader.topic_status(t) for t in topics]}")


def assert_manifest_matches_bucket(rig: TierRig, topic: str) -> None:
    """Bucket objects == manifest segments; per queue, contiguous ranges from the first tiered offset."""
    prefix = rig.manifest.topic_prefix(topic)
    in_bucket = {i.key: i.size for i in rig.objects.inner.list_objects(prefix) if i.key.endswith(".parquet")}
    segs = rig.manifest.segments(topic)
    assert in_bucket == {s.key: s.size for s in segs}
    for q in range(QUEUES):
        ranges = [s.queues[q] for s in segs if q in s.queues]
        for (_, last), (first, _) in itertools.pairwise(ranges):
            assert first == last + 1, f"queue {q}: gap or overlap between {ranges}"
        assert rig.manifest.bounds(topic, q) == (ranges[0][0], ranges[-1][1] + 1)


def test_tier_topics_and_read_back_identical(config: TieringConfig, rigs: Callable[..., TierRig]) -> None:
    rig = rigs(config)
    fill(rig.store, TOPICS, QUEUES, 120)
    local = {(t, q): rig.local(t, q) for t in TOPICS for q in range(QUEUES)}

    async def scenario() -> None:
        await rig.uploader.run_once()  # everything is younger than min_age_s
        assert rig.uploader.topic_status("orders").lag_messages == 3 * 120
        assert rig.uploader.topic_status("orders").objects == 0
        rig.clock.offset_s = HOUR_S
        await tier_all(rig)
        await rig.uploader.close()

    run(scenario())
    for (topic, q), messages in local.items():
        assert rig.cold(topic, q) == messages
    for topic in TOPICS:
        assert_manifest_matches_bucket(rig, topic)
        status = rig.uploader.topic_status(topic)
        segs = rig.manifest.segments(topic)
        assert status.objects == len(segs) > 3 and status.bytes == sum(s.size for s in segs)
        assert status.tiered == status.local == {q: (0, 120) for q in range(QUEUES)}
        assert (status.lag_messages, status.lag_s, status.last_error) == (0, 0.0, "")
        mirror = json.loads(rig.objects.get(rig.manifest.mirror_key(topic)))
        assert [s["key"] for s in mirror["segments"]] == [s.key for s in segs]
        assert mirror["tiered_end"] == {str(q): 120 for q in range(QUEUES)}


def test_small_segments_wait_for_max_age(config: TieringConfig, rigs: Callable[..., TierRig]) -> None:
    rig = rigs(dataclasses.replace(config, min_age_s=0.0, segment_target_bytes=1 << 20, segment_max_age_s=600.0))
    fill(rig.store, TOPICS, QUEUES, 10)

    async def scenario() -> None:
        await rig.uploader.run_once()
        assert [len(rig.manifest.segments(t)) for t in TOPICS] == [0, 0]  # below the target, not old enough
        rig.clock.offset_s = 1200.0
        await rig.uploader.run_once()
        assert [len(rig.manifest.segments(t)) for t in TOPICS] == [1, 1]  # all queues of a topic in one object
        await rig.uploader.close()

    run(scenario())
    assert rig.manifest.segments("orders")[0].queues == {q: (0, 9) for q in range(QUEUES)}


def test_upload_now_ignores_min_age(config: TieringConfig, rigs: Callable[..., TierRig]) -> None:
    rig = rigs(dataclasses.replace(config, min_age_s=HOUR_S))
    fill(rig.store, TOPICS, QUEUES, 50)

    async def scenario() -> None:
        await rig.uploader.upload_now("orders")
        await rig.uploader.close()

    run(scenario())
    assert rig.uploader.topic_status("orders").lag_messages == 0
    assert rig.uploader.topic_status("audit").lag_messages == 3 * 50  # only the topic asked for
    assert rig.objects.head(rig.manifest.mirror_key("orders")) is not None
    assert [rig.cold("orders", q) for q in range(QUEUES)] == [rig.local("orders", q) for q in range(QUEUES)]


def test_a_local_directory_can_stand_in_for_s3(config: TieringConfig, tmp_path: Path) -> None:
    local = dataclasses.replace(config, endpoint_url=f"file://{tmp_path / 'objects'}")
    objects = open_object_store(local)
    assert isinstance(objects, LocalDirObjectStore)
    rig = open_rig(tmp_path / "broker", local, objects)
    try:
        fill(rig.store, ("orders",), QUEUES, 40)

        async def tier() -> None:
            await rig.uploader.upload_now("orders")
            await rig.uploader.close()

        run(tier())
        assert_manifest_matches_bucket(rig, "orders")
        assert [rig.cold("orders", q) for q in range(QUEUES)] == [rig.local("orders", q) for q in range(QUEUES)]
        assert (tmp_path / "objects" / local.bucket / rig.manifest.mirror_key("orders")).is_file()
    finally:
        rig.close()


def test_retention_deletes_only_tiered_segments(config: TieringConfig, rigs: Callable[..., TierRig]) -> None:
    rig = rigs(config)
    fill(rig.store, TOPICS, QUEUES, 120)  # the topics interleave in every CommitLog segment
    local = {(t, q): rig.local(t, q) for t in TOPICS for q in range(QUEUES)}
    segments = rig.store.segments.all()
    assert len(segments) > 3
    far_future_s = time.time() + 10 * HOUR_S
    assert not rig.uploader.may_delete(segments[0])
    assert rig.store.run_retention(far_future_s) == 0

    run(rig.uploader.upload_now("orders"))
    assert not any(rig.uploader.may_delete(s) for s in segments)  # audit is still only local
    assert rig.store.run_retention(far_future_s) == 0

    async def tier_audit() -> None:
        await rig.uploader.upload_now("audit")
        await rig.uploader.close()

    run(tier_audit())
    assert all(rig.uploader.may_delete(s) for s in segments[:-1])
    assert rig.store.run_retention(far_future_s) == len(segments) - 1
    for (topic, q), messages in local.items():
        result = rig.store.read(topic, q, 0)
        assert result.status is ReadStatus.OFFSET_TOO_SMALL
        assert rig.reader.read(topic, q, 0, 500)[: result.next_offset] == messages[: result.next_offset]
        assert rig.cold(topic, q) == messages


def test_data_deleted_before_tiering_leaves_a_logged_gap(
    config: TieringConfig, rigs: Callable[..., TierRig], caplog: pytest.LogCaptureFixture
) -> None:
    rig = rigs(config)
    fill(rig.store, ("orders",), QUEUES, 100)
    rig.store.retention.may_delete = lambda _segment: True  # as if tiering had been off until now
    assert rig.store.run_retention(time.time() + 10 * HOUR_S) > 0
    lows = {q: rig.store.queue_bounds("orders", q)[0] for q in range(QUEUES)}
    assert all(low > 0 for low in lows.values())

    async def tier() -> None:
        with caplog.at_level(logging.WARNING, logger="sluice.tiering"):
            await rig.uploader.upload_now("orders")
        await rig.uploader.close()

    run(tier())
    assert "the tiered queue has a gap" in caplog.text
    for q, low in lows.items():
        assert rig.reader.bounds("orders", q) == (low, 100)
        assert rig.reader.read("orders", q, 0, 2) == rig.local("orders", q)[:2]  # starts after the gap
        assert rig.cold("orders", q) == rig.local("orders", q)


class Crash(Exception):
    pass


class CrashAfterSecondSegment(MeteredObjectStore):
    """Stores the second segment, then fails as if the broker died before it updated the manifest."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.segment_keys: list[str] = []

    def put(self, key: str, data: bytes) -> ObjectInfo:
        info = super().put(key, data)
        if key.endswith(".parquet"):
            self.segment_keys.append(key)
            if len(self.segment_keys) == 2:
                raise Crash(f"killed after uploading {key}")
        return info


def test_crash_between_upload_and_manifest_leaves_no_gap_or_duplicate(
    config: TieringConfig, rigs: Callable[..., TierRig]
) -> None:
    crashing = CrashAfterSecondSegment(s3_store(config))
    rig = rigs(config, crashing)
    fill(rig.store, ("orders",), QUEUES, 60, seed=1)

    async def crash() -> None:
        with pytest.raises(Crash):
            await rig.uploader.upload_now("orders")
        await rig.uploader.close()

    run(crash())
    orphan = crashing.segment_keys[1]
    assert [s.key for s in rig.manifest.segments("orders")] == crashing.segment_keys[:1]
    assert rig.objects.head(orphan) is not None  # uploaded, but not in the manifest
    rig.close()

    rig = rigs(config)  # restart on the same data directory
    fill(rig.store, ("orders",), QUEUES, 60, seed=2)  # more data: the redone segment differs

    async def resume() -> None:
        await rig.uploader.upload_now("orders")
        await rig.uploader.close()

    run(resume())
    segs = rig.manifest.segments("orders")
    assert segs[1].key == orphan  # the same deterministic key, overwritten
    head = rig.objects.head(orphan)
    assert head is not None and (head.size, head.sha256) == (segs[1].size, segs[1].sha256)
    assert_manifest_matches_bucket(rig, "orders")
    for q in range(QUEUES):
        assert rig.cold("orders", q) == rig.local("orders", q)
        assert len(rig.local("orders", q)) == 120


def test_s3_outage_pauses_deletion_and_backlog_uploads_after(
    config: TieringConfig, rigs: Callable[..., TierRig], s3_server: MotoS3Server, caplog: pytest.LogCaptureFixture
) -> None:
    rig = rigs(config)
    rig.clock.offset_s = HOUR_S
    fill(rig.store, ("orders",), QUEUES, 60, seed=1)
    run(rig.uploader.upload_now("orders"))
    tiered_segments = rig.store.segments.all()[:-1]
    fill(rig.store, ("orders",), QUEUES, 60, seed=2)
    untiered_segment = rig.store.segments.all()[-2]
    assert rig.uploader.may_delete(tiered_segments[0])

    async def during_outage() -> None:
        with caplog.at_level(logging.WARNING, logger="sluice.tiering"):
            await rig.uploader.run_once()
        status = rig.uploader.topic_status("orders")
        assert status.failures == 1 and s3_server.endpoint_url in status.last_error
        assert status.lag_messages == 3 * 60
        assert "local deletion of untiered data is paused" in caplog.text
        with pytest.raises(Unavailable, match="did not finish"):
            await rig.uploader.upload_now("orders", timeout_s=0.3)

    with s3_server.outage():
        run(during_outage())
        assert not rig.uploader.may_delete(untiered_segment)
        assert rig.uploader.may_delete(tiered_segments[0])  # decided locally, S3 not needed
        cold = ColdReader(rig.manifest, rig.objects, config)  # nothing cached
        began = time.monotonic()
        with pytest.raises(Unavailable, match=rig.manifest.segments("orders")[0].key) as err:
            cold.read("orders", 0, 0, 10)
        assert err.value.retriable and time.monotonic() - began < 5.0
        cold.close()

    async def after_outage() -> None:
        await asyncio.sleep(config.retry_max_s)  # the backoff of the failed round
        await tier_all(rig, ("orders",))
        await rig.uploader.close()

    run(after_outage())
    assert rig.uploader.topic_status("orders").last_error == ""
    assert rig.uploader.may_delete(untiered_segment)
    assert_manifest_matches_bucket(rig, "orders")
    for q in range(QUEUES):
        assert rig.cold("orders", q) == rig.local("orders", q)


def test_upload_lag_is_exposed_per_topic(config: TieringConfig, rigs: Callable[..., TierRig]) -> None:
    from broker.tiering.uploader import tier_metric_samples
    from common import metrics

    rig = rigs(dataclasses.replace(config, min_age_s=HOUR_S))
    fill(rig.store, TOPICS, QUEUES, 20)
    before = {labels: value for _, labels, value in tier_metric_samples("b1", rig.uploader)}
    assert before == {("b1", "orders"): 3 * 20.0, ("b1", "audit"): 3 * 20.0}

    async def scenario() -> None:
        await rig.uploader.upload_now("orders")
        await rig.uploader.close()

    run(scenario())
    samples = tier_metric_samples("b1", rig.uploader)
    assert {f.name for f, _, _ in samples} == {metrics.TIER_UPLOAD_LAG.name}
    assert {labels: value for _, labels, value in samples} == {("b1", "orders"): 0.0, ("b1", "audit"): 60.0}
