"""Helpers of the streaming source's tests (tests/integration/test_spark_stream*.py): send with
`sluice admin message send`, build a `readStream`, run an AvailableNow query to Parquet, read a
topic back the way the source's executors do (no Spark job)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.schema import SEGMENT_COLUMNS
from spark_jobs.stream.discovery import discover
from spark_jobs.stream.hot import QueuePartition, read_partition
from spark_jobs.stream.options import StreamOptions
from tests.e2e.support.cluster import SLUICE, Cluster, _child_env
from tests.helpers.procs import REPO_ROOT


def send(cluster: Cluster, topic: str, bodies: list[str], *extra: str) -> list[str]:
    """Send one message per body with `sluice admin message send`; their message ids."""
    argv = [*SLUICE, "admin", "--namesrv", cluster.namesrv, "message", "send", topic, *extra, "--json"]
    proc = subprocess.run(argv, input="\n".join(bodies) + "\n", cwd=REPO_ROOT, env=_child_env(),
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    sent = json.loads(proc.stdout)
    assert len(sent) == len(bodies), sent
    return [row["message_id"] for row in sent]


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
