"""The streaming source across a primary failover: etcd, a NameServer, one replicated group of three
`sluice broker --group g1 --min-insync 2` members and a proxy as real processes
(tests/e2e/support/replicated.py), a real local Spark.

A query runs (1 s trigger, small batches) while messages are sent, the primary is SIGKILLed, a new
one takes the group and more messages are sent. Its offsets are per (topic, group, queue), so they
stay valid on the new primary; it never read past `acked_offset` (what every in-sync member holds),
so nothing it read can be replaced. Whether the running query survives the switch or fails (a task
that still called the dead primary), a run from the same checkpoint then completes it (again, at
most twice, if the group switched once more meanwhile: on a machine at load 60+ its 2 s etcd leases
expire and members take turns): the Parquet sink holds every acknowledged message exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.e2e.support.clients import message, producer
from tests.e2e.support.cluster import Cluster
from tests.e2e.support.replicated import GROUP, fail_over, routed_primary, start_replicated, wait
from tests.helpers.etcd import start_etcd
from tests.helpers.spark_stream import run_available_now, sink_rows, start_query, stream

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("stream-failover")
    etcd = start_etcd(root)
    try:
        cluster = start_replicated(root, etcd.url)
        try:
            yield cluster
        finally:
            problems = cluster.stop()
            assert not problems, problems
    finally:
        etcd.stop()


def send_acknowledged(cluster: Cluster, topic: str, bodies: list[str]) -> list[str]:
    """Send each body until the cluster acknowledges it (refusals while the group fails over are
    retried); the acknowledged message ids."""
    ids = []
    with producer(cluster.endpoints, topic) as p:
        for body in bodies:
            deadline = time.monotonic() + 60
            while True:
                try:
                    ids.append(p.send(message(topic, body.encode())).message_id)
                    break
                except Exception:
                    assert time.monotonic() < deadline, f"{body} was never acknowledged"
                    time.sleep(0.3)
    return ids


def test_a_query_across_a_primary_failover_stores_each_acknowledged_message_once(
    spark: SparkSession, replicated: Cluster, tmp_path: Path
) -> None:
    cluster = replicated
    topic = cluster.create_topic("failover-orders", queues=2)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    sent = send_acknowledged(cluster, topic, [f"before-{i}" for i in range(40)])
    df = stream(spark, cluster, topics=topic, startingOffsets="earliest", maxRecordsPerTrigger="8")
    query = start_query(lambda: (
        df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second").start()
    ))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not query.recentProgress or not any(p["numInputRows"] for p in query.recentProgress):
            assert time.monotonic() < deadline and query.isActive, f"the query read nothing: {query.exception()}"
            time.sleep(0.2)
        victim = fail_over(cluster)  # SIGKILL the primary mid-query; another member takes the group
        seen = len(query.recentProgress)
        sent += send_acknowledged(cluster, topic, [f"after-{i}" for i in range(40)])
        # A batch with rows against the new primary, or the query failed on the old one.
        deadline = time.monotonic() + 60
        while query.isActive and not any(p["numInputRows"] for p in query.recentProgress[seen:]):
            assert time.monotonic() < deadline, "the query neither read on nor failed after the failover"
            time.sleep(0.2)
    finally:
        query.stop()
    assert victim in ("b1", "b2", "b3")
    for attempt in range(3):  # a run from the checkpoint completes it (again if the group switched once more)
        try:
            run_available_now(stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, checkpoint)
            break
        except Exception as exc:
            if attempt == 2 or not any(f"common.errors.{e}" in str(exc) for e in ("NotPrimary", "Unavailable")):
                raise
            wait("a routed primary", lambda: routed_primary(cluster) is not None)
    rows = sink_rows(spark, out)  # what the sink committed: a batch that failed may have left a file
    assert len(rows) == len(sent) == 80, "each acknowledged message exactly once"
    assert sorted(r["message_id"] for r in rows) == sorted(sent)
    assert {r["broker"] for r in rows} == {GROUP}  # offsets are the group's, whichever member served them
