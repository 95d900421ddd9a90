"""`spark.readStream.format("sluice")` against real Sluice processes in a real local Spark: messages
sent with `sluice admin message send` come out of a checkpointed `Trigger.AvailableNow` query exactly
once, a restarted query reads only what was sent since, the rows equal the ones the broker tiers to
its archive (and still do when the broker reads them back from it after evicting its local copy),
`startingTimestamp` starts at the time, `sluice spark stream` keeps its per-minute counts across
reruns and a replayed batch, and bad options fail before anything runs (the merged topology, `sluice up`).

In both topologies (`each`: the merged cluster and a separated one, NameServer, broker-a, broker-b
and two proxies): one query stays exactly-once across tiering (upload-now, evict-local) and a queue
added between its runs; a deleted and recreated topic is read on, never again; a queue ending before
the query's position fails it; the sink's replayed batch adds no duplicate. Separated only: a topic
on two brokers is read once and written back over both.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from common.errors import InternalError
from spark_jobs import cli
from spark_jobs.schema import ARROW_SCHEMA
from tests.e2e.support.cluster import Cluster, start_merged, start_separated
from tests.helpers.spark_stream import (
    SPARK_STARTUP_FAILURE,
    comparable,
    read_topic,
    run_available_now,
    send,
    start_query,
    stream,
)

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow

TOPIC = "stream-orders"
BUCKET = "tier"
QUEUES = 4


def tier_flags(root: Path) -> list[str]:
    return ["--s3-endpoint", f"file://{root / 'objects'}", "--s3-bucket", BUCKET]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The merged topology (`sluice up`), tiering to a file:// archive."""
    root = tmp_path_factory.mktemp("stream-cluster")
    c = start_merged(root, extra_args=tier_flags(root))
    try:
        c.create_topic(TOPIC, queues=QUEUES)
        yield c
    finally:
        problems = c.stop()
        assert not problems, problems


@pytest.fixture(scope="module")
def separated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The separated topology (NameServer, broker-a, broker-b, two proxies), both brokers tiering to
    one file:// archive; started by the first test that asks for it."""
    root = tmp_path_factory.mktemp("stream-separated")
    c = start_separated(root, broker_args=tier_flags(root))
    try:
        yield c
    finally:
        problems = c.stop()
        assert not problems, problems


@pytest.fixture(params=["merged", "separated"])
def each(request: pytest.FixtureRequest) -> Cluster:
    """The test once per topology, on the module's clusters."""
    found: Cluster = request.getfixturevalue("cluster" if request.param == "merged" else "separated")
    return found


def group_lag(cluster: Cluster, group: str) -> dict[int, int]:
    rows = cluster.admin("group", "describe", group)["queues"]
    return {r["queue"]: r["lag"] for r in rows if r["topic"] == TOPIC}


def test_available_now_reads_every_message_once_and_a_restart_only_new_ones(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    first = send(cluster, TOPIC, [f"first-{i}" for i in range(60)], tag="a", keys=("k1",))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, cluster, topics=TOPIC, startingOffsets="earliest", maxRecordsPerTrigger="25")
    query = run_available_now(df, out, checkpoint)
    assert len(query.recentProgress) >= 3, "60 messages at 25 per trigger take at least three batches"

    rows = spark.read.parquet(str(out))
    assert rows.columns == ARROW_SCHEMA.names
    got = rows.select("message_id", "queue_id", "queue_offset", "body", "tag", "keys", "broker", "object_key").collect()
    assert sorted(r["message_id"] for r in got) == sorted(first)
    assert {bytes(r["body"]).decode() for r in got} == {f"first-{i}" for i in range(60)}
    assert {(r["tag"], tuple(r["keys"]), r["broker"], r["object_key"]) for r in got} == {
        ("a", ("k1",), "broker-a", None)
    }
    per_queue: dict[int, list[int]] = {}
    for r in got:
        per_queue.setdefault(r["queue_id"], []).append(r["queue_offset"])
    assert all(sorted(v) == list(range(len(v))) for v in per_queue.values()), per_queue

    # The same checkpoint after more sends: only the new messages are read, and none twice. With
    # `group`, the query's progress becomes that group's offsets: its lag is the query's.
    second = send(cluster, TOPIC, [f"second-{i}" for i in range(40)])
    cluster.create_group("spark-lag")
    df = stream(spark, cluster, topics=TOPIC, startingOffsets="earliest", group="spark-lag")
    run_available_now(df, out, checkpoint)
    ids = [r["message_id"] for r in spark.read.parquet(str(out)).select("message_id").collect()]
    assert sorted(ids) == sorted(first + second)
    assert group_lag(cluster, "spark-lag") == {q: 0 for q in range(QUEUES)}
    send(cluster, TOPIC, [f"unread-{i}" for i in range(8)])
    assert sum(group_lag(cluster, "spark-lag").values()) == 8

    # A new query starting at the latest offsets reads nothing of what is there.
    fresh = tmp_path / "fresh"
    run_available_now(stream(spark, cluster, topics=TOPIC), fresh, tmp_path / "checkpoint-fresh")
    assert not list(fresh.glob("*.parquet")) or spark.read.parquet(str(fresh)).count() == 0


