"""The cold reader against a real S3-compatible server (moto on loopback).

A point read fetches only the footer and the one row group it needs (GETs and bytes counted by
`MeteredObjectStore`), read-ahead prefetches the next row groups of a queue with one GET of their
span, a read from memory never touches the bucket, a corrupt or truncated object fails with an
error naming it while other segments stay readable, lookups by id, key and time agree with the
local store's, and tiered retention deletes whole expired objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from broker.tiering.config import TieringConfig
from broker.tiering.format import TAIL_BYTES, SegmentCorrupted
from broker.tiering.reader import ColdReader
from broker.tiering.s3store import S3ObjectStore
from broker.tiering.stores import s3_store
from common.errors import Unavailable
from tests.helpers.tiering import TierRig, fill, open_rig

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]

WAIT_S = 20.0


def base_config(s3_config: TieringConfig, **kw: object) -> TieringConfig:
    return dataclasses.replace(s3_config, min_age_s=0.0, read_ahead_row_groups=0, **kw)  # type: ignore[arg-type]


@pytest.fixture
def rig_one_segment(s3_config: TieringConfig, tmp_path: Path) -> Iterator[TierRig]:
    """One queue, 2,000 incompressible 1 KB messages, one segment of 64-row row groups."""
    config = base_config(s3_config, segment_target_bytes=8 << 20, row_group_rows=64, row_group_bytes=1 << 20)
    rig = open_rig(tmp_path / "broker", config, s3_store(config))
    fill(rig.store, ("orders",), 1, 2000, body_bytes=1000)
    asyncio.run(asyncio.wait_for(rig.uploader.upload_now("orders"), WAIT_S))
    asyncio.run(rig.uploader.close())
    yield rig
    rig.close()


@pytest.fixture
def rig_many_segments(s3_config: TieringConfig, tmp_path: Path) -> Iterator[TierRig]:
    """Two topics of three queues in several segments each."""
    config = base_config(s3_config, segment_target_bytes=16 << 10, row_group_rows=16)
    rig = open_rig(tmp_path / "broker", config, s3_store(config))
    fill(rig.store, ("orders", "keep"), 3, 80)

    async def tier() -> None:
        await rig.uploader.upload_now("orders")
        await rig.uploader.upload_now("keep")
        await rig.uploader.close()

    asyncio.run(asyncio.wait_for(tier(), WAIT_S))
    yield rig
    rig.close()


def test_point_read_fetches_only_the_needed_row_group(rig_one_segment: TierRig) -> None:
    rig = rig_one_segment
    (seg,) = rig.manifest.segments("orders")
    assert len(seg.row_groups) == 2000 // 64 + 1 and seg.size > 1_500_000
    local = rig.local("orders", 0)
    rig.objects.reset()
    assert rig.reader.read("orders", 0, 1000, 1) == local[1000:1001]
    first = rig.objects.snapshot()
    group = seg.row_groups[1000 // 64]
    assert first.gets == 2  # the footer, then the row group
    assert first.get_bytes == TAIL_BYTES + (group.end - group.start) < seg.size // 10
    assert rig.reader.read("orders", 0, 1001, 5) == local[1001:1006]
    assert rig.objects.snapshot().gets == 2  # same row group: from the cache
    assert rig.reader.read("orders", 0, 1990, 100) == local[1990:]
    assert rig.objects.snapshot().gets == 3  # one more row group, the footer is cached


def test_read_ahead_fetches_the_next_row_groups_with_one_get(rig_one_segment: TierRig) -> None:
    rig = rig_one_segment
    (seg,) = rig.manifest.segments("orders")
    groups = seg.row_groups
    reader = ColdReader(rig.manifest, rig.objects, dataclasses.replace(rig.config, read_ahead_row_groups=2))
    local = rig.local("orders", 0)
    rig.objects.reset()
    assert reader.read("orders", 0, 0, 10) == local[:10]
    deadline = time.monotonic() + WAIT_S
    while reader.read_cached("orders", 0, 64, 128 - 64) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # That read from memory moved the window on: row group 2 is decoded or on its way, so row groups
    # 3 and 4 leave in one GET. Wait until nothing is in flight, then count.
    while reader._inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    snap = rig.objects.snapshot()
    # The footer, row group 0 for the read, row groups 1-2 ahead in one GET of their span, then 3-4.
    assert snap.gets == 4
    assert snap.get_bytes == (
        TAIL_BYTES + (groups[0].end - groups[0].start) + (groups[2].end - groups[1].start)
        + (groups[4].end - groups[3].start)
    )  # fmt: skip
    assert reader.read_cached("orders", 0, 10, 128 - 10) == local[10:128]  # from memory
    reader.close()
    assert rig.objects.snapshot().gets == 4  # the window ahead (row groups 2-4) was full: no new GET


def test_read_cached_answers_from_memory_or_not_at_all(rig_one_segment: TierRig) -> None:
    """What the broker answers on its event loop: never a GET, None whenever a row group it needs is
    not decoded yet (the read then goes to the read threads), else exactly what `read` answers."""
    rig = rig_one_segment
    local = rig.local("orders", 0)
    rig.objects.reset()
    assert rig.reader.read_cached("orders", 0, 100, 5) is None
    assert rig.objects.snapshot().gets == 0
    assert rig.reader.read("orders", 0, 100, 5) == local[100:105]  # row group 1 (offsets 64-127)
    gets = rig.objects.snapshot().gets
    assert rig.reader.read_cached("orders", 0, 64, 64) == local[64:128]
    assert rig.reader.read_cached("orders", 0, 120, 20) is None  # runs into row group 2
    assert rig.reader.read_cached("orders", 0, 5000, 5) == rig.reader.read("orders", 0, 5000, 5) == []
    assert rig.objects.snapshot().gets == gets


def damage(rig: TierRig, key: str, row_group: int) -> None:
    """Overwrite 64 bytes in the middle of a row group's body column chunk, straight through the client."""
    data = bytearray(rig.objects.get(key))
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(row_group).column(names.index("body"))
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[middle : middle + 64] = bytes(b ^ 0x5A for b in data[middle : middle + 64])
    store = rig.objects.inner
    assert isinstance(store, S3ObjectStore)
    store.client.put_object(Bucket=store.bucket, Key=key, Body=bytes(data))


