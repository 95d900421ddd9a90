"""Helpers of the streaming source's tests (tests/integration/test_spark_stream*.py,
tests/e2e/test_spark_stream*.py): send as `sluice admin message send`, build a `readStream`, run
an AvailableNow query to Parquet, read a sink as Spark does, read a topic back the way the source's
executors do (no Spark job)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from admin.cluster import Cluster as AdminCluster
from admin.produce import SendOptions, send_messages
from spark_jobs.schema import SEGMENT_COLUMNS
from spark_jobs.stream.discovery import discover
from spark_jobs.stream.hot import QueuePartition, read_partition
from spark_jobs.stream.options import StreamOptions
from tests.e2e.support.cluster import Cluster


def send(
    cluster: Cluster, topic: str, bodies: list[str], *, tag: str | None = None, keys: tuple[str, ...] = (),
    properties: dict[str, str] | None = None,
) -> list[str]:  # fmt: skip
    """Send one message per body as `sluice admin message send` does (its own code, admin/produce.py,
    in this process: no interpreter start per call); their message ids."""

    async def go() -> list[str]:
        async with AdminCluster(cluster.namesrv) as admin:
            options = SendOptions(tag, keys, dict(properties or {}))
            report = await send_messages(admin, topic, [b.encode() for b in bodies], options)
        return [row["message_id"] for row in report.rows]

    return asyncio.run(go())


def stream(spark: SparkSession, cluster: Cluster, **options: str) -> DataFrame:
    return spark.readStream.format("sluice").option("namesrv", cluster.namesrv).options(**options).load()


SPARK_STARTUP_FAILURE = "Python worker failed to connect back"  # Spark's fixed 10 s, missed on a loaded machine


def run_available_now(df: DataFrame, out: Path, checkpoint: Path) -> Any:
    for attempt in range(3):
        query = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except Exception as exc:
            # The source's Python process did not start in time: nothing was planned or read; a
            # new start from the same checkpoint is what a person would do. Anything else fails.
            if SPARK_STARTUP_FAILURE not in str(exc) or query.recentProgress or attempt == 2:
                raise
            continue
        assert not query.isActive, "the AvailableNow query did not finish"
        assert query.exception() is None, query.exception()
        return query
    raise AssertionError("unreachable")


def start_query(start: Callable[[], StreamingQuery]) -> StreamingQuery:
    """`start()`, again (up to three times) while the query dies before its first trigger because
    the source's Python process did not connect back in time (SPARK_STARTUP_FAILURE); the query once
    it has reported progress or failed otherwise."""
    for attempt in range(3):
        query = start()
        while query.isActive and not query.recentProgress:
            time.sleep(0.1)
        if (
            query.isActive
            or query.recentProgress
            or attempt == 2
            or SPARK_STARTUP_FAILURE not in str(query.exception())
        ):
            return query
    raise AssertionError("unreachable")


def sink_rows(spark: SparkSession, out: Path) -> list[dict[str, Any]]:
    """The rows of a Parquet sink as Spark reads it: only the files its log (`_spark_metadata`) lists.
    A task of a failed batch may leave a file behind that no batch committed; a plain directory scan
    (pyarrow) would count its rows too."""
    return list(spark.read.parquet(str(out)).toArrow().to_pylist())


def read_topic(cluster: Cluster, topic: str) -> list[dict[str, Any]]:
    """Every message of a topic as the source's rows, read as its executors read (no Spark job)."""
    opts = StreamOptions(namesrv=(cluster.namesrv,), topics=frozenset({topic}))
    rows: list[dict[str, Any]] = []
    for key, r in sorted(discover(opts).items()):
        part = QueuePartition(key, r.cluster, r.address, r.min_offset, r.acked_offset)
        rows += [row for batch in read_partition(part, opts) for row in batch.to_pylist()]
    return rows


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A row's message columns, maps as dicts and times as epoch ms (Spark's Parquet output keeps no zone)."""
    out = {}
    for name, _ in SEGMENT_COLUMNS:
        value = row[name]
        if isinstance(value, datetime):
            value = int(value.replace(tzinfo=value.tzinfo or UTC).timestamp() * 1000)
        elif name.endswith("properties"):
            value = dict(value)
        out[name] = value
    return out