def tiered_rows(root: Path, topic: str) -> dict[str, dict[str, Any]]:
    """Every row of the topic's tiered segments in the file:// archive, by message id."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*.parquet")):
        if f"/{topic}/" not in path.as_posix():
            continue
        for row in pq.read_table(path).to_pylist():
            rows[row["message_id"]] = row
    return rows


def test_stream_rows_equal_the_tiered_rows_also_when_read_back_from_the_archive(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    topic = cluster.create_topic("stream-tiered", queues=2)
    ids = send(cluster, topic, [f"t-{i}" for i in range(30)], keys=("k",), properties={"p": "v"})
    cluster.admin("tier", "upload-now", topic)
    archived = tiered_rows(cluster.root / "objects", topic)
    assert sorted(archived) == sorted(ids)

    def read_all(name: str) -> dict[str, dict[str, Any]]:
        out = tmp_path / name
        run_available_now(
            stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, tmp_path / f"{name}-ck"
        )
        return {r["message_id"]: r for r in pq.read_table(out).to_pylist()}

    hot = read_all("hot")
    evicted = cluster.admin("tier", "evict-local", topic)  # the broker now answers these offsets from the archive
    assert sum(r["messages"] for r in evicted) == 30, evicted
    cold = read_all("cold")
    for mid, row in archived.items():
        assert comparable(hot[mid]) == comparable(row)
        assert comparable(cold[mid]) == comparable(row)


UNKNOWN_QUEUE = json.dumps({TOPIC: {"broker-z": {"0": 0}}})


@pytest.mark.parametrize(  # every option's checks: tests/unit/test_spark_stream_offsets.py
    ("options", "message"),
    [
        ({"topics": TOPIC}, "option namesrv is required"),
        ({"topics": TOPIC, "startingOffsets": "soon"}, "option startingOffsets 'soon'"),
        ({"topics": TOPIC, "startingOffsets": UNKNOWN_QUEUE}, "broker-z, which the cluster does not have"),
    ],
)
def test_bad_options_fail_when_the_query_starts(
    spark: SparkSession, cluster: Cluster, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    if "startingOffsets" in options:
        options = {"namesrv": cluster.namesrv, **options}
    df = spark.readStream.format("sluice").options(**options).load()
    with pytest.raises(Exception, match=re.escape(message)):
        query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


def test_a_recreated_topic_is_read_on_from_the_query_position_and_a_position_past_the_end_fails(
    spark: SparkSession, each: Cluster, tmp_path: Path
) -> None:
    """A topic deleted and created again keeps its queues' offsets (the brokers' stores still hold
    them), so the query's checkpoint reads on with what was sent since: nothing twice. A queue that
    now ends before the query's position (a lost tail, a broker's data replaced) fails the query,
    never a silent re-read or an empty stream."""
    cluster = each
    topic = cluster.create_topic("stream-recreated", queues=len(cluster.brokers))  # one queue per broker
    first = send(cluster, topic, [f"old-{i}" for i in range(4)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    run_available_now(stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, checkpoint)
    cluster.admin("topic", "delete", topic)
    cluster.create_topic(topic, queues=len(cluster.brokers))
    second = send(cluster, topic, [f"new-{i}" for i in range(3)])
    run_available_now(stream(spark, cluster, topics=topic, startingOffsets="earliest"), out, checkpoint)
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["message_id"] for r in rows) == sorted(first + second)  # each once

    broker = cluster.brokers[0]
    start = json.dumps({topic: {broker: {"0": 50}}})
    df = stream(spark, cluster, topics=topic, startingOffsets=start)
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "past")).start()
    try:
        with pytest.raises(Exception, match=rf"{topic} queue 0 on broker {broker} ends at offset \d+, before"):
            query.awaitTermination(60)
    finally:
        query.stop()


def test_the_sink_writes_each_row_once_and_a_replayed_batch_adds_no_duplicate(
    spark: SparkSession, each: Cluster, tmp_path: Path
) -> None:
    cluster = each
    # df.write: the columns become the messages' parts
    target = cluster.create_topic("sink-batch", queues=2)
    rows = [(f"w-{i}".encode(), [f"k{i}"], "t", {"n": str(i)}) for i in range(20)]
    df = spark.createDataFrame(rows, "body binary, keys array<string>, tag string, properties map<string,string>")
    df.write.format("sluice").option("namesrv", cluster.namesrv).option("topic", target).mode("append").save()
    written = read_topic(cluster, target)
    assert sorted((r["body"], r["keys"], r["tag"], dict(r["properties"])) for r in written) == sorted(
        (f"w-{i}".encode(), [f"k{i}"], "t", {"n": str(i)}) for i in range(20)
    )
    assert len({r["message_id"] for r in written}) == 20

    # A stream from one topic into another: the source's own rows are written as they are.
    source, copy = cluster.create_topic("sink-source", queues=2), cluster.create_topic("sink-copy", queues=3)
    send(cluster, source, [f"s-{i}" for i in range(30)], tag="x")
    checkpoint = tmp_path / "pipe-ck"

    def pipe() -> None:
        df = stream(spark, cluster, topics=source, startingOffsets="earliest")
        query = start_query(lambda: (
            df.writeStream.format("sluice").option("namesrv", cluster.namesrv).option("topic", copy)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        ))  # fmt: skip
        query.awaitTermination(120)
        assert not query.isActive and query.exception() is None, query.exception()

    pipe()
    first = read_topic(cluster, copy)
    assert sorted(bytes(r["body"]).decode() for r in first) == sorted(f"s-{i}" for i in range(30))
    assert {r["tag"] for r in first} == {"x"}

    # The batch wrote its messages but its commit is lost (killed between write and commit): the
    # restarted query replays it with the same ids, and the brokers store nothing twice.
    commits = sorted((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    pipe()
    assert len(list((checkpoint / "commits").glob("[0-9]*"))) == len(commits)  # the batch ran again
    again = read_topic(cluster, copy)
    assert sorted(r["message_id"] for r in again) == sorted(r["message_id"] for r in first)


def run_stream_job(spark: SparkSession, capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    """`sluice spark stream ... --json` in the tests' session; the totals it prints."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    lines: list[str] = []
    for attempt in range(3):  # as run_available_now: again if the source's Python process did not start in time
        try:
            assert cli.run(parser.parse_args(["stream", *argv, "--json"]), spark=spark, emit=lines.append) == 0
            break
        except InternalError as exc:
            if SPARK_STARTUP_FAILURE not in str(exc) or attempt == 2:  # a rerun of the checkpoint is the job's contract
                raise
            capsys.readouterr()
    assert lines[-1].startswith("done in"), lines
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"] == "stream"
    return list(doc["rows"])


