"""Streaming source benchmark: cold, hot and mixed reads, per-micro-batch cost, latency to the sink.

    PYTHONPATH=$PWD python tests/bench/spark_stream_bench.py [--messages 40000] [--body-bytes 256]
                                                            [--queues 8] [--cores 2] [--json]

1. Starts an S3 server (moto, in this process, on 127.0.0.1) and a `sluice up` (NameServer, broker,
   proxy; child processes on free loopback ports) tiering into it, then stores `--messages` messages
   in each of three topics through the broker's internal service: `cold` (all tiered with
   `upload-now`, local copies dropped with `evict-local`), `hot` (nothing tiered) and `mixed` (the
   first half tiered, the second not).
2. After one warm-up query (not counted), `Trigger.AvailableNow` queries into Spark's `noop` sink
   on `local[cores]` (best of `--repeat`; a query's fixed cost, about one micro-batch, is included):
   - `cold_archive`: cold, with the archive options: the executors read the Parquet objects;
   - `cold_batch`: the batch source (`spark.read.format("sluice")`) over the same objects: the
     target is cold_archive >= 80 % of it (rows/s);
   - `cold_broker`: cold without the archive options: the broker reads the bucket for them;
   - `hot`: hot (through the broker's ReadRows); `mixed`: mixed, with the archive options.
   Each: rows/s and MB/s of message bodies, per executor core, end to end; and rows/s inside the
   Spark jobs (`in_jobs_rows_s_per_core`: the progress' `addBatch` time, without the query's start
   and each batch's planning, which `micro_batch` measures). `cold_vs_batch` compares the latter:
   the read itself; `cold_vs_batch_end_to_end` the former.
3. `micro_batch`: the hot query with `maxRecordsPerTrigger` small, so it runs `--batches` batches,
   beside Spark's built-in `rate-micro-batch` source running as many batches of the same size.
4. `latency`: a query with a 1 s processing-time trigger into a `foreachBatch` sink while a
   producer stores `--latency-rate` messages/s for `--latency-s` seconds: for each message, the time
   from its store timestamp to its batch reaching the sink (p50, p99, max).

Figures from a shared, loaded machine are noisy: quote them with the machine's state. Bounded
(about 3-4 minutes on 2 idle cores with the defaults): the cluster and the S3 server stop at the end;
exit code 1 when cold_archive is below 80 % of cold_batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.client.remote import RemoteBroker
from common.record import outgoing
from nameserver.client import NameServerClient
from tests.e2e.support.cluster import Cluster, start_merged
from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY, MotoS3Server

BUCKET = "sluice-stream-bench"
SEND_BATCH = 256
TARGET_COLD_SHARE = 0.8
CONFIG = f"""
[broker.tiering]
region = "{REGION}"
addressing_style = "path"
segment_target_bytes = {2 << 20}
read_timeout_s = 60.0
"""


async def _address(namesrv: str, topic: str) -> tuple[str, str]:
    ns = NameServerClient([namesrv])
    try:
        b = (await ns.get_route(topic)).brokers[0]
    finally:
        await ns.close()
    return b.broker_name, b.address


async def produce(namesrv: str, topic: str, first: int, count: int, body_bytes: int, queues: int) -> None:
    name, address = await _address(namesrv, topic)
    body = os.urandom(body_bytes // 2 + 1).hex().encode()[:body_bytes]
    async with RemoteBroker(name, address, timeout_s=60) as broker:
        sends = []
        for start in range(first, first + count, SEND_BATCH):
            batch = [outgoing(body=body, message_id=f"{i:032X}", tag="t", keys=(f"k{i}",))
                     for i in range(start, min(first + count, start + SEND_BATCH))]  # fmt: skip
            sends.append(broker.send(topic, (start // SEND_BATCH) % queues, batch))
            if len(sends) >= 16:
                await asyncio.gather(*sends)
                sends = []
        await asyncio.gather(*sends)


def build(cluster: Cluster, args: argparse.Namespace) -> None:
    n = args.messages
    for topic in ("cold", "hot", "mixed"):
        cluster.create_topic(topic, queues=args.queues)
    asyncio.run(produce(cluster.namesrv, "cold", 0, n, args.body_bytes, args.queues))
    cluster.admin("tier", "upload-now", "cold", timeout_s=600)
    cluster.admin("tier", "evict-local", "cold")
    asyncio.run(produce(cluster.namesrv, "hot", 0, n, args.body_bytes, args.queues))
    asyncio.run(produce(cluster.namesrv, "mixed", 0, n // 2, args.body_bytes, args.queues))
    cluster.admin("tier", "upload-now", "mixed", timeout_s=600)
    asyncio.run(produce(cluster.namesrv, "mixed", n // 2, n - n // 2, args.body_bytes, args.queues))


def timed(query: Any) -> tuple[float, int, float]:
    """(wall seconds, rows, seconds in the batches' Spark jobs: the progress' `addBatch`, which leaves
    out starting the query and planning each batch)."""
    started = time.perf_counter()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    jobs_s = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
    return time.perf_counter() - started, sum(p["numInputRows"] for p in progress), jobs_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--latency-rate", type=int, default=200)
    parser.add_argument("--latency-s", type=float, default=15.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)  # the broker's credentials
    s3 = MotoS3Server()
    s3.start()
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory(prefix="sluice-stream-bench-") as tmp:
            work = Path(tmp)
            (work / "sluice.toml").write_text(CONFIG)
            flags = ["--config", str(work / "sluice.toml"), "--s3-endpoint", s3.endpoint_url, "--s3-bucket", BUCKET,
                     "--tier-min-age", "3600"]  # fmt: skip
            cluster = start_merged(work / "cluster", extra_args=flags)
            try:
                t0 = time.perf_counter()
                build(cluster, args)
                built_s = round(time.perf_counter() - t0, 1)
                figures: dict[str, Any] = {"messages_per_topic": args.messages, "body_bytes": args.body_bytes,
                                           "cores": args.cores, "build_s": built_s}  # fmt: skip
                figures.update(spark_figures(cluster, s3, args, work))
            finally:
                cluster.stop()
    finally:
        s3.stop()
    print(json.dumps(figures, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0 if figures["cold_vs_batch"] >= TARGET_COLD_SHARE else 1


def spark_figures(cluster: Cluster, s3: MotoS3Server, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from spark_jobs.source import register
    from tests.helpers.spark_stream import SPARK_STARTUP_FAILURE

    spark = (SparkSession.builder.master(f"local[{args.cores}]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    archive = {"endpoint": s3.endpoint_url, "bucket": BUCKET, "addressingStyle": "path", "region": REGION,
               "accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY}  # fmt: skip
    runs = iter(range(1_000_000))

    def stream(topic: str, **options: str) -> Any:
        return (spark.readStream.format("sluice").option("namesrv", cluster.namesrv).option("topics", topic)
                .option("startingOffsets", "earliest").options(**options).load())  # fmt: skip

    def available_now(df: Any) -> tuple[float, int, float]:
        for attempt in range(3):  # again (timed anew) if the source's Python process did not start in time
            query = (df.writeStream.format("noop").option("checkpointLocation", str(work / f"ck-{next(runs)}"))
                     .trigger(availableNow=True).start())  # fmt: skip
            try:
                return timed(query)
            except Exception as exc:  # awaitTermination raises the query's StreamingQueryException
                if SPARK_STARTUP_FAILURE not in str(exc) or query.recentProgress or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def batch_read() -> tuple[float, int, float]:
        started = time.perf_counter()
        spark.read.format("sluice").options(**archive).option("topic", "cold").load().write.format("noop").mode(
            "overwrite"
        ).save()
        elapsed = time.perf_counter() - started
        return elapsed, args.messages, elapsed  # one Spark job, its planning included

    def best(run: Any) -> dict[str, Any]:
        walls, jobs = [], []
        for _ in range(args.repeat):
            wall, rows, job = run()
            assert rows == args.messages, (rows, args.messages)
            walls.append(wall)
            jobs.append(job)
        s, j = min(walls), min(jobs)
        return {"rows_s": round(args.messages / s), "rows_s_per_core": round(args.messages / s / args.cores),
                "body_mb_s_per_core": round(args.messages * args.body_bytes / s / args.cores / 1e6, 2),
                "in_jobs_rows_s_per_core": round(args.messages / j / args.cores)}  # fmt: skip

    try:
        available_now(stream("hot", maxRecordsPerTrigger="100"))  # warm-up: JVM, Python workers (not counted)
        batch_read()
        out: dict[str, Any] = {
            "cold_archive": best(lambda: available_now(stream("cold", **archive))),
            "cold_batch": best(batch_read),
            "cold_broker": best(lambda: available_now(stream("cold"))),
            "hot": best(lambda: available_now(stream("hot"))),
            "mixed": best(lambda: available_now(stream("mixed", **archive))),
        }
        # The read itself: rows/s inside the Spark jobs (a stream's start and per-batch planning are
        # the micro_batch figure's business); end to end beside it.
        out["cold_vs_batch"] = round(
            out["cold_archive"]["in_jobs_rows_s_per_core"] / out["cold_batch"]["in_jobs_rows_s_per_core"], 2
        )
        out["cold_vs_batch_end_to_end"] = round(out["cold_archive"]["rows_s"] / out["cold_batch"]["rows_s"], 2)
        per_batch = max(1, args.messages // args.batches)
        sluice_s, _, _ = available_now(stream("hot", maxRecordsPerTrigger=str(per_batch)))
        rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per_batch)
                .option("numPartitions", args.cores).load())  # fmt: skip
        rate_s = rate_batches(rate, work, args.batches)
        out["micro_batch"] = {"batches": args.batches, "rows_per_batch": per_batch,
                              "sluice_ms_per_batch": round(sluice_s / args.batches * 1000),
                              "rate_ms_per_batch": round(rate_s / args.batches * 1000)}  # fmt: skip
        out["latency"] = latency(cluster, stream, work, args)
        return out
    finally:
        spark.stop()


def rate_batches(rate: Any, work: Path, batches: int) -> float:
    """Seconds Spark's rate-micro-batch source takes for `batches` batches into `noop`."""
    started = time.perf_counter()
    query = rate.writeStream.format("noop").option("checkpointLocation", str(work / "rate")).start()
    while query.lastProgress is None or query.lastProgress["batchId"] < batches - 1:
        time.sleep(0.05)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    elapsed = time.perf_counter() - started
    query.stop()
    return elapsed


