"""The streaming source over hot and cold data in one range, against a real `sluice up` tiering to a
moto S3 bucket and a real local Spark:

- with the archive options, a queue range is split at what the manifest holds: the tiered part is
  read from Parquet by the executors (`object_key` names the object), the rest through the broker,
  and every row equals the one the broker alone gives for that (queue, offset); an object deleted
  from the bucket is read through the broker instead;
- a query over a topic being produced to and tiered (`upload-now`, `evict-local`) at the same time,
  which gets a queue more meanwhile, and whose first run loses a task mid-batch (`testFaultFile`), is
  restarted from its checkpoint: its Parquet sink holds every produced message exactly once, in both
  topologies (`sluice up`; a NameServer, broker-a, broker-b and two proxies);
- `maxBytesPerTrigger` splits a backlog into batches by bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from broker.client.remote import RemoteBroker
from spark_jobs.stream.discovery import discover
from spark_jobs.stream.options import StreamOptions
from tests.e2e.support.clients import message, producer
from tests.e2e.support.cluster import Cluster, start_merged, start_separated
from tests.helpers.spark_stream import comparable, run_available_now, send, sink_rows, start_query, stream

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow

ACCESS_KEY = SECRET_KEY = "testing"  # moto's (tests/helpers/s3.py; not imported: it is a pytest plugin)
REGION = "us-east-1"
CONFIG = f"""
[broker.store.commitlog]
segment_bytes = {16 << 10}

[broker.tiering]
region = "{REGION}"
addressing_style = "path"
max_attempts = 2
segment_target_bytes = 4096
row_group_rows = 8
"""


class Tiered:
    def __init__(self, cluster: Cluster, s3: MotoS3Server, bucket: str) -> None:
        self.cluster, self.s3, self.bucket = cluster, s3, bucket

    def archive(self) -> dict[str, str]:
        """The source's archive options (the batch source's)."""
        return {"endpoint": self.s3.endpoint_url, "bucket": self.bucket, "addressingStyle": "path",
                "accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY, "region": REGION}  # fmt: skip

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.s3.endpoint_url, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)  # fmt: skip

    def segments(self, topic: str) -> list[str]:
        listing = self.client().list_objects_v2(Bucket=self.bucket, Prefix="sluice/")
        return sorted(
            o["Key"] for o in listing.get("Contents", []) if f"/{topic}/" in o["Key"] and "parquet" in o["Key"]
        )


@contextlib.contextmanager
def tiered_cluster(s3: MotoS3Server, root: Path, kind: str) -> Iterator[Tiered]:
    """A cluster of `kind` (merged: `sluice up`; separated: NameServer, broker-a, broker-b, two
    proxies) whose brokers tier to a fresh bucket of the moto server; stopped on exit."""
    bucket = f"stream-tiers-{kind}-{uuid.uuid4().hex[:8]}"
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    t = Tiered(None, s3, bucket)  # type: ignore[arg-type]
    t.client().create_bucket(Bucket=bucket)
    flags = ["--s3-endpoint", s3.endpoint_url, "--s3-bucket", bucket, "--tier-min-age", "3600"]
    with pytest.MonkeyPatch.context() as env:  # the brokers' credentials, restored afterwards
        env.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        env.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        if kind == "merged":
            t.cluster = start_merged(root, extra_args=["--config", str(config), *flags])
        else:
            t.cluster = start_separated(root, config=config, broker_args=flags)
        try:
            yield t
        finally:
            problems = t.cluster.stop()
            assert not problems, problems


@pytest.fixture(scope="module")
def tiered(s3_server: MotoS3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    with tiered_cluster(s3_server, tmp_path_factory.mktemp("stream-tiers"), "merged") as t:
        yield t


@pytest.fixture(scope="module")
def tiered_separated(s3_server: MotoS3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    with tiered_cluster(s3_server, tmp_path_factory.mktemp("stream-tiers-separated"), "separated") as t:
        yield t


@pytest.fixture(params=["merged", "separated"])
def each(request: pytest.FixtureRequest) -> Tiered:
    """The test once per topology, on the module's clusters."""
    found: Tiered = request.getfixturevalue("tiered" if request.param == "merged" else "tiered_separated")
    return found


def by_id(path: Path) -> dict[str, dict[str, Any]]:
    rows = pq.read_table(path).to_pylist()
    found = {r["message_id"]: r for r in rows}
    assert len(found) == len(rows), "a message came twice"
    return found


def test_a_range_split_at_the_archive_gives_the_brokers_rows_and_a_deleted_object_falls_back(
    spark: SparkSession, tiered: Tiered, tmp_path: Path
) -> None:
    cluster = tiered.cluster
    topic = cluster.create_topic("tiers-split", queues=2)
    cold = send(cluster, topic, [f"cold-{i}-" + "x" * (i % 9) for i in range(40)], keys=("k",), properties={"p": "v"})
    cluster.admin("tier", "upload-now", topic)
    hot = send(cluster, topic, [f"hot-{i}" for i in range(25)], tag="h")

    def read(name: str, **options: str) -> dict[str, dict[str, Any]]:
        df = stream(spark, cluster, topics=topic, startingOffsets="earliest", **options)
        run_available_now(df, tmp_path / name, tmp_path / f"{name}-ck")
        return by_id(tmp_path / name)

    brokers_only = read("brokers")
    split = read("split", **tiered.archive())
    assert sorted(split) == sorted(brokers_only) == sorted(cold + hot)
    for mid, row in split.items():
        assert comparable(row) == comparable(brokers_only[mid]), mid
    assert {mid for mid, r in split.items() if r["object_key"] is not None} == set(cold), "tiered rows from Parquet"
    assert {r["object_key"] for r in brokers_only.values()} == {None}

    # One object gone from the bucket (the manifest still lists it): its messages come through the
    # broker (which still has its local copy), the others still from Parquet; the rows are the same.
    objects = tiered.segments(topic)
    assert len(objects) >= 2, objects
    tiered.client().delete_object(Bucket=tiered.bucket, Key=objects[0])
    fallback = read("fallback", **tiered.archive())
    assert sorted(fallback) == sorted(cold + hot)
    for mid, row in fallback.items():
        assert comparable(row) == comparable(brokers_only[mid]), mid
    keys = {r["object_key"] for r in fallback.values()}
    assert objects[0] not in keys and set(objects[1:]) <= keys


