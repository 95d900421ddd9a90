"""The `sluice spark` jobs over what the official Python client produced (issue #8), merged topology.

One `sluice up` tiering into a moto S3 server: known messages (several keys, tags, properties, two
topics of one queue each) are produced through the official client, `sluice admin tier upload-now`
puts each topic in the bucket, and the real `sluice spark` CLI (a local[2] SparkSession) runs as a
subprocess three times: topic-stats (--json), trace (--key, repeated) and export (to a directory
read back with pyarrow). Each output must equal what was produced: counts per UTC hour, the traced
messages with their ids in store order, the exported rows' ids, bodies, keys, tags and properties.

The jobs run in child processes: this process holds the official client's protobuf modules, and a
child keeps the JVM and pyspark out of it. Store times are bracketed by the wall clock around each
synchronous send (the broker runs on this machine, same clock), which is all the hour counts and
the order need; sends are spaced by a couple of milliseconds so no two store times tie.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pyarrow.dataset as ds
import pytest

from tests.e2e.support.clients import message, producer
from tests.e2e.support.cluster import Cluster, start_merged
from tests.helpers.procs import LOOPBACK, REPO_ROOT, ChildProcess, free_port, start_process

pytestmark = pytest.mark.slow

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
PREFIX = "e2e-spark"
TOPICS = ("orders", "audit")
PER_TOPIC = {"orders": 24, "audit": 9}
TRACED_KEYS = ("shared-key", "order-7")
SPARK_TIMEOUT_S = 600.0  # a JVM start and a small job on a loaded 2-core machine
HOUR_BOUNDARY_GUARD_S = 90.0  # produce after the hour turns rather than straddle it
SEND_SPACING_S = 0.002  # so consecutive store times (milliseconds) never tie
# The job's JVM lives for seconds: C1 JIT only and the serial GC (as tests/helpers/spark_data.py).
SHORT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CONFIG = f"""
[broker.store.commitlog]
segment_bytes = {16 << 10}

[broker.tiering]
region = "{REGION}"
addressing_style = "path"
connect_timeout_s = 5.0
read_timeout_s = 10.0
max_attempts = 2
segment_target_bytes = 4096
row_group_rows = 8
"""


@dataclass(frozen=True)
class Sent:
    topic: str
    message_id: str
    body: bytes
    keys: tuple[str, ...]  # the client keeps a message's keys as a set: compare them sorted
    tag: str
    properties: dict[str, str]
    after_ms: int  # wall clock just before the send: the store time is at or after this
    before_ms: int  # wall clock just after the reply: the store time is at or before this

    @property
    def hour(self) -> str:
        start = self.after_ms // 3_600_000 * 3_600_000
        return datetime.fromtimestamp(start / 1000, UTC).replace(tzinfo=None).isoformat()


@dataclass(frozen=True)
class Produced:
    cluster: Cluster
    bucket: str
    endpoint: str
    sent: tuple[Sent, ...]

    def spark(self, tmp: Path, *args: str) -> Any:
        """Run `sluice spark JOB ... --json` in a child process; its parsed JSON document."""
        job, *rest = args
        argv = [sys.executable, "-m", "sluice", "spark", job, "--s3-endpoint", self.endpoint,
                "--s3-bucket", self.bucket, "--s3-prefix", PREFIX, "--s3-region", REGION,
                "--s3-addressing-style", "path", "--master", "local[2]", "--progress-interval", "0", "--json",
                *rest]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "SPARK_HOME")}
        env.update(PYTHONPATH=str(REPO_ROOT), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   PYSPARK_SUBMIT_ARGS=f"--driver-java-options '{SHORT_JVM_OPTIONS}' pyspark-shell")  # fmt: skip
        done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=SPARK_TIMEOUT_S,
                              check=False)  # fmt: skip
        assert done.returncode == 0, f"sluice spark {job} exited {done.returncode}:\n{done.stderr[-4000:]}"
        assert "planned: " in done.stderr
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server child process; the broker gets the credentials through the environment."""
    port = free_port()
    root = tmp_path_factory.mktemp("moto")
    child: ChildProcess = start_process(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
        port=port, log_path=root / "moto.log", name="moto-s3",
    )  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        child.stop()


def _wait_past_hour_boundary() -> None:
    """If the UTC hour ends within the guard, wait for it: every message then lands in one known hour."""
    left = 3600.0 - time.time() % 3600.0
    if left < HOUR_BOUNDARY_GUARD_S:
        time.sleep(left + 1.0)


def _messages() -> list[tuple[str, bytes, tuple[str, ...], str, dict[str, str]]]:
    """(topic, body, keys, tag, properties) in send order; the two topics interleave."""
    out = []
    for i in range(max(PER_TOPIC.values())):
        for t, topic in enumerate(TOPICS):
            if i >= PER_TOPIC[topic]:
                continue
            keys = (f"{topic[:-1]}-{i}", f"bucket-{i % 4}")
            if (t, i) in ((0, 3), (1, 5), (0, 20)):
                keys += ("shared-key",)
            body = (f"{topic} #{i} " + "payload " * (i % 7)).encode()
            props = {"seq": str(i), "lang": "ünïcode", "parity": "even" if i % 2 == 0 else "odd"}
            out.append((topic, body, keys, "TagA" if i % 3 else "TagB", props))
    return out


