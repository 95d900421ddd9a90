"""Spark data source benchmark: scan throughput vs Spark's built-in Parquet reader, and one-hour pruning.

    PYTHONPATH=$PWD python tests/bench/spark_bench.py [--messages-per-hour 2000] [--body-bytes 1024]
                                                     [--cores 2] [--repeat 2] [--json]

1. Builds a day (24 hours) of one topic with the real tiering core (MessageStore + Uploader, as
   the broker tiers) into an S3-compatible server (moto, in this process, on 127.0.0.1).
2. Scans everything through the `sluice` source (all columns, `noop` sink: no collect) and the same
   segment objects copied to a local directory through `spark.read.parquet`, each `--repeat` times
   (best run counts). Figures: MB/s of segment bytes and rows/s, per executor core (`local[cores]`).
3. Queries one hour in the middle of the day and counts the segment objects the server was asked
   for, against the objects of the day.

Targets: the source reaches >= 50 % of the built-in reader's throughput; the one-hour query
fetches < 10 % of the objects. Note: moto serves objects from Python, so on a small machine the
source's figure includes moto's serving cost (a real S3 or MinIO endpoint costs the executors less).
Bounded: stops by itself after the scans; exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.tiering.config import TieringConfig
from tests.helpers.archive import ArchiveBuilder, message
from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY, MotoS3Server

HOUR_MS = 3_600_000
DAY_START_MS = 1_717_200_000_000  # 2024-06-01T00:00:00Z
TOPIC = "bench"
PREFIX = "bench"
BUCKET = "sluice-spark-bench"
BATCH = 256


def build_day(server: MotoS3Server, data_dir: Path, per_hour: int, body_bytes: int, segment_bytes: int) -> Any:
    server.client().create_bucket(Bucket=BUCKET)
    config = TieringConfig(
        endpoint_url=server.endpoint_url, region=REGION, bucket=BUCKET, prefix=PREFIX, access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY, addressing_style="path", segment_target_bytes=segment_bytes,
        mirror_interval_s=0.0, read_timeout_s=60.0,
    )  # fmt: skip
    builder = ArchiveBuilder(data_dir, config)
    rng = random.Random(7)
    for hour in range(24):
        for first in range(0, per_hour, BATCH):
            n = min(BATCH, per_hour - first)
            at = DAY_START_MS + hour * HOUR_MS + first * (HOUR_MS // per_hour)
            batch = [
                message(TOPIC, i % 4, f"{hour}-{first + i}", keys=[f"k{rng.randrange(1000)}"],
                        body=rng.randbytes(body_bytes // 2) * 2, group=f"g{i % 8}")
                for i in range(n)
            ]  # fmt: skip
            builder.produce(batch, at)
    builder.tier()
    return config


def segments(server: MotoS3Server) -> list[dict[str, Any]]:
    client = server.client()
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + "/"):
        out.extend(o for o in page.get("Contents", ()) if o["Key"].endswith(".parquet"))
    return out


def timed_scan(df: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages-per-hour", type=int, default=2000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--segment-bytes", type=int, default=256 << 10, help="broker segment_target_bytes")
    parser.add_argument("--cores", type=int, default=2, help="local[cores]")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-spark-bench-"))
    server = MotoS3Server()
    server.start()
    try:
        return run(args, server, work)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, server: MotoS3Server, work: Path) -> int:
    print("building a day of tiered data ...", file=sys.stderr)
    started = time.perf_counter()
    build_day(server, work / "broker", args.messages_per_hour, args.body_bytes, args.segment_bytes)
    objects = segments(server)
    total_bytes = sum(o["Size"] for o in objects)
    rows = 24 * args.messages_per_hour
    print(f"built {len(objects)} segments, {total_bytes / 1e6:.1f} MB in {time.perf_counter() - started:.0f}s",
          file=sys.stderr)  # fmt: skip
    local = work / "local"
    local.mkdir()
    client = server.client()
    for o in objects:
        client.download_file(BUCKET, o["Key"], str(local / o["Key"].rsplit("/", 1)[1]))

    from spark_jobs.config import SparkJobsConfig
    from spark_jobs.session import open_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = open_session(dataclasses.replace(SparkJobsConfig(), master=f"local[{args.cores}]", app_name="spark-bench"))
    spark.sparkContext.setLogLevel("ERROR")
    try:
        options = {
            "endpoint": server.endpoint_url, "bucket": BUCKET, "prefix": PREFIX, "region": REGION,
            "accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY, "addressingStyle": "path",
        }  # fmt: skip
        source = spark.read.format("sluice").options(**options, topic=TOPIC).load()
        assert source.count() == rows, "the source must return every message"
        source_s = timed_scan(source, args.repeat)
        builtin = spark.read.parquet(str(local))
        assert builtin.count() == rows
        builtin_s = timed_scan(builtin, args.repeat)

        hour_from = DAY_START_MS + 12 * HOUR_MS
        server.clear_requests()
        hour = spark.read.format("sluice").options(**options, topic=TOPIC)
        hour_rows = hour.options(**{"from": str(hour_from), "to": str(hour_from + HOUR_MS)}).load().count()
        fetched = {p.split("?")[0] for m, p in server.requests() if m == "GET" and ".parquet" in p}
    finally:
        spark.stop()

    def figures(seconds: float) -> dict[str, float]:
        return {
            "seconds": round(seconds, 3),
            "mb_per_s_per_core": round(total_bytes / 1e6 / seconds / args.cores, 2),
            "rows_per_s_per_core": round(rows / seconds / args.cores),
        }

    ratio = builtin_s / source_s
    share = len(fetched) / len(objects)
    result = {
        "segments": len(objects), "segment_mb": round(total_bytes / 1e6, 2), "rows": rows, "cores": args.cores,
        "source": figures(source_s), "builtin_parquet_local": figures(builtin_s),
        "source_vs_builtin": round(ratio, 3), "target_source_vs_builtin": 0.5,
        "one_hour_rows": hour_rows, "one_hour_objects_fetched": len(fetched),
        "one_hour_share_of_objects": round(share, 4), "target_one_hour_share": 0.10,
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for name in ("source", "builtin_parquet_local"):
            f = result[name]
            print(f"{name:24s} {f['seconds']:8.2f} s  {f['mb_per_s_per_core']:8.2f} MB/s/core  "
                  f"{f['rows_per_s_per_core']:10d} rows/s/core")  # fmt: skip
        print(f"source / built-in throughput: {ratio:.0%} (target >= 50%)")
        print(f"one-hour query fetched {len(fetched)} of {len(objects)} objects: {share:.1%} (target < 10%)")
    return 0 if ratio >= 0.5 and share < 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