def test_producing_and_tiering_during_a_query_with_a_failed_task_and_a_restart_store_each_message_once(
    spark: SparkSession, each: Tiered, tmp_path: Path
) -> None:
    tiered, cluster = each, each.cluster
    topic = cluster.create_topic("tiers-live", queues=3)
    out, checkpoint, fault = tmp_path / "out", tmp_path / "ck", tmp_path / "fault"
    sent: list[str] = send(cluster, topic, [f"early-{i}" for i in range(30)])
    cluster.admin("tier", "upload-now", topic)
    failures: list[BaseException] = []
    opts = StreamOptions(namesrv=(cluster.namesrv,), topics=frozenset({topic}))
    brokers = {key.broker: r.address for key, r in discover(opts).items()}
    assert sorted(brokers) == sorted(cluster.brokers)

    async def tier(evict: bool) -> None:
        for name, address in sorted(brokers.items()):
            broker = RemoteBroker(name, address, timeout_s=60)
            try:
                await broker.tier_upload_now(topic, 60)
                if evict:
                    await broker.tier_evict_local(topic)  # the broker reads these back from the bucket
            finally:
                await broker.close()

    def produce_and_tier() -> None:  # in-process (the official client, one gRPC channel): a light load
        try:
            with producer(cluster.endpoints, topic) as p:
                for round_ in range(4):
                    for i in range(25):
                        sent.append(p.send(message(topic, f"live-{round_}-{i}".encode())).message_id)
                    asyncio.run(tier(evict=round_ % 2 == 1))
                    if round_ == 1:  # a queue added while the query runs, read from its oldest message
                        cluster.admin("topic", "create", topic, "--queues", "4", "--update")
                        sent.extend(send(cluster, topic, [f"grown-{i}" for i in range(8)]))
        except BaseException as exc:
            failures.append(exc)

    def query(**extra: str) -> Any:
        df = stream(spark, cluster, topics=topic, startingOffsets="earliest", maxRecordsPerTrigger="20",
                    **tiered.archive(), **extra)  # fmt: skip
        return start_query(lambda: (
            df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="500 milliseconds").start()
        ))  # fmt: skip

    live = threading.Thread(target=produce_and_tier, name="produce-and-tier")
    live.start()
    try:
        first = query(testFaultFile=str(fault))  # its first task that reads rows fails mid-batch
        with pytest.raises(Exception, match="injected executor failure"):
            first.awaitTermination(120)
        assert not first.isActive and fault.exists()
        second = query()  # restarted from the checkpoint while the topic still grows
        wait_for_batches(second, 2)
        second.stop()
    finally:
        live.join(180)
    assert not live.is_alive(), "producing and tiering did not finish"
    assert not failures, failures
    assert len(sent) == 138
    run_available_now(
        stream(spark, cluster, topics=topic, startingOffsets="earliest", **tiered.archive()), out, checkpoint
    )
    # Through the sink's log (`_spark_metadata`), as any reader of a Spark file sink: a task of the
    # failed batch that finished after the batch was aborted leaves a file no batch committed.
    rows = sink_rows(spark, out)
    assert len(rows) == len(sent), "every message exactly once"
    assert sorted(r["message_id"] for r in rows) == sorted(sent)
    assert any(r["object_key"] is not None for r in rows), "part of it came from the archive"
    # --queues counts every broker's queues (separated: 2 + 1, then 2 + 2)
    assert len({(r["broker"], r["queue_id"]) for r in rows}) == 4, "the added queue was read"
    assert {r["broker"] for r in rows} == set(cluster.brokers)


def wait_for_batches(query: Any, count: int, timeout_s: float = 120.0) -> None:
    """Until the running query has completed `count` more micro-batches; fails if it stopped."""
    seen = len(query.recentProgress)
    deadline = time.monotonic() + timeout_s
    while len(query.recentProgress) < seen + count:
        assert query.isActive, f"the query stopped: {query.exception()}"
        assert time.monotonic() < deadline, f"the query made no progress in {timeout_s} s"
        time.sleep(0.1)


def test_max_bytes_per_trigger_spreads_a_backlog_over_batches(
    spark: SparkSession, tiered: Tiered, tmp_path: Path
) -> None:
    cluster = tiered.cluster
    topic = cluster.create_topic("tiers-bytes", queues=2)
    ids = send(cluster, topic, ["b" * 500 + str(i) for i in range(40)])
    df = stream(spark, cluster, topics=topic, startingOffsets="earliest", maxBytesPerTrigger=str(10 * 600))
    query = run_available_now(df, tmp_path / "bytes", tmp_path / "bytes-ck")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 40 and len(sizes) >= 3, sizes  # about 10 messages of ~600 stored bytes per batch
    assert sorted(by_id(tmp_path / "bytes")) == sorted(ids)
