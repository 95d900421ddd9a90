"""The Spark source's options, filter pushdown narrowing and manifest pruning, without Spark or S3."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan, StringStartsWith

from broker.tiering.format import manifest_key, parse_manifest
from common.config import ConfigError
from common.errors import BadRequest, MessageCorrupted
from spark_jobs import cli
from spark_jobs.options import ScanOptions, parse_time
from spark_jobs.planner import pack, segment_inside, segment_overlaps, tasks_for
from spark_jobs.source import narrow_options

BASE = {"bucket": "b", "endpoint": "http://127.0.0.1:1"}


def opts(**extra: str) -> ScanOptions:
    return ScanOptions.parse({**BASE, **extra})


def test_times_parse_as_iso_or_epoch_ms() -> None:
    assert parse_time("1717200000000", "from") == 1_717_200_000_000
    assert parse_time("2024-06-01T00:00:00Z", "from") == 1_717_200_000_000
    assert parse_time("2024-06-01T02:00:00+02:00", "from") == 1_717_200_000_000
    assert parse_time("2024-06-01", "from") == 1_717_200_000_000  # no zone = UTC
    with pytest.raises(BadRequest, match="option to 'noon' is not a time"):
        parse_time("noon", "to")


def test_options_are_checked_and_name_the_option() -> None:
    o = opts(topic="a,b", topicPattern="x-.*", queues="1,2", FROM="2024-06-01T00:00:00Z", keys="k1")
    assert o.topics == {"a", "b"} and o.queues == {1, 2} and o.keys == {"k1"} and o.from_ms == 1_717_200_000_000
    assert [o.wants_topic(t) for t in ("a", "x-1", "c")] == [True, True, False]
    assert opts().wants_topic("anything") and opts().queues is None and opts().to_offset == (1 << 63) - 1
    with pytest.raises(BadRequest, match="option bucket is required"):
        ScanOptions.parse({"topic": "t"})
    with pytest.raises(BadRequest, match="time range is reversed"):
        opts(**{"from": "2000", "to": "1000"})
    with pytest.raises(BadRequest, match="offset range is reversed"):
        opts(fromOffset="5", toOffset="1")
    with pytest.raises(BadRequest, match="option topicPattern"):
        opts(topicPattern="(")
    with pytest.raises(BadRequest, match="option queues must be a whole number"):
        opts(queues="one")


def test_pushed_filters_only_narrow() -> None:
    at = datetime(2024, 6, 1, 1, tzinfo=UTC)
    o = narrow_options(
        opts(topic="a,b", queues="1,2"),
        [
            EqualTo(("topic",), "a"), In(("queue_id",), (2, 3)), GreaterThanOrEqual(("store_timestamp",), at),
            LessThan(("queue_offset",), 10), StringStartsWith(("tag",), "x"), EqualTo(("broker",), "b1"),
        ],
    )  # fmt: skip
    assert o.only_topics == {"a"} and o.wants_topic("a") and not o.wants_topic("b")
    assert o.queues == {2} and o.brokers == {"b1"}
    assert o.from_ms == 1_717_203_600_000 and o.to_offset == 11  # prune-only bounds are inclusive-safe
    naive = narrow_options(opts(), [GreaterThanOrEqual(("store_timestamp",), datetime(2024, 6, 1))])
    assert naive.from_ms == 0  # no zone, no instant: not used to prune
    contradictory = narrow_options(opts(), [EqualTo(("queue_offset",), 5), GreaterThanOrEqual(("queue_offset",), 9)])
    assert contradictory.from_offset == contradictory.to_offset  # an empty range, not an error


def manifest(**overrides: object) -> bytes:
    doc = {
        "kind": "sluice-tier-manifest", "format_version": 1, "cluster": "c", "broker": "b", "topic": "t/1",
        "epoch": "e", "updated_ms": 1, "tiered_end": {"0": 10},
        "segments": [{"seq": 0, "key": "k0", "size": 300 << 20, "sha256": "", "rows": 10, "queues": {"0": [0, 9]},
                      "min_store_timestamp_ms": 1000, "max_store_timestamp_ms": 2000, "uploaded_ms": 3}],
    }  # fmt: skip
    doc.update(overrides)
    return json.dumps(doc).encode()


def test_manifest_parse_prune_and_split() -> None:
    m = parse_manifest(manifest(), "m")
    seg = m.segments[0]
    assert manifest_key("/p/", "c", "b", "t/1") == "p/c/b/t%2F1/manifest.json"
    assert segment_overlaps(seg, opts()) and segment_inside(seg, opts())
    assert not segment_overlaps(seg, opts(**{"from": "2001"}))
    assert not segment_overlaps(seg, opts(to="1000"))
    assert not segment_overlaps(seg, opts(queues="1"))
    assert not segment_overlaps(seg, opts(fromOffset="10"))
    assert segment_overlaps(seg, opts(fromOffset="5")) and not segment_inside(seg, opts(fromOffset="5"))
    tasks = tasks_for(seg, opts())
    assert [(t.start, t.end) for t in tasks] == [(0, 128 << 20), (128 << 20, 256 << 20), (256 << 20, 300 << 20)]
    with pytest.raises(MessageCorrupted, match="format version 2"):
        parse_manifest(manifest(format_version=2), "m")
    with pytest.raises(MessageCorrupted, match="not a Sluice tier manifest"):
        parse_manifest(b"{}", "m")
    with pytest.raises(MessageCorrupted, match="missing or malformed"):
        parse_manifest(manifest(segments=[{"seq": 0}]), "m")


def test_small_segments_share_partitions_large_ones_do_not() -> None:
    small = parse_manifest(manifest(), "m").segments[0]
    small = dataclasses.replace(small, size=100 << 10)
    tasks = [t for i in range(40) for t in tasks_for(dataclasses.replace(small, seq=i, key=f"k{i}"), opts())]
    parts = pack(tasks, opts())
    assert len(parts) == 8 and [t for p in parts for t in p] == tasks  # in order, every task once
    assert len(pack(tasks, opts(minPartitions="1"))) == 2  # 40 x 4 MiB open cost / 128 MiB
    big = dataclasses.replace(small, size=100 << 20)
    assert [len(p) for p in pack([*tasks_for(big, opts()), *tasks_for(big, opts())], opts())] == [1, 1]
    assert pack([], opts()) == []


def test_job_config_from_toml_and_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    toml = tmp_path / "sluice.toml"
    toml.write_text('[spark]\nbucket = "from-file"\nprefix = "p1"\nshuffle_partitions = 4\n')
    args = parser.parse_args(["trace", "--config", str(toml), "--s3-prefix", "p2", "--key", "k"])
    config = cli.job_config(args)
    assert (config.bucket, config.prefix, config.shuffle_partitions) == ("from-file", "p2", 4)
    assert cli.source_options(config, args)["key"] == "k"
    toml.write_text('[spark]\nbuckets = "typo"\n')
    with pytest.raises(ConfigError, match=r"unknown key\(s\) buckets"):
        cli.job_config(args)
    with pytest.raises(BadRequest, match="--s3-bucket is required"):
        cli.job_config(parser.parse_args(["trace", "--key", "k"]))


def test_stream_job_flags_become_checked_source_options() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    base = ["stream", "--namesrv", "127.0.0.1:9876", "--output", "/o", "--checkpoint", "/c"]
    args = parser.parse_args([*base, "--topic", "a", "--topic", "b", "--max-records-per-trigger", "50"])
    assert cli.stream_options(args) == {
        "namesrv": "127.0.0.1:9876", "topics": "a,b", "startingOffsets": "earliest", "maxRecordsPerTrigger": "50",
    }  # fmt: skip
    with pytest.raises(BadRequest, match="stream needs --topic \\(or --topic-pattern\\)"):
        cli.stream_options(parser.parse_args(base))
    with pytest.raises(BadRequest, match="maxRecordsPerTrigger must be positive"):
        cli.stream_options(parser.parse_args([*base, "--topic", "a", "--max-records-per-trigger", "0"]))
    with pytest.raises(BadRequest, match="--trigger-interval must be 0 or more"):
        cli.stream_options(parser.parse_args([*base, "--topic", "a", "--trigger-interval", "-1"]))


def test_py_files_archive_imports_the_source_without_the_rest_of_the_broker(tmp_path: Path) -> None:
    """The `--py-files` zip alone (no worktree on the path) runs the planner and the executor's reader."""
    import subprocess
    import sys

    from spark_jobs.package import build_zip

    archive = build_zip(tmp_path / "sluice.zip")
    code = (
        f"import json, sys; sys.path.insert(0, {str(archive)!r}); import spark_jobs.source, spark_jobs.scan; "
        "assert spark_jobs.scan.__file__.startswith(sys.path[0]), spark_jobs.scan.__file__; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'broker')))"
    )
    # -I: neither PYTHONPATH nor the current directory; only the archive and the installed packages.
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert loaded == {
        "broker", "broker.tiering", "broker.tiering.format", "broker.tiering.objectstore", "broker.tiering.s3store",
        "broker.tiering.s3settings",
        "broker.client", "broker.client.api", "broker.client.coalesce", "broker.client.grpc_convert",
        "broker.client.remote",
    }  # fmt: skip