def per_tag(rows: list[dict[str, Any]]) -> dict[tuple[str, str | None], int]:
    totals: dict[tuple[str, str | None], int] = {}
    for r in rows:
        assert datetime.fromisoformat(r["minute"]).second == 0, r  # whole UTC minutes
        totals[(r["topic"], r["tag"])] = totals.get((r["topic"], r["tag"]), 0) + r["messages"]
    return totals


def test_the_stream_job_keeps_minute_counts_and_a_rerun_adds_only_new_messages(
    spark: SparkSession, cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = cluster.create_topic("stream-counts", queues=2)
    send(cluster, topic, [f"a-{i}" for i in range(12)], tag="red")
    send(cluster, topic, [f"b-{i}" for i in range(5)])
    out, checkpoint = tmp_path / "counts", tmp_path / "counts-ck"
    flags = ("--namesrv", cluster.namesrv, "--topic", topic, "--output", str(out), "--checkpoint", str(checkpoint))
    first = run_stream_job(spark, capsys, *flags, "--max-records-per-trigger", "10")
    assert per_tag(first) == {(topic, "red"): 12, (topic, None): 5}
    assert len(list(out.glob("batch_id=*"))) >= 2, "17 messages at 10 per trigger take two batches"

    # A rerun on the same checkpoint reads only what was sent since: counts grow by exactly that.
    send(cluster, topic, [f"c-{i}" for i in range(7)], tag="red")
    send(cluster, topic, [f"d-{i}" for i in range(3)], tag="blue")
    second = run_stream_job(spark, capsys, *flags)
    assert per_tag(second) == {(topic, "red"): 19, (topic, None): 5, (topic, "blue"): 3}

    # Killed between writing a batch and committing it: the rerun replays that batch, which
    # replaces its own part of the table instead of adding to it.
    commits = sorted((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    assert per_tag(run_stream_job(spark, capsys, *flags)) == per_tag(second)


def test_starting_timestamp_skips_older_messages_and_available_now_never_waits_for_min_records_properties_off(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    topic = cluster.create_topic("stream-since", queues=2)
    send(cluster, topic, [f"old-{i}" for i in range(6)])
    since = int(time.time() * 1000)  # after the first send returned: those are stored before it
    time.sleep(0.01)
    new = send(cluster, topic, [f"new-{i}" for i in range(5)], properties={"p": "v"})
    df = stream(
        spark, cluster, topics=topic, startingTimestamp=str(since), minRecordsPerTrigger="1000",
        includeProperties="false",
    )  # fmt: skip
    run_available_now(df, tmp_path / "since", tmp_path / "since-ck")
    got = pq.read_table(tmp_path / "since").to_pylist()
    assert sorted(r["message_id"] for r in got) == sorted(new)
    assert {(r["properties"], r["system_properties"]) for r in got} == {(None, None)}


def test_tiering_and_a_queue_added_between_runs_of_one_query_keep_every_message_exactly_once(
    spark: SparkSession, each: Cluster, tmp_path: Path
) -> None:
    """One checkpointed query, three AvailableNow runs: the messages of the second run were tiered
    (`upload-now`) and their local copies dropped (`evict-local`) before it read them, so the broker
    reads them back from the archive; before the third, the topic got a third queue, which the query
    reads from its oldest message."""
    cluster = each
    topic = cluster.create_topic("stream-moving", queues=2)
    out, checkpoint = tmp_path / "moving", tmp_path / "moving-ck"

    def run() -> list[dict[str, Any]]:
        df = stream(spark, cluster, topics=topic, startingOffsets="earliest", maxRecordsPerTrigger="7")
        run_available_now(df, out, checkpoint)
        return pq.read_table(out).to_pylist()

    first = send(cluster, topic, [f"hot-{i}" for i in range(10)])
    assert sorted(r["message_id"] for r in run()) == sorted(first)

    second = send(cluster, topic, [f"cold-{i}" for i in range(12)])
    cluster.admin("tier", "upload-now", topic)
    evicted = cluster.admin("tier", "evict-local", topic)
    assert sum(r["messages"] for r in evicted) == 22, evicted  # the unread messages are now only in the bucket
    assert sorted(r["message_id"] for r in run()) == sorted(first + second)

    cluster.admin("topic", "create", topic, "--queues", "3", "--update")
    third = send(cluster, topic, [f"grown-{i}" for i in range(12)])
    rows = run()
    assert sorted(r["message_id"] for r in rows) == sorted(first + second + third)  # each once
    per_queue: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        per_queue.setdefault((r["broker"], r["queue_id"]), []).append(r["queue_offset"])
    assert len(per_queue) == 3, "the added queue was read"  # --queues counts the queues of every broker
    assert all(sorted(v) == list(range(len(v))) for v in per_queue.values()), per_queue


def test_a_topic_on_two_brokers_is_read_once_and_written_once(
    spark: SparkSession, separated: Cluster, tmp_path: Path
) -> None:
    """Separated: offsets per (topic, broker, queue); the sink spreads its rows over both brokers."""
    cluster = separated
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
