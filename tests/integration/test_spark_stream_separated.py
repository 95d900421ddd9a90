"""The streaming source and sink over the separated topology: a NameServer, two brokers (broker-a,
broker-b) and two proxies as child processes. A topic on both brokers is read once per message with
offsets per (topic, broker, queue); the sink spreads its rows over both brokers and stores each once.
The merged topology's cases are in test_spark_stream.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from tests.e2e.support.cluster import Cluster, start_separated
from tests.helpers.spark_stream import read_topic, run_available_now, send, stream

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_separated(tmp_path_factory.mktemp("stream-separated"))
    try:
        yield c
    finally:
        problems = c.stop()
        assert not problems, problems


def test_two_brokers_read_once_and_written_once(spark: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    topic = cluster.create_topic("split-orders", queues=2)
    ids = send(cluster, topic, [f"m-{i}" for i in range(40)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    run_available_now(stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, checkpoint)
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["message_id"] for r in rows) == sorted(ids)
    assert {r["broker"] for r in rows} == {"broker-a", "broker-b"}
    offsets = json.loads(sorted((checkpoint / "offsets").glob("[0-9]*"))[-1].read_text().splitlines()[-1])
    assert sorted(offsets["queues"][topic]) == ["broker-a", "broker-b"]
    assert sum(n for queues in offsets["queues"][topic].values() for n in queues.values()) == 40

    copy = cluster.create_topic("split-copy", queues=2)
    df = spark.read.parquet(str(out)).select("body", "keys", "tag", "properties")
    df.write.format("sluice").option("namesrv", cluster.namesrv).option("topic", copy).mode("append").save()
    written = read_topic(cluster, copy)
    assert sorted(bytes(r["body"]).decode() for r in written) == sorted(f"m-{i}" for i in range(40))
    assert {r["broker"] for r in written} == {"broker-a", "broker-b"}
