"""`sluice spark` jobs over a real archive in a real local Spark: each output equals what was produced.

topic-stats counts per hour (and writes Parquet), trace finds a key and an id across topics in
order with their locations, export writes a date-partitioned dataset locally and to S3 that pyarrow
reads back row for row; the command-line wiring refuses bad input before Spark starts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import zipfile
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

import spark_jobs
import spark_jobs.package
from common.errors import BadRequest, NotFound
from sluice.main import main as sluice_main
from spark_jobs import cli
from tests.helpers.spark_data import AUDIT, BASE_MS, HOUR_MS, ORDERS, SHARED_KEY, SHORT_JVM_OPTIONS, Archive

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow
SUBMIT_TIMEOUT_S = 300.0


def run_job(spark: SparkSession, archive: Archive, argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([argv[0], *archive.flags(), "--json", *argv[1:]])
    progress: list[str] = []
    capsys.readouterr()
    assert cli.run(args, spark=spark, emit=progress.append) == 0
    assert progress[0].startswith("planned: ") and progress[-1].startswith("done in ")
    return json.loads(capsys.readouterr().out)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None).isoformat()


def test_topic_stats_per_hour_match_what_was_produced(
    spark: SparkSession, archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stats"
    doc = run_job(spark, archive, ["topic-stats", "--topic", ORDERS, "--topic", AUDIT, "--output", str(out)], capsys)
    groups: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for p in archive.produced:
        groups[(p.topic, p.store_ms // HOUR_MS * HOUR_MS)].append(p)
    want = [
        {
            "topic": topic,
            "window_start": iso(hour),
            "messages": len(ps),
            "bytes": sum(len(p.body) for p in ps),
            "distinct_keys": len({k for p in ps for k in p.keys}),
            "message_groups": len({p.message_group for p in ps if p.message_group is not None}),
        }
        for (topic, hour), ps in sorted(groups.items())
    ]
    assert doc["rows"] == want and len(want) == 8
    written = pq.read_table(out / "topic-stats.parquet").to_pylist()
    assert [(r["topic"], r["messages"]) for r in written] == [(r["topic"], r["messages"]) for r in want]
    minutes = run_job(spark, archive, ["topic-stats", "--topic", AUDIT, "--granularity", "minute"], capsys)
    assert [r["messages"] for r in minutes["rows"]] == [5, 5]


def test_trace_finds_keys_and_ids_across_topics_in_order(
    spark: SparkSession, archive: Archive, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_job(spark, archive, ["trace", "--key", SHARED_KEY, "--message-id", "orders-5-7"], capsys)
    hits = [p for p in archive.produced if SHARED_KEY in p.keys or p.message_id == "orders-5-7"]
    hits.sort(key=lambda p: (p.store_ms, p.topic, p.broker, p.queue_id, p.queue_offset))
    assert [(r["message_id"], r["topic"], r["broker"], r["queue_id"], r["queue_offset"]) for r in doc["rows"]] == [
        (p.message_id, p.topic, p.broker, p.queue_id, p.queue_offset) for p in hits
    ]
    assert {r["topic"] for r in doc["rows"]} == {ORDERS, AUDIT} and len(hits) == 3
    assert all(r["tier"] == "archive" and r["object_key"].endswith(".parquet") for r in doc["rows"])
    nothing = run_job(spark, archive, ["trace", "--key", "never-used"], capsys)
    assert nothing["rows"] == []


def _by_date(archive: Archive, lo: int, hi: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for p in archive.produced:
        if p.topic == ORDERS and lo <= p.store_ms < hi:
            out[datetime.fromtimestamp(p.store_ms / 1000, UTC).date().isoformat()].append(p.message_id)
    return {d: sorted(ids) for d, ids in out.items()}


def test_export_writes_a_date_partitioned_dataset(
    spark: SparkSession, archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lo, hi = BASE_MS + 1 * HOUR_MS, BASE_MS + 5 * HOUR_MS
    want = _by_date(archive, lo, hi)
    assert len(want) == 2  # the range crosses midnight UTC
    dest = tmp_path / "export"
    argv = ["export", "--topic", ORDERS, "--from", str(lo), "--to", str(hi), "--output", str(dest)]
    doc = run_job(spark, archive, argv, capsys)
    assert sum(r["rows"] for r in doc["rows"]) == sum(len(v) for v in want.values())
    assert (dest / "_SUCCESS").exists()
    table = ds.dataset(dest, format="parquet", partitioning="hive").to_table(columns=["date", "message_id"])
    got: dict[str, list[str]] = defaultdict(list)
    for row in table.to_pylist():
        got[str(row["date"])].append(row["message_id"])
    assert {d: sorted(v) for d, v in got.items()} == want

    with pytest.raises(BadRequest, match=r"already holds .* --overwrite"):
        run_job(spark, archive, argv, capsys)
    run_job(spark, archive, [*argv, "--overwrite"], capsys)
    assert ds.dataset(dest, format="parquet", partitioning="hive").count_rows() == table.num_rows

    s3_url = f"s3://{archive.config.bucket}/exports/orders"
    run_job(spark, archive, [*argv[:-1], s3_url], capsys)
    client = archive.server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=archive.config.bucket, Prefix="exports/")["Contents"]]
    assert "exports/orders/_SUCCESS" in keys
    rows = 0
    for key in keys:
        if key.endswith(".parquet"):
            assert key.split("/")[2].removeprefix("date=") in want
            body = client.get_object(Bucket=archive.config.bucket, Key=key)["Body"].read()
            rows += pq.read_table(io.BytesIO(body)).num_rows
    assert rows == table.num_rows


def test_empty_range_gives_empty_results(
    spark: SparkSession, archive: Archive, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_job(
        spark, archive, ["topic-stats", "--topic", ORDERS, "--from", "2001-01-01", "--to", "2001-01-02"], capsys
    )
    assert doc["rows"] == []


def test_command_line_refuses_bad_input_before_spark(
    archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = archive.flags()
    assert sluice_main(["spark", "topic-stats", *flags, "--topic", "missing-topic"]) == 2
    assert "missing-topic have no tiered data" in capsys.readouterr().err
    bucket_at = flags.index("--s3-bucket") + 1
    bad_bucket = [*flags[:bucket_at], "no-such-bucket", *flags[bucket_at + 1 :]]
    assert sluice_main(["spark", "trace", *bad_bucket, "--key", "k"]) == 2
    assert "bucket 'no-such-bucket' does not exist" in capsys.readouterr().err
    assert sluice_main(["spark", "trace", *flags]) == 2
    assert "at least one --key or --message-id" in capsys.readouterr().err
    assert sluice_main(["spark", "export", *flags, "--topic", ORDERS, "--from", "later", "--output", "x"]) == 2
    assert "option from 'later' is not a time" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(NotFound):
        cli.run(parser.parse_args(["trace", *flags, "--topic", "nope", "--key", "k"]))


def test_package_holds_what_executors_import(tmp_path: Path) -> None:
    assert sluice_main(["spark", "package", "--output", str(tmp_path / "sluice-spark.zip")]) == 0
    names = zipfile.ZipFile(tmp_path / "sluice-spark.zip").namelist()
    assert {"spark_jobs/source.py", "spark_jobs/scan.py", "common/errors.py"} <= set(names)
    # Of the broker, only the tiered format and S3 access the source shares with it, and the
    # broker's client side (the streaming source reads from brokers).
    broker = {n for n in names if n.startswith("broker/")}
    assert {n for n in broker if not n.startswith("broker/client/")} == set(spark_jobs.package.MODULES)
    assert {"broker/client/remote.py", "nameserver/client.py", "proto/rpc.py"} <= set(names)


def test_spark_submit_runs_a_job_from_the_package(archive: Archive, tmp_path: Path) -> None:
    """spark-submit with only the zip on the Python path (as on a cluster): the job's answer is right.

    The cheapest job that still reads the archive end to end (export: one scan, no shuffle) on the
    small topic, one local core, and a JVM tuned for a short run (C1 JIT only, serial GC): this test
    pays for a second JVM, so it keeps that JVM's work to a minimum."""
    package = tmp_path / "sluice-spark.zip"
    assert sluice_main(["spark", "package", "--output", str(package)]) == 0
    script = tmp_path / "submit.py"  # outside the repository, so imports resolve from the zip
    script.write_text((Path(spark_jobs.__file__).parent / "submit.py").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_GATEWAY_PORT")}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    submit = Path(sys.executable).parent / "spark-submit"
    dest = tmp_path / "export"
    argv = [str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
            "--driver-java-options", SHORT_JVM_OPTIONS, "--py-files", str(package), str(script),
            "export", *archive.flags(), "--topic", AUDIT, "--output", str(dest), "--json"]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit merges the Python driver's stderr (progress lines) into its stdout.
    doc = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    want = sorted(p.message_id for p in archive.produced if p.topic == AUDIT)
    assert sum(r["rows"] for r in doc["rows"]) == len(want) == 10
    assert (dest / "_SUCCESS").exists()
    table = ds.dataset(dest, format="parquet", partitioning="hive").to_table(columns=["message_id"])
    assert sorted(table.column("message_id").to_pylist()) == want
    assert "planned: " in done.stdout + done.stderr