def latency(cluster: Cluster, stream: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Store time -> sink, with a 1 s trigger, while messages arrive at `--latency-rate` per second."""
    cluster.create_topic("live", queues=args.queues)
    delays_ms: list[float] = []

    def sink(df: Any, batch_id: int) -> None:
        stored = [r["store_timestamp"].timestamp() for r in df.select("store_timestamp").collect()]
        now = time.time()
        delays_ms.extend((now - s) * 1000 for s in stored)

    query = (stream("live", startingOffsets="latest").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(work / "ck-live"))
             .trigger(processingTime="1 second").start())  # fmt: skip
    try:
        while query.lastProgress is None:  # the query took its start offsets: what follows is read
            time.sleep(0.1)
        total = int(args.latency_rate * args.latency_s)

        async def steady() -> None:  # 20 messages per send, round robin over the queues, on a fixed clock
            name, address = await _address(cluster.namesrv, "live")
            step, began = 20 / args.latency_rate, time.monotonic()
            async with RemoteBroker(name, address, timeout_s=60) as broker:
                for n, first in enumerate(range(0, total, 20)):
                    batch = [outgoing(body=b"x" * args.body_bytes, message_id=f"L{i:031X}")
                             for i in range(first, min(total, first + 20))]  # fmt: skip
                    await broker.send("live", n % args.queues, batch)
                    await asyncio.sleep(max(0.0, began + (n + 1) * step - time.monotonic()))

        asyncio.run(steady())
        deadline = time.monotonic() + 60
        while len(delays_ms) < total and time.monotonic() < deadline and query.exception() is None:
            time.sleep(0.2)
    finally:
        query.stop()
    if not delays_ms:
        return {"messages": 0}
    ordered = sorted(delays_ms)
    return {"messages": len(ordered), "p50_ms": round(statistics.median(ordered)),
            "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1]), "max_ms": round(ordered[-1])}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