@pytest.fixture(scope="module")
def produced(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Produced]:
    root = tmp_path_factory.mktemp("spark-e2e")
    bucket = f"sluice-spark-e2e-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                 aws_secret_access_key=SECRET_KEY).create_bucket(Bucket=bucket)  # fmt: skip
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    flags = ["--config", str(config), "--s3-endpoint", moto_endpoint, "--s3-bucket", bucket,
             "--s3-prefix", PREFIX, "--tier-min-age", "3600"]  # fmt: skip
    cluster = start_merged(root, extra_args=flags)
    try:
        for topic in TOPICS:
            cluster.admin("topic", "create", topic, "--queues", "1")
        _wait_past_hour_boundary()
        sent: list[Sent] = []
        with producer(cluster.endpoints, *TOPICS) as p:
            for topic, body, keys, tag, props in _messages():
                time.sleep(SEND_SPACING_S)
                after = time.time_ns() // 1_000_000
                receipt = p.send(message(topic, body, tag=tag, keys=keys, properties=props))
                before = -(-time.time_ns() // 1_000_000)
                sent.append(Sent(topic, receipt.message_id, body, keys, tag, props, after, before))
        for topic in TOPICS:
            (uploaded,) = cluster.admin("tier", "upload-now", topic)
            assert uploaded["lag_messages"] == 0
            assert [(q["tiered_min"], q["tiered_end"]) for q in uploaded["queues"]] == [(0, PER_TOPIC[topic])]
        yield Produced(cluster, bucket, moto_endpoint, tuple(sent))
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def _ms(when: str | datetime) -> int:
    """Epoch milliseconds of a UTC time as the jobs give it (ISO text in JSON, naive or UTC datetime)."""
    moment = datetime.fromisoformat(when) if isinstance(when, str) else when
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def test_topic_stats_count_what_was_produced_per_hour(produced: Produced, tmp_path: Path) -> None:
    doc = produced.spark(tmp_path, "topic-stats", *[a for t in TOPICS for a in ("--topic", t)])
    hours = {ms // 3_600_000 for s in produced.sent for ms in (s.after_ms, s.before_ms)}
    assert len(hours) == 1  # the boundary guard held: every store time is in one known hour
    want = []
    for topic in sorted(TOPICS):
        mine = [s for s in produced.sent if s.topic == topic]
        want.append({
            "topic": topic, "window_start": mine[0].hour, "messages": len(mine),
            "bytes": sum(len(s.body) for s in mine), "distinct_keys": len({k for s in mine for k in s.keys}),
            "message_groups": 0,
        })  # fmt: skip
    assert doc["rows"] == want
    assert [r["messages"] for r in doc["rows"]] == [PER_TOPIC["audit"], PER_TOPIC["orders"]]


def test_trace_finds_the_keys_across_topics_in_store_order(produced: Produced, tmp_path: Path) -> None:
    doc = produced.spark(tmp_path, "trace", *[a for k in TRACED_KEYS for a in ("--key", k)])
    hits = [s for s in produced.sent if set(TRACED_KEYS) & set(s.keys)]  # send order is store order
    assert len(hits) == 4 and {s.topic for s in hits} == set(TOPICS)
    rows = doc["rows"]
    assert [(r["message_id"], r["topic"], sorted(r["keys"]), r["tag"]) for r in rows] == [
        (s.message_id, s.topic, sorted(s.keys), s.tag) for s in hits
    ]
    offsets = {s.message_id: [x.message_id for x in produced.sent if x.topic == s.topic].index(s.message_id)
               for s in hits}  # fmt: skip
    for r, s in zip(rows, hits, strict=True):
        assert s.after_ms <= _ms(r["store_timestamp"]) <= s.before_ms
        assert (r["broker"], r["queue_id"], r["queue_offset"]) == ("broker-a", 0, offsets[s.message_id])
        assert r["tier"] == "archive" and r["object_key"].startswith(f"{PREFIX}/") and f"/{s.topic}/" in r["object_key"]


def test_export_rows_are_the_produced_messages(produced: Produced, tmp_path: Path) -> None:
    dest = tmp_path / "export"
    doc = produced.spark(tmp_path, "export", "--topic", "orders", "--output", str(dest))
    orders = [s for s in produced.sent if s.topic == "orders"]
    assert sum(r["rows"] for r in doc["rows"]) == len(orders)
    assert (dest / "_SUCCESS").exists()
    table = ds.dataset(dest, format="parquet", partitioning="hive").to_table()
    rows = sorted(table.to_pylist(), key=lambda r: r["queue_offset"])
    assert [r["queue_offset"] for r in rows] == list(range(len(orders)))
    got = [(r["message_id"], r["topic"], bytes(r["body"]), r["body_gzip"], sorted(r["keys"]), r["tag"],
            dict(r["properties"])) for r in rows]  # fmt: skip
    assert got == [(s.message_id, "orders", s.body, False, sorted(s.keys), s.tag, s.properties) for s in orders]
    dates = Counter(str(r["date"]) for r in rows)
    assert dates == {datetime.fromtimestamp(orders[0].after_ms / 1000, UTC).date().isoformat(): len(orders)}
    for r, s in zip(rows, orders, strict=True):
        assert s.after_ms <= _ms(r["store_timestamp"]) <= s.before_ms
