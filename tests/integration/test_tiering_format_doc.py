"""docs/tiered-format.md is enough to read the bucket: a reader built from the page alone.

The broker side (store, uploader) only produces the data. The checks use boto3, json, urllib and
`pyarrow.parquet`, nothing of Sluice: the documented key layout and manifest lead to the objects,
whose schema, sort order, metadata and values are what the page says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from broker.tiering.config import TieringConfig
from broker.tiering.stores import s3_store
from tests.helpers.tiering import BROKER, CLUSTER, fill, open_rig

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]

TOPIC = "%RETRY%group-ü"  # a name that needs the documented percent-encoding
QUEUES = 3
PER_QUEUE = 90


def produce(s3_config: TieringConfig, data_dir: Path) -> dict[tuple[int, int], Any]:
    """Tier TOPIC; return the messages as the broker stored them, by (queue id, offset)."""
    config = dataclasses.replace(s3_config, min_age_s=0.0, segment_target_bytes=12 << 10, row_group_rows=20)
    rig = open_rig(data_dir, config, s3_store(config))
    try:
        fill(rig.store, (TOPIC,), QUEUES, PER_QUEUE)

        async def tier() -> None:
            await rig.uploader.upload_now(TOPIC)
            await rig.uploader.close()

        asyncio.run(asyncio.wait_for(tier(), 20.0))
        return {(m.queue_id, m.queue_offset): m for q in range(QUEUES) for m in rig.local(TOPIC, q)}
    finally:
        rig.close()


def test_read_the_bucket_following_only_the_documented_format(
    s3_config: TieringConfig, s3_server: MotoS3Server, tmp_path: Path
) -> None:
    stored = produce(s3_config, tmp_path / "broker")

    # -- from here on: only the page ---------------------------------------------------------
    enc = lambda s: quote(s, safe="-_.~")  # noqa: E731
    s3 = s3_server.client()
    bucket = s3_config.bucket
    base = f"{s3_config.prefix}/{enc(CLUSTER)}/{enc(BROKER)}/{enc(TOPIC)}/"
    assert base == "archive/test-cluster/broker-t/%25RETRY%25group-%C3%BC/"
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=base + "manifest.json")["Body"].read())
    assert manifest["kind"] == "sluice-tier-manifest" and manifest["format_version"] == 1
    assert (manifest["cluster"], manifest["broker"], manifest["topic"]) == (CLUSTER, BROKER, TOPIC)
    assert manifest["tiered_end"] == {str(q): PER_QUEUE for q in range(QUEUES)}
    segments = manifest["segments"]
    assert len(segments) > 2
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=base)["Contents"]]
    assert sorted(listed) == sorted([s["key"] for s in segments] + [base + "manifest.json"])

    seen: dict[tuple[int, int], dict[str, Any]] = {}
    ends = {q: 0 for q in range(QUEUES)}
    for seq, seg in enumerate(segments):
        assert seg["seq"] == seq
        assert re.fullmatch(re.escape(base) + f"{seq:010d}-{manifest['epoch']}\\.parquet", seg["key"])
        head = s3.head_object(Bucket=bucket, Key=seg["key"])
        assert head["ContentLength"] == seg["size"] and head["Metadata"]["sha256"] == seg["sha256"]
        data = s3.get_object(Bucket=bucket, Key=seg["key"])["Body"].read()
        pf = pq.ParquetFile(io.BytesIO(data))
        meta = {k.decode(): v.decode() for k, v in pf.metadata.metadata.items()}
        assert meta["sluice.format_version"] == "1" and meta["sluice.topic"] == TOPIC
        assert meta["sluice.sort"] == "queue_id,queue_offset" and int(meta["sluice.rows"]) == seg["rows"]
        assert json.loads(meta["sluice.queues"]) == seg["queues"]
        assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
        assert all(pf.metadata.row_group(i).num_rows <= 20 for i in range(pf.metadata.num_row_groups))
        table = pf.read()
        assert table.schema.field("queue_id").type == pa.int32()
        assert table.schema.field("store_timestamp").type == pa.timestamp("ms", tz="UTC")
        rows = table.to_pylist()
        keys = [(r["queue_id"], r["queue_offset"]) for r in rows]
        assert keys == sorted(keys)
        for q, (first, last) in seg["queues"].items():
            assert first == ends[int(q)]  # each queue continues where the previous segment ended
            ends[int(q)] = last + 1
        for r in rows:
            seen[(r["queue_id"], r["queue_offset"])] = r
        only_q1 = pq.read_table(io.BytesIO(data), filters=[("queue_id", "=", 1)])
        assert set(only_q1["queue_id"].to_pylist()) <= {1}

    assert seen.keys() == stored.keys()
    for pos, r in seen.items():
        m = stored[pos]
        assert (r["message_id"], r["body"], r["tag"], r["keys"]) == (m.message_id, m.body, m.tag, list(m.keys))
        assert dict(r["properties"]) == m.properties and dict(r["system_properties"]) == m.system_properties
        assert int(r["store_timestamp"].timestamp() * 1000) == m.store_timestamp_ms
        assert r["body_gzip"] == bool(m.flags & 1) and r["commitlog_position"] == m.physical_offset
