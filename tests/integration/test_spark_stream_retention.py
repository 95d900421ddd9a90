"""Retention removing messages a streaming query has not read yet, in both topologies (a real `sluice
up`; a NameServer, two brokers and two proxies) whose brokers delete sealed CommitLog segments two
seconds old, and a real local Spark:

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
from spark_jobs.stream.offsets import QueueKey, from_json, lost_from_json
from spark_jobs.stream.options import StreamOptions
from tests.e2e.support.cluster import Cluster, start_merged, start_separated
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


@pytest.fixture(scope="module", params=["merged", "separated"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp(f"stream-retention-{request.param}")
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    c = start_merged(root, extra_args=["--config", str(config)]) if request.param == "merged" else (
        start_separated(root, config=config))  # fmt: skip
    try:
        yield c
    finally:
        problems = c.stop()
        assert not problems, problems


def test_removed_unread_messages_fail_the_query_or_are_skipped_and_counted_in_its_progress(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    topic = cluster.create_topic("retained", queues=len(cluster.brokers))  # one queue per broker
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    first = send(cluster, topic, [f"first-{i}" for i in range(5)])
    run_available_now(stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, checkpoint)
    assert sorted(r["message_id"] for r in pq.read_table(out).to_pylist()) == sorted(first)

    # Enough to seal several segments (of each broker); two seconds later retention deletes them, unread.
    later = send(cluster, topic, [f"later-{i}-" + "x" * 1000 for i in range(60 * len(cluster.brokers))])
    opts = StreamOptions(namesrv=(cluster.namesrv,), topics=frozenset({topic}))
    start = {key: int(at) for key, at in positions(checkpoint).items()}
    deadline, floors = time.monotonic() + 60, dict[QueueKey, int]()
    while True:  # until every sealed segment is gone (no floor moves): no removal races the reads
        time.sleep(1)
        now = {key: r.min_offset for key, r in discover(opts).items()}
        if now == floors and all(now[key] > at for key, at in start.items()):
            break
        assert time.monotonic() < deadline, f"retention did not settle (floors {now})"
        floors = now

    df = stream(spark, cluster, topics=topic, startingOffsets="earliest")
    brokers = "|".join(cluster.brokers)
    with pytest.raises(Exception, match=rf"data loss: messages \[\d+, \d+\) of {topic} queue 0 on broker ({brokers})"):
        run_available_now(df, out, checkpoint)

    df = stream(spark, cluster, topics=topic, startingOffsets="earliest", failOnDataLoss="false")
    query = run_available_now(df, out, checkpoint)
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress]
    lost = lost_from_json(ends[-1])
    assert set(lost) == set(start), ends[-1]  # counted in the progress (per queue), not only logged
    assert all(lost[key] >= floors[key] - start[key] > 0 for key in start), (ends[-1], floors, start)
    rows = pq.read_table(out).to_pylist()
    got = {r["message_id"] for r in rows}
    assert len(rows) == len(got) and set(first) <= got
    assert len(got) + sum(lost.values()) == len(first) + len(later), "every message either read once or counted lost"


def positions(checkpoint: Path) -> dict[QueueKey, int]:
    """The query's committed position per queue: the end of the last batch in its checkpoint."""
    last = max((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return from_json(json.loads(last.read_text().splitlines()[-1]))
