"""Retention removing messages a streaming query has not read yet, against a real `sluice up` whose
broker deletes sealed CommitLog segments two seconds old, and a real local Spark:

- with `failOnDataLoss` (the default) the query fails, naming the queue and the removed range;
- with `failOnDataLoss=false` the same checkpoint reads on past the gap, and the number of skipped
  messages is in the query's progress (`sources[0].endOffset`, the offsets' `lost` tree), not only
  in a log.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from spark_jobs.stream.discovery import discover
from spark_jobs.stream.offsets import QueueKey, lost_from_json
from spark_jobs.stream.options import StreamOptions
from tests.e2e.support.cluster import Cluster, start_merged
from tests.helpers.spark_stream import run_available_now, send, stream

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow

CONFIG = f"""
[broker.store.commitlog]
segment_bytes = {16 << 10}

[broker.store.retention]
max_age_s = 2.0
check_interval_s = 0.5
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("stream-retention")
    (root / "sluice.toml").write_text(CONFIG)
    c = start_merged(root, extra_args=["--config", str(root / "sluice.toml")])
    try:
        yield c
    finally:
        problems = c.stop()
        assert not problems, problems


def test_removed_unread_messages_fail_the_query_or_are_skipped_and_counted_in_its_progress(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    topic = cluster.create_topic("retained", queues=1)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    first = send(cluster, topic, [f"first-{i}" for i in range(5)])
    run_available_now(stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, checkpoint)
    assert sorted(r["message_id"] for r in pq.read_table(out).to_pylist()) == sorted(first)

    # Enough to seal several segments; two seconds later retention deletes them, unread.
    later = send(cluster, topic, [f"later-{i}-" + "x" * 1000 for i in range(60)])
    key = QueueKey(topic, "broker-a", 0)
    opts = StreamOptions(namesrv=(cluster.namesrv,), topics=frozenset({topic}))
    deadline, floor = time.monotonic() + 60, -1
    while True:  # until every sealed segment is gone (the floor stops moving): no removal races the reads
        time.sleep(3)
        now = discover(opts)[key].min_offset
        if now > 5 and now == floor:
            break
        assert time.monotonic() < deadline, f"retention did not settle (floor {now})"
        floor = now

    df = stream(spark, cluster, topics=topic, startingOffsets="earliest")
    with pytest.raises(Exception, match=rf"data loss: messages \[5, \d+\) of {topic} queue 0 on broker broker-a"):
        run_available_now(df, out, checkpoint)

    df = stream(spark, cluster, topics=topic, startingOffsets="earliest", failOnDataLoss="false")
    query = run_available_now(df, out, checkpoint)
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress]
    lost = lost_from_json(ends[-1])
    assert lost[key] >= floor - 5 > 0, ends[-1]  # counted in the progress, not only logged
    rows = pq.read_table(out).to_pylist()
    got = {r["message_id"] for r in rows}
    assert len(rows) == len(got) and set(first) <= got
    assert len(got) + lost[key] == len(first) + len(later), "every message either read once or counted lost"
