"""The `sluice` Spark data source over a real archive (tiering core into moto S3) in a real local Spark.

Every message produced comes back exactly once with its documented columns; a one-hour query GETs
only the segments whose manifest time range overlaps the hour; filters Spark pushes down (topic,
queue, time) prune objects too; an empty range is an empty result; a missing bucket or topic and a
bad range are clear errors before any task runs, and an unreadable object is named.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.tiering.config import TieringConfig
from common.errors import BadRequest, MessageCorrupted, NotFound
from spark_jobs.cli import spark_failure
from spark_jobs.options import ScanOptions
from spark_jobs.planner import plan_scan
from spark_jobs.scan import read_task
from spark_jobs.schema import ARROW_SCHEMA
from tests.helpers.archive import ArchiveBuilder, message
from tests.helpers.spark_data import AUDIT, BASE_MS, HOUR_MS, ORDERS, Archive

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow


def load(spark: SparkSession, archive: Archive, **extra: str) -> DataFrame:
    return spark.read.format("sluice").options(**archive.options(**extra)).load()


def ids(df: DataFrame) -> list[tuple[Any, ...]]:
    rows = df.select("topic", "queue_id", "queue_offset", "message_id", "store_timestamp").collect()
    return sorted((r[0], r[1], r[2], r[3], int(r[4].timestamp() * 1000)) for r in rows)


def expected(archive: Archive, topics: tuple[str, ...], lo: int = 0, hi: int = 1 << 62) -> list[tuple[Any, ...]]:
    return sorted(
        (p.topic, p.queue_id, p.queue_offset, p.message_id, p.store_ms)
        for p in archive.produced
        if p.topic in topics and lo <= p.store_ms < hi
    )


def manifest_segments(archive: Archive, topic: str) -> list[dict[str, Any]]:
    key = f"archive/test-cluster/broker-t/{topic}/manifest.json"
    body = archive.server.client().get_object(Bucket=archive.config.bucket, Key=key)["Body"].read()
    segments: list[dict[str, Any]] = json.loads(body)["segments"]
    return segments


def test_every_message_once_with_its_columns(spark: SparkSession, archive: Archive) -> None:
    df = load(spark, archive)
    assert df.columns == ARROW_SCHEMA.names
    assert ids(df) == expected(archive, (ORDERS, AUDIT))
    by_id = {p.message_id: p for p in archive.produced}
    rows = df.select("message_id", "keys", "message_group", "tag", "body", "broker", "cluster", "object_key").collect()
    for r in rows:
        p = by_id[r["message_id"]]
        assert (tuple(r["keys"]), r["message_group"], r["tag"], bytes(r["body"])) == (
            p.keys, p.message_group, p.tag, p.body,
        )  # fmt: skip
        assert (r["cluster"], r["broker"]) == (p.cluster, p.broker)
        assert r["object_key"].startswith(f"archive/test-cluster/broker-t/{p.topic}/")


def test_one_hour_fetches_only_the_segments_that_can_hold_it(spark: SparkSession, archive: Archive) -> None:
    lo, hi = BASE_MS + 2 * HOUR_MS, BASE_MS + 3 * HOUR_MS
    segments = manifest_segments(archive, ORDERS)
    overlapping = {s["key"] for s in segments if s["max_store_timestamp_ms"] >= lo and s["min_store_timestamp_ms"] < hi}
    assert 0 < len(overlapping) < len(segments) / 2
    archive.server.clear_requests()
    df = load(spark, archive, topic=ORDERS, **{"from": str(lo), "to": str(hi)})
    assert ids(df) == expected(archive, (ORDERS,), lo, hi)
    assert archive.segment_gets() == overlapping
    # The same hour as filters Spark pushes down instead of options.
    archive.server.clear_requests()
    stored = F.col("store_timestamp")
    pushed = load(spark, archive).filter(
        (F.col("topic") == ORDERS)
        & (stored >= F.lit(lo / 1000).cast("timestamp"))
        & (stored < F.lit(hi / 1000).cast("timestamp"))
    )
    assert ids(pushed) == expected(archive, (ORDERS,), lo, hi)
    assert archive.segment_gets() == overlapping


def test_iso_times_and_pushed_down_filters_prune(spark: SparkSession, archive: Archive) -> None:
    lo = BASE_MS + 4 * HOUR_MS
    archive.server.clear_requests()
    df = load(spark, archive).filter(
        (F.col("topic") == AUDIT)
        & (F.col("queue_id") == 0)
        & (F.col("store_timestamp") >= F.lit(lo / 1000).cast("timestamp"))
    )
    want = [e for e in expected(archive, (AUDIT,), lo) if e[1] == 0]
    assert ids(df) == want and want
    gets = archive.segment_gets()
    assert gets and all(f"/{AUDIT}/" in key for key in gets)
    assert not any(f"/{ORDERS}/" in path for _, path in archive.server.requests())  # not even its manifest
    assert lo == 1_717_290_000_000  # 2024-06-02T01:00Z
    iso = load(spark, archive, topic=AUDIT, **{"from": "2024-06-02T01:00:00+00:00", "to": "2024-06-02T02:00Z"})
    assert ids(iso) == expected(archive, (AUDIT,), lo, lo + HOUR_MS)


def test_queue_and_offset_options_and_row_group_pruning(
    spark: SparkSession, archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    df = load(spark, archive, topic=ORDERS, queues="1", fromOffset="3", toOffset="9")
    want = [e for e in expected(archive, (ORDERS,)) if e[1] == 1 and 3 <= e[2] < 9]
    assert ids(df) == want and len(want) == 6
    # Without Spark: the same task reads fewer bytes than its object when row groups can be skipped.
    import spark_jobs.scan
    from broker.tiering.objectstore import MeteredObjectStore
    from broker.tiering.s3store import S3ObjectStore

    monkeypatch.setattr(spark_jobs.scan, "TAIL_BYTES", 2048)  # test segments are smaller than the default tail

    opts = ScanOptions.parse(archive.options(topic=ORDERS, queues="2", fromOffset="0", toOffset="2"))
    plan = plan_scan(opts)
    assert len(plan.tasks) == 1 and not plan.tasks[0].whole
    counted = MeteredObjectStore(S3ObjectStore(opts.s3))
    rows = sum(b.num_rows for b in read_task(plan.tasks[0], opts, counted))
    assert rows == 2 and counted.counters.get_bytes < plan.tasks[0].segment.size  # footer + 1 of 4 row groups
    assert counted.counters.gets <= 3  # the footer (at most two GETs) and the one row group holding both rows


def test_empty_range_is_an_empty_result(spark: SparkSession, archive: Archive) -> None:
    df = load(spark, archive, topic=ORDERS, **{"from": "2001-01-01T00:00:00Z", "to": "2001-01-01T01:00:00Z"})
    assert df.count() == 0
    assert load(spark, archive, topic=ORDERS, fromOffset="100000").count() == 0


def test_clear_errors_before_any_task(archive: Archive) -> None:
    with pytest.raises(NotFound, match="bucket 'no-such-bucket' does not exist"):
        plan_scan(ScanOptions.parse({**archive.options(), "bucket": "no-such-bucket"}))
    with pytest.raises(NotFound, match=r"topic\(s\) nope have no tiered data .*topics there: audit, orders"):
        plan_scan(ScanOptions.parse(archive.options(topic="nope")))
    with pytest.raises(BadRequest, match="time range is reversed"):
        ScanOptions.parse(archive.options(**{"from": "2024-06-02T00:00:00Z", "to": "2024-06-01T00:00:00Z"}))
    with pytest.raises(BadRequest, match="option to 'yesterday' is not a time"):
        ScanOptions.parse(archive.options(to="yesterday"))


def test_unreadable_object_is_named(spark: SparkSession, archive: Archive) -> None:
    """A damaged segment in a copy of the archive fails the scan with its key in the message."""
    client = archive.server.client()
    bucket = "sluice-spark-damaged"
    client.create_bucket(Bucket=bucket)
    prefix = f"archive/test-cluster/broker-t/{AUDIT}/"
    for obj in client.list_objects_v2(Bucket=archive.config.bucket, Prefix=prefix)["Contents"]:
        client.copy_object(
            Bucket=bucket, Key=obj["Key"], CopySource={"Bucket": archive.config.bucket, "Key": obj["Key"]}
        )
    damaged = manifest_segments(archive, AUDIT)[0]
    client.put_object(Bucket=bucket, Key=damaged["key"], Body=b"\0" * damaged["size"])
    df = spark.read.format("sluice").options(**{**archive.options(topic=AUDIT), "bucket": bucket}).load()
    with pytest.raises(Exception) as info:
        df.count()
    error = spark_failure(info.value)
    assert isinstance(error, MessageCorrupted)
    assert damaged["key"] in str(error) and "not a readable Parquet segment" in str(error)


def test_a_large_segment_split_by_bytes_reads_every_row_once(s3_server: MotoS3Server, tmp_path: Path) -> None:
    """Tasks of byte ranges of one segment (row groups by start byte) together read it exactly once."""
    from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY

    bucket = "sluice-spark-split"
    s3_server.client().create_bucket(Bucket=bucket)
    config = TieringConfig(
        endpoint_url=s3_server.endpoint_url, region=REGION, bucket=bucket, prefix="p", access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY, addressing_style="path", max_attempts=1, mirror_interval_s=0.0,
    )  # fmt: skip
    builder = ArchiveBuilder(tmp_path / "broker", config)
    rng = random.Random(3)
    try:
        for first in range(0, 1200, 200):
            batch = [message("big", i % 2, f"m{first + i}", body=rng.randbytes(3000)) for i in range(200)]
            builder.produce(batch, BASE_MS + first)
        builder.tier()
    finally:
        builder.close()
    options = {"endpoint": s3_server.endpoint_url, "bucket": bucket, "prefix": "p", "region": REGION,
               "accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY, "addressingStyle": "path"}  # fmt: skip
    opts = ScanOptions.parse({**options, "splitBytes": str(1 << 20)})
    plan = plan_scan(opts)
    assert len(plan.manifests[0].segments) == 1 and len(plan.tasks) >= 3
    got = [m for task in plan.tasks for b in read_task(task, opts) for m in b.column("message_id").to_pylist()]
    assert sorted(got) == sorted(p.message_id for p in builder.produced)
