"""Streaming source benchmark: hot reads from a broker, raw and through Spark, and per-micro-batch cost.

    PYTHONPATH=$PWD python tests/bench/spark_stream_bench.py [--messages 100000] [--body-bytes 256]
                                                            [--queues 8] [--cores 2] [--json]

1. Starts a `sluice up` (NameServer, broker, proxy; child processes on free loopback ports) and
   stores `--messages` messages in one topic over `--queues` queues through the broker's internal
   service (batches of 256).
2. `read_rows`: reads every queue the way one executor task does (spark_jobs/stream/hot.py:
   ReadRows calls of 4096 rows, Arrow decode, shaping to the source's columns), in this process.
3. `spark`: a `Trigger.AvailableNow` query over the topic into Spark's `noop` sink on
   `local[cores]`, best of `--repeat`; rows/s per executor core.
4. `micro_batch`: the same query with `maxRecordsPerTrigger` small, so it runs `--batches` batches;
   the time per batch beside Spark's built-in `rate-micro-batch` source running as many batches of
   the same size in the same session.

Cold-only and mixed reads go through the broker too in this version (it reads the bucket), so they
are not measured separately yet. Bounded: stops the cluster by PID when done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.client.api import OutgoingMessage
from broker.client.remote import RemoteBroker
from nameserver.client import NameServerClient
from spark_jobs.stream.discovery import discover
from spark_jobs.stream.hot import QueuePartition, read_partition
from spark_jobs.stream.options import StreamOptions
from tests.e2e.support.cluster import start_merged

TOPIC = "bench-stream"
SEND_BATCH = 256


async def produce(namesrv: str, messages: int, body_bytes: int, queues: int) -> None:
    ns = NameServerClient([namesrv])
    route = await ns.get_route(TOPIC)
    await ns.close()
    b = route.brokers[0]
    body = os.urandom(body_bytes // 2).hex().encode()[:body_bytes]
    async with RemoteBroker(b.broker_name, b.address, timeout_s=60) as broker:
        sends = []
        for start in range(0, messages, SEND_BATCH):
            batch = [OutgoingMessage(body=body, message_id=f"{i:032X}", tag="t", keys=(f"k{i}",))
                     for i in range(start, min(messages, start + SEND_BATCH))]  # fmt: skip
            sends.append(broker.send(TOPIC, (start // SEND_BATCH) % queues, batch))
            if len(sends) >= 16:
                await asyncio.gather(*sends)
                sends = []
        await asyncio.gather(*sends)


def read_rows(namesrv: str) -> tuple[int, int, float]:
    opts = StreamOptions(namesrv=(namesrv,), topics=frozenset({TOPIC}))
    started = time.perf_counter()
    rows = body = 0
    for key, r in sorted(discover(opts).items()):
        for batch in read_partition(QueuePartition(key, r.cluster, r.address, r.min_offset, r.acked_offset), opts):
            rows += batch.num_rows
            body += sum(len(v) for v in batch.column("body").to_pylist())
    return rows, body, time.perf_counter() - started


def run_query(spark: Any, df: Any, work: Path, name: str) -> tuple[float, int]:
    started = time.perf_counter()
    query = (df.writeStream.format("noop").option("checkpointLocation", str(work / name))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return time.perf_counter() - started, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="sluice-stream-bench-") as tmp:
        work = Path(tmp)
        cluster = start_merged(work / "cluster")
        try:
            cluster.create_topic(TOPIC, queues=args.queues)
            t0 = time.perf_counter()
            asyncio.run(produce(cluster.namesrv, args.messages, args.body_bytes, args.queues))
            produce_s = time.perf_counter() - t0
            rows, body, read_s = read_rows(cluster.namesrv)
            assert rows == args.messages, (rows, args.messages)
            figures: dict[str, Any] = {
                "messages": args.messages, "body_bytes": args.body_bytes,
                "produce_msg_s": round(args.messages / produce_s),
                "read_rows": {"rows_s": round(rows / read_s), "body_mb_s": round(body / read_s / 1e6, 1)},
            }  # fmt: skip
            figures.update(spark_figures(cluster.namesrv, args, work))
        finally:
            cluster.stop()
    print(json.dumps(figures, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0


def spark_figures(namesrv: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from spark_jobs.source import register

    spark = (SparkSession.builder.master(f"local[{args.cores}]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:

        def source(**options: str) -> Any:
            return (spark.readStream.format("sluice").option("namesrv", namesrv).option("topics", TOPIC)
                    .option("startingOffsets", "earliest").options(**options).load())  # fmt: skip

        best = min(run_query(spark, source(), work, f"full-{i}")[0] for i in range(args.repeat))
        per_batch = max(1, args.messages // args.batches)
        sluice_s, _ = run_query(spark, source(maxRecordsPerTrigger=str(per_batch)), work, "batches")
        rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per_batch)
                .option("numPartitions", args.cores).load())  # fmt: skip
        rate_s = rate_batches(spark, rate, work, args.batches)
        return {
            "spark": {
                "rows_s": round(args.messages / best), "rows_s_per_core": round(args.messages / best / args.cores),
            },
            "micro_batch": {
                "batches": args.batches, "rows_per_batch": per_batch,
                "sluice_ms_per_batch": round(sluice_s / args.batches * 1000),
                "rate_ms_per_batch": round(rate_s / args.batches * 1000),
            },
        }  # fmt: skip
    finally:
        spark.stop()


def rate_batches(spark: Any, rate: Any, work: Path, batches: int) -> float:
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


if __name__ == "__main__":
    sys.exit(main())
