#!/usr/bin/env python3
"""The tiered segment codec alone (broker/tiering/segment.py), no broker, no S3.

    PYTHONPATH=. .venv/bin/python tests/bench/segment_codec_micro.py [--messages 50000] [--body-bytes 1024]
        [--repeats 5] [--json]

Builds `--messages` stored records (1 KiB text-like bodies, a tag, a key, a user and a system
property, a delivery time on every tenth) of one topic over 4 queues, then times, best of
`--repeats` runs each:

- records_to_table: the uploader's conversion of records into the segment's Arrow columns;
- encode_segment: records_to_table plus the zstd Parquet write (what an upload costs in CPU);
- table_to_records: the cold read path's conversion of decoded columns back into records;
- decode_segment: the Parquet read plus table_to_records (a cold read of a whole segment).

Prints one figure per line (milliseconds and records per second), or one JSON document with
`--json`. Figures on a shared, noisy machine are indicative only; compare runs taken together.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from broker.tiering.segment import decode_segment, encode_segment, records_to_table, table_to_records
from common.record import MessageRecord

TOPIC = "bench-segment"
QUEUES = 4
_WORDS = ["order", "shipped", "customer", "invoice", "payment", "parcel", "refund", "region", "express", "euro"]


def make_records(n: int, body_bytes: int) -> list[MessageRecord]:
    rnd = random.Random(7)
    out = []
    for i in range(n):
        text = " ".join(rnd.choice(_WORDS) for _ in range(body_bytes // 6 + 1)).encode()[:body_bytes]
        q = i % QUEUES
        out.append(MessageRecord(
            topic=TOPIC, queue_id=q, body=text, message_id=f"01{i:030X}", tag=rnd.choice(_WORDS), keys=(f"k{i}",),
            properties={"region": rnd.choice(_WORDS)}, system_properties={"TRACE": f"t{i}"}, message_type=1,
            born_timestamp_ms=1_700_000_000_000 + i, born_host="10.0.0.7:5555", store_host="10.0.0.1:10911",
            delivery_timestamp_ms=1_700_000_060_000 + i if i % 10 == 0 else 0, queue_offset=i // QUEUES,
            physical_offset=i * (body_bytes + 160), store_timestamp_ms=1_700_000_000_100 + i, size=body_bytes + 160,
        ))  # fmt: skip
    return out


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()  # each run starts from the same collector state (a cold read's work is mostly allocation)
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--body-bytes", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    recs = make_records(args.messages, args.body_bytes)
    ordered = sorted(recs, key=lambda r: (r.queue_id, r.queue_offset))
    seg = encode_segment(recs, topic=TOPIC, cluster="c", broker="b")
    table = pq.ParquetFile(pa.BufferReader(seg.data)).read()
    assert decode_segment(seg.data)[1] == ordered, "round trip"
    n, r = args.messages, args.repeats
    figures = {
        "records_to_table_ms": best_ms(lambda: records_to_table(ordered), r),
        "encode_segment_ms": best_ms(lambda: encode_segment(recs, topic=TOPIC, cluster="c", broker="b"), r),
        "table_to_records_ms": best_ms(lambda: table_to_records(table, TOPIC), r),
        "decode_segment_ms": best_ms(lambda: decode_segment(seg.data), r),
    }
    if args.json:
        print(json.dumps({"messages": n, "body_bytes": args.body_bytes, "repeats": r, **figures}))
        return
    print(f"{n} records of {args.body_bytes} B, best of {r}")
    for name, ms in figures.items():
        print(f"{name[:-3]:>18}: {ms:8.1f} ms  {n / ms * 1000:12,.0f} records/s")


if __name__ == "__main__":
    main()
