#!/usr/bin/env python3
"""The store's append encode and the figures behind its index switch, per record, by batch size.

    PYTHONPATH=$PWD .venv/bin/python tests/bench/store_micro.py [--repeat 7]

- encode: the store's one append path (`record.placed`) for a batch of 1 KiB messages the broker
  made itself (a tick's timer copies: each encoded by `record.encode_one`) against the same
  messages as a send brings them (edge records from `record.outgoing` + `record.received`: joined,
  not encoded; making them is the edge's and `received`'s work, not timed here).
- index: the dispatcher indexing an append as a one-queue run of its own (maps) against the same
  records in a shared mixed run (record by record), RocksDB write included: `writer.RUN_MIN` is
  where a run of its own starts to pay.

Each figure is the calling thread's CPU time (not wall time: the machine may be shared), the
minimum over `--repeat` repeats, in microseconds per record. Writes only to a temporary directory,
which it removes; runs for a few seconds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path

from broker.store.dispatcher import index_runs
from broker.store.index import Index
from broker.store.writer import AppendResult, AppendResults, Columns, Run
from common import record as R

BODY = (b"sluice-benchmark-" * 64)[:1024]
SIZES = (1, 2, 4, 8, 12, 16, 24, 32)


def per_record_us(fn: Callable[[], object], n: int, repeat: int) -> float:
    number = max(1, 4000 // n)
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.thread_time)) / (number * n) * 1e6


def encode_figures(repeat: int) -> None:
    print("encode (us per record)   broker-made        sent")
    for n in SIZES:
        recs = [
            R.MessageRecord(topic="bench", queue_id=0, body=BODY, message_id=f"{i:032x}", tag="bench",
                            born_timestamp_ms=1_700_000_000_000 + i, born_host="127.0.0.1:5000",
                            store_host="127.0.0.1:8081")
            for i in range(n)
        ]  # fmt: skip
        edges = [R.outgoing(BODY, r.message_id, tag=r.tag, born_timestamp_ms=r.born_timestamp_ms,
                            born_host=r.born_host) for r in recs]  # fmt: skip
        sent = R.received(edges, "bench", 0, "127.0.0.1:8081")
        made = per_record_us(lambda r=recs: R.placed(r, 1 << 24), n, repeat)  # type: ignore[misc]
        joined = per_record_us(lambda r=sent: R.placed(r, 1 << 24), n, repeat)  # type: ignore[misc]
        print(f"  {n:3d} records             {made:7.2f}  {joined:10.2f}")


def index_figures(repeat: int, directory: Path) -> None:
    index = Index(directory / "index", cache_bytes=64 << 20, write_buffer_bytes=128 << 20)
    next_offset = [0]

    def runs(n: int, own: bool) -> list[Run]:
        first = next_offset[0]
        next_offset[0] += n
        sizes = [1150] * n
        physs = list(accumulate(sizes, initial=first * 1150))[:-1]
        cols = Columns(["bench"] * n, [0] * n, [7] * n, [f"{first + i:032x}".encode() for i in range(n)], [()] * n)
        if own:
            return [Run(cols, AppendResults(range(first, first + n), physs, sizes, 1), ("bench", 0), 0)]
        return [Run(cols, [AppendResult(first + i, physs[i], 1150, 1) for i in range(n)], None, 0)]

    def timed(n: int, own: bool) -> float:
        best = float("inf")
        for _ in range(repeat):
            prepared = [runs(n, own) for _ in range(max(20, 2000 // n))]  # fresh, ascending ids
            t0 = time.thread_time()
            for r in prepared:
                index_runs(index, r)
            best = min(best, (time.thread_time() - t0) / (len(prepared) * n) * 1e6)
        return best

    try:
        print("index (us per record)       own run  shared run")
        for n in SIZES:
            print(f"  {n:3d} records             {timed(n, True):7.2f}  {timed(n, False):10.2f}")
    finally:
        index.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="sluice-micro-"))
    try:
        encode_figures(args.repeat)
        index_figures(args.repeat, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
