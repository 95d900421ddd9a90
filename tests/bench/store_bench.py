#!/usr/bin/env python3
"""Storage-engine benchmark (issue: store performance), in one run on this machine.

    .venv/bin/python tests/bench/store_bench.py [--seconds 5] [--dir /path] [--json]

Measures: the raw disk baseline (sequential 1 KiB appends without fsync, and with one fsync per
256 KiB); store append throughput for 1 KiB messages from 64 concurrent appenders under the async
and sync flush policies (single-message appends, and batches of 32 as a batched send does), with
dispatch lag; read throughput of 32-message batches; and the index size for 1,000,000 queues with
one message each. Prints each figure and the ratios to the targets.

Method of the append phases: 64 appender tasks on the event loop the broker runs the store on
(uvloop, with the heap frozen once started, as processes/runtime.py does; `--runtime asyncio` gives
the plain asyncio loop and full collector this bench used before). Records are built before the
clock starts as a send brings them to the store (edge records: `record.outgoing` +
`record.received`, which the store joins, not encodes; building them is the edge's and the
broker's work) and reused, but each append gives its messages fresh ids, as producers' ids are
unique and ascend per producer: with reused ids the message-id index held ~20 copies of every id
and each insert walked past them (~0.9 us instead of ~0.3 us per entry, measured on RocksDB
alone), a cost no real workload has.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import operator
import os
import shutil
import sys
import tempfile
import time
from itertools import repeat
from pathlib import Path

from broker.store.config import CommitLogConfig, StoreConfig
from broker.store.store import MessageStore
from common.record import HEADER_SIZE, MessageRecord, outgoing, received
from processes.runtime import install_uvloop

MIB = 1 << 20
_COLUMNS = ("msgs_s", "mib_s", "p99_ms", "dispatch_lag_max_ms", "cpu_us_per_msg", "writer_cpu_us_per_msg")
BODY = (b"sluice-benchmark-" * 64)[:1024]
_drain = collections.deque[object](maxlen=0).extend  # consume an iterator in C
_EDGE = operator.attrgetter("edge")
_ID_AT = slice(HEADER_SIZE + len("bench"), HEADER_SIZE + len("bench") + 32)  # a 32-character id after the topic


def raw_baseline(directory: Path, seconds: float, fsync_every: int | None) -> dict[str, float]:
    path = directory / f"raw-{fsync_every or 'nofsync'}.bin"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    written = since_sync = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    try:
        while True:
            for _ in range(256):
                os.write(fd, BODY)
            written += 256 * len(BODY)
            since_sync += 256 * len(BODY)
            if fsync_every and since_sync >= fsync_every:
                os.fdatasync(fd)
                since_sync = 0
            if time.perf_counter() >= deadline:
                break
        if fsync_every:
            os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    elapsed = time.perf_counter() - t0
    return {"mib_s": written / MIB / elapsed, "appends_s": written / len(BODY) / elapsed}


def sent(topic: str, queue_id: int, ids: list[int]) -> list[MessageRecord]:
    """A send's records (`record(...)`'s messages), as the broker hands them to the store."""
    edges = [outgoing(BODY, f"{i:032x}", tag="bench", born_timestamp_ms=int(time.time() * 1000),
                      born_host="127.0.0.1:1") for i in ids]  # fmt: skip
    return received(edges, topic, queue_id, "127.0.0.1:8081")


def record(topic: str, queue_id: int, i: int, body: bytes = BODY) -> MessageRecord:
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        body=body,
        message_id=f"{i:032x}",
        tag="bench",
        born_timestamp_ms=int(time.time() * 1000),
        born_host="127.0.0.1:1",
    )


async def _appenders(store: MessageStore, seconds: float, appenders: int, batch: int, freeze: bool) -> dict[str, float]:
    count = 0
    latencies: list[float] = []

    # Records are built before the clock starts and reused: as a send brings them, encoded by its
    # edge (`outgoing`) and verified and placed by `received` (the broker's work per request, not
    # the store's), so the store joins and seals their edge buffers as it does a send's.
    pools = [
        [sent("bench", (worker + b) % 8, [worker * 10_000_000 + b * batch + j for j in range(batch)])
         for b in range(16)]
        for worker in range(appenders)
    ]  # fmt: skip
    suffixes = [f"{j:08x}" for j in range(batch)]
    if freeze:  # as the broker's runtime does once started (processes/runtime.py): no full GC passes
        gc.collect()  # over long-lived objects (here the record pools, which a broker does not have)
        gc.freeze()
    stop_at = time.perf_counter() + seconds

    async def one(worker: int) -> None:
        nonlocal count
        i = 0
        while time.perf_counter() < stop_at:
            recs = pools[worker][i % 16]  # a batch targets one queue, as a SendMessage batch does
            # Every message gets an id of its own, as producers' ids are: a reused id would make
            # the message-id index hold many copies of each id, which no real workload does.
            # (Built as prefix + precomputed suffix: ids of one producer ascend, as clients' do.)
            # (Written into the edge buffers too, which hold the id the store writes.)
            ids = list(map(str.__add__, repeat(f"{worker:08x}{i:016x}"), suffixes))
            _drain(map(setattr, recs, repeat("message_id"), ids))
            _drain(map(operator.setitem, map(_EDGE, recs), repeat(_ID_AT), map(str.encode, ids)))
            t = time.perf_counter()
            await store.append(recs)
            latencies.append(time.perf_counter() - t)
            i += 1
            count += batch

    writer_clock = time.pthread_getcpuclockid(store.writer.thread_id)
    t0 = time.perf_counter()
    cpu0, wcpu0 = time.process_time(), time.clock_gettime(writer_clock)
    await asyncio.gather(*(one(w) for w in range(appenders)))
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    store.wait_dispatched(60)
    drain_ms = (time.perf_counter() - t1) * 1000
    # CPU per message: the figure to compare on a busy machine, where wall-clock rates are noise.
    # The GIL serialises the store's Python work, so 1e6 / cpu_us_per_msg bounds msgs/s.
    cpu_us = (time.process_time() - cpu0) * 1e6 / max(count, 1)
    writer_cpu_us = (time.clock_gettime(writer_clock) - wcpu0) * 1e6 / max(count, 1)
    latencies.sort()
    return {
        "msgs_s": count / elapsed,
        "mib_s": count * len(BODY) / MIB / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "dispatch_lag_max_ms": float(store.dispatcher.max_lag_ms),
        "dispatch_drain_after_ms": drain_ms,
        "group_commit_avg_batch": count / max(store.writer.rounds, 1),
        "cpu_us_per_msg": cpu_us,
        "writer_cpu_us_per_msg": writer_cpu_us,
    }


def append_bench(directory: Path, policy: str, seconds: float, batch: int, runtime: str = "broker") -> dict[str, float]:
    d = directory / f"store-{policy}-{batch}"
    cfg = StoreConfig(commitlog=CommitLogConfig(flush_policy=policy))  # type: ignore[arg-type]
    store = MessageStore(d, cfg)
    try:
        if runtime == "broker":  # the event loop the broker runs the store on (processes/runtime.py)
            install_uvloop()
        else:
            asyncio.set_event_loop_policy(None)
        return asyncio.run(_appenders(store, seconds, 64, batch, freeze=runtime == "broker"))
    finally:
        gc.unfreeze()
        store.close()
        shutil.rmtree(d, ignore_errors=True)


def read_bench(directory: Path, seconds: float) -> dict[str, float]:
    d = directory / "store-read"
    store = MessageStore(d, StoreConfig())
    try:
        total = 200_000
        for start in range(0, total, 1000):
            store.append_blocking([record("rb", i % 8, i) for i in range(start, start + 1000)])
        store.wait_dispatched(60)
        count = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for q in range(8):
                offset = 0
                while True:
                    res = store.read("rb", q, offset, max_messages=32)
                    if not res.messages:
                        break
                    count += len(res.messages)
                    offset = res.next_offset
        elapsed = time.perf_counter() - t0
        return {"msgs_s": count / elapsed, "mib_s": count * len(BODY) / MIB / elapsed}
    finally:
        store.close()
        shutil.rmtree(d, ignore_errors=True)


def many_queues_bench(directory: Path, queues: int) -> dict[str, float]:
    d = directory / "store-queues"
    store = MessageStore(d, StoreConfig())
    try:
        t0 = time.perf_counter()
        per_topic = 1000
        batch: list[MessageRecord] = []
        for i in range(queues):
            batch.append(record(f"t{i // per_topic}", i % per_topic, i, body=b"x" * 16))
            if len(batch) == 2000:
                store.append_blocking(batch)
                batch = []
        if batch:
            store.append_blocking(batch)
        store.wait_dispatched(120)
        elapsed = time.perf_counter() - t0
        store.index.db.flush()
        for name in store.index._cf:
            store.index.cf(name).compact_range(None, None)
        index_bytes = sum(f.stat().st_size for f in (d / "index").rglob("*") if f.is_file())
        ok = store.read("t999", 999, 0).messages[0].body == b"x" * 16 if queues >= 1_000_000 else True
        return {"queues": queues, "index_mib": index_bytes / MIB, "seconds": elapsed, "spot_check_ok": ok}
    finally:
        store.close()
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each timed phase")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /tmp)")
    ap.add_argument("--queues", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--runtime",
        choices=("broker", "asyncio"),
        default="broker",
        help="appenders' event loop: as the broker runs (uvloop, heap frozen after start-up; default)"
        " or plain asyncio with the collector scanning everything (how this bench measured before)",
    )
    ap.add_argument(
        "--phases",
        default="",
        help="comma-separated phases to run (default all), e.g. append_async_batch32,append_sync_batch32;"
        " the target summary needs all of them",
    )
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sluice-bench-", dir=args.dir))
    results: dict[str, dict[str, float]] = {}
    try:
        steps = [
            ("raw_nofsync", lambda: raw_baseline(base, args.seconds, None)),
            ("raw_fsync_256k", lambda: raw_baseline(base, args.seconds, 256 * 1024)),
            ("append_async_single", lambda: append_bench(base, "async", args.seconds, 1, args.runtime)),
            ("append_async_batch32", lambda: append_bench(base, "async", args.seconds, 32, args.runtime)),
            ("append_sync_single", lambda: append_bench(base, "sync", args.seconds, 1, args.runtime)),
            ("append_sync_batch32", lambda: append_bench(base, "sync", args.seconds, 32, args.runtime)),
            ("read_batch32", lambda: read_bench(base, args.seconds)),
            ("many_queues", lambda: many_queues_bench(base, args.queues)),
        ]
        wanted = {p for p in args.phases.split(",") if p}
        unknown = wanted - {name for name, _ in steps}
        if unknown:
            ap.error(f"unknown phases: {', '.join(sorted(unknown))}")
        for name, fn in steps:
            if wanted and name not in wanted:
                continue
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = fn()
            print(f"  {name}: " + ", ".join(f"{k}={v:,.1f}" for k, v in results[name].items()), file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if wanted:
        print(json.dumps(results, indent=2))
        return 0
    raw_nf, raw_fs = results["raw_nofsync"]["mib_s"], results["raw_fsync_256k"]["mib_s"]
    best_async = max(results["append_async_single"], results["append_async_batch32"], key=lambda r: r["msgs_s"])
    best_sync = max(results["append_sync_single"], results["append_sync_batch32"], key=lambda r: r["msgs_s"])
    checks = {
        "async >= 100k msgs/s": (best_async["msgs_s"], 100_000),
        "async MiB/s >= 0.5 x raw no-fsync": (best_async["mib_s"] / raw_nf, 0.5),
        "sync MiB/s >= 0.5 x raw fsync/256KiB": (best_sync["mib_s"] / raw_fs, 0.5),
        "dispatch lag (async) < 100 ms": (100.0, best_async["dispatch_lag_max_ms"]),
        "dispatch lag (sync) < 100 ms": (100.0, best_sync["dispatch_lag_max_ms"]),
        "1M queues index < 200 MiB": (200.0, results["many_queues"]["index_mib"]),
    }
    summary = {name: {"value": a, "target": b, "met": a >= b} for name, (a, b) in checks.items()}
    if args.json:
        print(json.dumps({"results": results, "targets": summary}, indent=2))
    else:
        print(f"\n{'phase':<24}" + "".join(f"{k:>22}" for k in _COLUMNS))
        for name, r in results.items():
            print(f"{name:<24}" + "".join(f"{r.get(k, float('nan')):>22,.1f}" for k in _COLUMNS))
        print("\ntargets:")
        for name, s in summary.items():
            print(f"  {'MET ' if s['met'] else 'MISS'} {name}: {s['value']:,.2f} vs {s['target']:,.2f}")
        print(
            f"  (raw no-fsync {raw_nf:,.0f} MiB/s, raw fsync/256KiB {raw_fs:,.0f} MiB/s;"
            f" median group-commit batch async {best_async['group_commit_avg_batch']:.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
