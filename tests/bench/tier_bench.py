#!/usr/bin/env python3
"""Tiered-storage benchmark (issue #7), in one run against a moto S3 server on loopback.

    PYTHONPATH=. .venv/bin/python tests/bench/tier_bench.py [--messages 100000] [--body-bytes 1024]
        [--queues 4] [--segment-mib 32] [--read-ahead N] [--dir /path] [--json]

A real `LocalBroker` with tiering on (moto runs as a child process, so it does not share this
process's GIL) stores `--messages` text-like messages, then:

- upload: `tier_upload_now` of everything; MB/s of message bodies, objects and PUT requests per GB;
- storage ratio: bytes in the bucket per byte of message body (zstd Parquet; target < 0.5);
- hot read: every message pulled back from local disk (32 per pull, round robin over the queues,
  as a consumer catching up does);
- cold read: `tier_evict_local`, then the same pulls served from S3 with an empty cache; MB/s, the
  ratio to hot (target >= 0.5), and S3 requests per 1,000 messages consumed cold; then once more
  from the reader's cache (row groups decoded already: the pull path without S3 or decoding).

Prints one figure per line (or one JSON document with `--json`). Figures on a shared, noisy machine
are indicative only; rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3

from broker.client.api import FilterSpec, TopicSpec
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.store.config import CommitLogConfig, RetentionConfig, StoreConfig
from broker.tiering.config import MIB, TieringConfig
from common.record import MessageRecord
from tests.helpers.procs import LOOPBACK, free_port, start_process

TOPIC = "bench-tier"
GROUP = "bench-reader"
PULL_BATCH = 32
APPEND_BATCH = 256
GB = 1 << 30
_WORDS = [
    "order",
    "shipped",
    "customer",
    "invoice",
    "payment",
    "warehouse",
    "parcel",
    "delivered",
    "status",
    "pending",
    "refund",
    "account",
    "region",
    "north",
    "south",
    "east",
    "west",
    "priority",
    "standard",
    "express",
    "item",
    "quantity",
    "price",
    "total",
    "currency",
    "euro",
    "dollar",
    "address",
    "street",
    "city",
    "postcode",
    "country",
    "note",
    "gift",
    "wrap",
    "return",
    "label",
    "carrier",
    "tracking",
]


def text_body(rng: random.Random, size: int, i: int) -> bytes:
    """A JSON-ish, log-like payload: words, ids and numbers, as business messages tend to be."""
    parts = [f'{{"id":{i},"ts":{1_700_000_000_000 + i * 7},"customer":"c-{rng.randrange(10_000):05d}","text":"']
    n = len(parts[0])
    while n < size - 2:
        word = rng.choice(_WORDS) if rng.random() < 0.85 else str(rng.randrange(100_000))
        parts.append(word + " ")
        n += len(word) + 1
    return ("".join(parts)[: size - 2] + '"}').encode()


async def produce(broker: LocalBroker, messages: int, queues: int, body_bytes: int) -> int:
    rng = random.Random(7)
    body_total = 0
    pending: list[MessageRecord] = []
    for i in range(messages):
        body = text_body(rng, body_bytes, i)
        body_total += len(body)
        pending.append(MessageRecord(
            topic=TOPIC, queue_id=i % queues, body=body, message_id=uuid.UUID(int=i).hex, tag="bench",
            keys=(f"k{i}",), born_timestamp_ms=int(time.time() * 1000), born_host="127.0.0.1:1",
        ))  # fmt: skip
        if len(pending) == APPEND_BATCH:
            await broker.store.append(pending)
            pending = []
    if pending:
        await broker.store.append(pending)
    return body_total


async def pull_everything(broker: LocalBroker, queues: int) -> tuple[int, int]:
    """Round robin over the queues, PULL_BATCH at a time, from offset 0: (messages, body bytes)."""
    offsets = dict.fromkeys(range(queues), 0)
    count = size = 0
    while offsets:
        for q in list(offsets):
            res = await broker.pull(GROUP, TOPIC, q, offsets[q], PULL_BATCH, FilterSpec())
            count += len(res.messages)
            size += sum(len(m.body) for m in res.messages)
            offsets[q] = res.next_offset
            if res.next_offset >= res.max_offset:
                del offsets[q]
    return count, size


async def bench(args: argparse.Namespace, endpoint: str, bucket: str, work: Path) -> dict[str, Any]:
    tiering = TieringConfig(
        endpoint_url=endpoint, bucket=bucket, prefix="bench", access_key_id="bench", secret_access_key="bench",
        addressing_style="path", min_age_s=1e9, segment_target_bytes=args.segment_mib * MIB,
        read_timeout_s=120.0, max_attempts=3, read_ahead_row_groups=args.read_ahead,
    )  # fmt: skip
    store = StoreConfig(
        commitlog=CommitLogConfig(segment_bytes=64 * MIB),
        retention=RetentionConfig(max_age_s=0.0, max_disk_used_ratio=1.0, check_interval_s=3600.0),
    )
    broker = LocalBroker(BrokerConfig(name="bench", data_dir=work / "broker", store=store, tiering=tiering))
    await broker.start()
    try:
        await broker.create_topic(TopicSpec(TOPIC, args.queues))
        body_bytes = await produce(broker, args.messages, args.queues, args.body_bytes)
        tier = broker.tiering
        assert tier is not None

        before = tier.objects.snapshot()
        t0 = time.perf_counter()
        status = await broker.tier_upload_now(TOPIC, 3600.0)
        upload_s = time.perf_counter() - t0
        up = tier.objects.snapshot()
        puts = up.puts - before.puts
        segment_bytes = status.bytes

        t0 = time.perf_counter()
        hot_count, hot_bytes = await pull_everything(broker, args.queues)
        hot_s = time.perf_counter() - t0

        evicted = await broker.tier_evict_local(TOPIC)
        before = tier.objects.snapshot()
        t0 = time.perf_counter()
        cold_count, cold_bytes = await pull_everything(broker, args.queues)
        cold_s = time.perf_counter() - t0
        after = tier.objects.snapshot()
        t0 = time.perf_counter()
        await pull_everything(broker, args.queues)  # again: row groups now come from the reader's cache
        warm_s = time.perf_counter() - t0
        assert hot_count == cold_count == args.messages, (hot_count, cold_count)
        assert hot_bytes == cold_bytes == body_bytes
        requests = (after.gets - before.gets) + (after.heads - before.heads) + (after.lists - before.lists)
        hot_mb_s = hot_bytes / MIB / hot_s
        cold_mb_s = cold_bytes / MIB / cold_s
        return {
            "messages": args.messages,
            "body_bytes": body_bytes,
            "upload_mb_s": body_bytes / MIB / upload_s,
            "upload_objects": status.objects,
            "objects_per_gb": status.objects * GB / body_bytes,
            "put_requests_per_gb": puts * GB / body_bytes,
            "storage_ratio": segment_bytes / body_bytes,
            "hot_read_mb_s": hot_mb_s,
            "hot_read_msgs_s": hot_count / hot_s,
            "cold_read_mb_s": cold_mb_s,
            "cold_read_msgs_s": cold_count / cold_s,
            "cold_to_hot": cold_mb_s / hot_mb_s,
            "cold_cached_read_mb_s": cold_bytes / MIB / warm_s,
            "s3_requests_per_1000_cold": requests * 1000 / cold_count,
            "cold_get_bytes": after.get_bytes - before.get_bytes,
            "evicted_segments": evicted.segments,
        }
    finally:
        await broker.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--segment-mib", type=int, default=32, help="tiering.segment_target_bytes in MiB")
    parser.add_argument(
        "--read-ahead",
        type=int,
        default=TieringConfig().read_ahead_row_groups,
        help="tiering.read_ahead_row_groups (row groups kept decoded ahead of a sequential cold reader, "
        "fetched that many per GET)",
    )
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tier-bench-", dir=args.dir))
    port = free_port()
    moto = start_process(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)], port=port,
        log_path=work / "moto.log", name="moto-s3",
    )  # fmt: skip
    try:
        endpoint = f"http://{LOOPBACK}:{port}"
        bucket = "tier-bench"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket=bucket)  # fmt: skip
        result = asyncio.run(bench(args, endpoint, bucket, work))
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"messages                     {result['messages']} ({result['body_bytes'] / MIB:.1f} MiB of bodies)")
    print(f"upload throughput            {result['upload_mb_s']:.1f} MiB/s of message bodies")
    print(f"objects per GiB              {result['objects_per_gb']:.1f}")
    print(f"PUT requests per GiB         {result['put_requests_per_gb']:.1f}")
    ok = "ok" if result["storage_ratio"] < 0.5 else "ABOVE target 0.5"
    print(f"storage ratio                {result['storage_ratio']:.3f} bytes in S3 per body byte ({ok})")
    print(f"hot read (local disk)        {result['hot_read_mb_s']:.1f} MiB/s, {result['hot_read_msgs_s']:.0f} msg/s")
    print(f"cold read (S3, empty cache)  {result['cold_read_mb_s']:.1f} MiB/s, {result['cold_read_msgs_s']:.0f} msg/s")
    print(f"cold read, cached row groups {result['cold_cached_read_mb_s']:.1f} MiB/s (decoded already, no S3)")
    ok = "ok" if result["cold_to_hot"] >= 0.5 else "BELOW target 0.5"
    print(f"cold / hot                   {result['cold_to_hot']:.2f} ({ok})")
    print(f"S3 requests per 1,000 cold   {result['s3_requests_per_1000_cold']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