def test_corrupt_and_truncated_objects_name_the_object(rig_many_segments: TierRig) -> None:
    rig = rig_many_segments
    segs = rig.manifest.segments("orders")
    assert len(segs) >= 4
    damage(rig, segs[1].key, 0)
    store = rig.objects.inner
    assert isinstance(store, S3ObjectStore)
    store.client.put_object(
        Bucket=store.bucket, Key=segs[2].key, Body=rig.objects.get(segs[2].key)[: segs[2].size // 2]
    )
    reader = ColdReader(rig.manifest, rig.objects, rig.config)  # nothing cached
    local = rig.local("orders", 0)

    def first_offset(seg_index: int) -> int:
        return segs[seg_index].row_groups[0].first_offset

    assert segs[1].row_groups[0].first_queue == 0 and segs[2].row_groups[0].first_queue == 0
    with pytest.raises(SegmentCorrupted, match=f"{segs[1].key}.*row group 0"):
        reader.read("orders", 0, first_offset(1), 1)
    with pytest.raises(SegmentCorrupted, match=f"{segs[2].key} is shorter .* \\(truncated\\?\\)"):
        reader.read("orders", 0, first_offset(2), 1)
    assert reader.read("orders", 0, 0, 3) == local[:3]
    offset = first_offset(3)
    assert reader.read("orders", 0, offset, 3) == local[offset : offset + 3]
    assert rig.cold("keep", 1) == rig.local("keep", 1)
    reader.close()


def test_lookups_agree_with_the_local_store(rig_many_segments: TierRig) -> None:
    rig = rig_many_segments
    for message_id in ("orders-0-000000", "orders-2-000042", "orders-1-000079"):
        assert rig.reader.find_by_id("orders", message_id) == rig.store.find_by_id(message_id, "orders")
    assert rig.reader.find_by_id("orders", "no-such-id") == []
    order = lambda r: (r.queue_id, r.queue_offset)  # noqa: E731
    found = sorted(rig.reader.find_by_key("orders", "key-3-1"), key=order)
    assert found and found == sorted(rig.store.find_by_key("orders", "key-3-1"), key=order)
    assert len(rig.reader.find_by_key("orders", "key-3-1", limit=2)) == 2
    for q in range(3):
        local = rig.local("orders", q)
        for message in (local[0], local[17], local[55], local[-1]):
            ts = message.store_timestamp_ms
            assert rig.reader.offset_for_timestamp("orders", q, ts) == rig.store.offset_for_timestamp("orders", q, ts)
        assert rig.reader.offset_for_timestamp("orders", q, local[-1].store_timestamp_ms + 1) is None


def test_tiered_retention_deletes_whole_expired_objects(rig_many_segments: TierRig, s3_server: MotoS3Server) -> None:
    rig = rig_many_segments
    config = dataclasses.replace(rig.config, retention_s=60.0, topic_retention_s={"keep": 0.0})
    reader = ColdReader(rig.manifest, rig.objects, config)
    keys = [s.key for s in rig.manifest.segments("orders")]
    kept = [s.key for s in rig.manifest.segments("keep")]
    assert reader.expire(time.time()) == 0  # nothing is a minute old yet
    with s3_server.outage(), pytest.raises(Unavailable):
        reader.expire(time.time() + 120)
    assert rig.manifest.segments("orders") == [] and len(rig.manifest.pending_deletes("orders")) == len(keys)
    assert reader.expire(time.time() + 120) == len(keys)  # finishes what the outage interrupted
    assert rig.manifest.pending_deletes("orders") == []
    assert all(rig.objects.head(k) is None for k in keys)
    assert all(rig.objects.head(k) is not None for k in kept)
    mirror = json.loads(rig.objects.get(rig.manifest.mirror_key("orders")))
    assert mirror["segments"] == [] and mirror["tiered_end"] == {"0": 80, "1": 80, "2": 80}
    assert reader.bounds("orders", 1) == (80, 80) and reader.read("orders", 1, 0, 10) == []
    reader.close()
