#!/usr/bin/env python3
"""Timer benchmark: how late DELAY messages become visible in their topic, on a real broker process.

    .venv/bin/python tests/bench/timer_bench.py [--burst 50000] [--steady-rate 2000] [--steady-seconds 10]
                                                [--pending 0] [--json]

A `sluice broker` child process (async flush, default `[broker.timer]` settings unless flags say
otherwise) is driven over loopback gRPC through `RemoteBroker`:

1. Burst: `--burst` timers all due at one whole second T, far enough ahead for the sends to finish
   first (`--burst-lead-s`). Target: every one visible within 2 s of T.
2. Steady: `--steady-rate` timers per second for `--steady-seconds`, each due `--steady-delay-ms`
   after it is sent (unaligned times, so the precision's rounding up is part of the lateness).
3. Optional (`--pending N`): N timers due in a day; the broker's RSS after every tenth of them
   (they live in RocksDB: RSS levels off at the memtable and block cache budget, it does not grow
   with N).

Lateness of a timer = store time of its copy in the topic (when it became visible) - its delivery
time, read back with `pull`. Reports p50/p99/max lateness per scenario, and for the burst the
broker process's CPU (user + system, /proc) per timer sent and per timer fired (from 0.5 s before
T until none is pending): the figures to compare on a shared machine,
where lateness is mostly other processes' load. The run stops by itself; the
child process is stopped by PID and the temp dir removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: make `tests.helpers` importable
    sys.path.insert(0, str(REPO_ROOT))

from broker.client.api import FilterSpec, TopicSpec  # noqa: E402
from broker.client.remote import RemoteBroker  # noqa: E402
from common.model import MessageType  # noqa: E402
from common.record import outgoing  # noqa: E402
from tests.helpers.broker_fixtures import start_broker_process  # noqa: E402

BROKER_NAME = "timer-bench"
QUEUES = 4
SEND_BATCH = 500
SEND_CONCURRENCY = 8
DRAIN_TIMEOUT_S = 120.0
BURST_TARGET_MS = 2_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def percentiles(values: list[int]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"count": len(s), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": s[-1], "min_ms": s[0]}


def delayed(mid: str, at_ms: int) -> bytes:
    return outgoing(body=b"x" * 128, message_id=mid, message_type=MessageType.DELAY, delivery_timestamp_ms=at_ms)


async def send_all(api: RemoteBroker, topic: str, messages: list[bytes]) -> None:
    batches = [messages[i : i + SEND_BATCH] for i in range(0, len(messages), SEND_BATCH)]
    queue = iter(enumerate(batches))

    async def worker() -> None:
        for i, batch in queue:
            await api.send(topic, i % QUEUES, batch)

    await asyncio.gather(*(worker() for _ in range(SEND_CONCURRENCY)))


async def drain(api: RemoteBroker, topic: str, expected: int) -> list[int]:
    """Wait until `expected` copies are visible; their lateness in ms."""
    await fired(api, topic)
    return await lateness(api, topic, expected)


async def fired(api: RemoteBroker, topic: str) -> None:
    """Wait until no timer of `topic` is pending."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while (await api.topic_status(topic)).pending_timers:
        if time.monotonic() > deadline:
            raise SystemExit(f"{topic}: timers still pending after {DRAIN_TIMEOUT_S} s")
        await asyncio.sleep(0.05)


async def lateness(api: RemoteBroker, topic: str, expected: int) -> list[int]:
    """The lateness in ms of the `expected` copies in `topic`, read back with `pull`."""
    late: list[int] = []
    for qid in range(QUEUES):
        offset = 0
        while True:
            res = await api.pull("timer-bench-reader", topic, qid, offset, 32, FilterSpec())
            late += [m.store_timestamp_ms - m.delivery_timestamp_ms for m in res.messages]
            if res.next_offset >= res.max_offset:
                break
            offset = res.next_offset
    if len(late) != expected:
        raise SystemExit(f"{topic}: {len(late)} timers delivered, {expected} expected")
    return late


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used: unlike lateness, not inflated by other
    processes on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def burst(api: RemoteBroker, n: int, lead_s: float, pid: int) -> dict[str, Any]:
    topic = "bench-burst"
    await api.create_topic(TopicSpec(topic, QUEUES, frozenset({MessageType.DELAY})))
    due = (now_ms() // 1000 + int(lead_s) + 1) * 1000
    messages = [delayed(f"b{i}", due) for i in range(n)]
    started, cpu0 = time.monotonic(), cpu_s(pid)
    await send_all(api, topic, messages)
    sent_s, cpu1 = time.monotonic() - started, cpu_s(pid)
    sent_before_due = now_ms() < due
    await asyncio.sleep(max(0.0, (due - now_ms()) / 1000 - 0.5))  # idle until just before T
    cpu2 = cpu_s(pid)
    await fired(api, topic)
    cpu3 = cpu_s(pid)  # the firing (and a status call every 50 ms)
    late = await lateness(api, topic, n)
    out = percentiles(late)
    out.update(send_s=round(sent_s, 2), sent_before_due=sent_before_due,
               all_within_target=max(late) <= BURST_TARGET_MS,
               broker_cpu_us_per_send=round((cpu1 - cpu0) * 1e6 / n, 1),
               broker_cpu_us_per_fire=round((cpu3 - cpu2) * 1e6 / n, 1))  # fmt: skip
    return out


async def steady(api: RemoteBroker, rate: int, seconds: float, delay_ms: int) -> dict[str, Any]:
    topic = "bench-steady"
    await api.create_topic(TopicSpec(topic, QUEUES, frozenset({MessageType.DELAY})))
    tick_s = 0.1
    per_tick = max(1, int(rate * tick_s))
    sent = 0
    start = time.monotonic()
    behind_ticks = 0
    tick = 0
    while time.monotonic() - start < seconds:
        batch = [delayed(f"s{sent + i}", now_ms() + delay_ms) for i in range(per_tick)]
        await api.send(topic, tick % QUEUES, batch)
        sent += len(batch)
        tick += 1
        wait = start + tick * tick_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            behind_ticks += 1
    achieved = round(sent / (time.monotonic() - start), 1)
    late = await drain(api, topic, sent)
    out = percentiles(late)
    out.update(sent=sent, achieved_rate=achieved, sender_behind_ticks=behind_ticks)
    return out


async def pending(api: RemoteBroker, pid: int, n: int) -> dict[str, Any]:
    """RSS as pending timers accumulate: RocksDB memtables and block cache are bounded, so it
    levels off instead of growing with the count."""
    topic = "bench-pending"
    await api.create_topic(TopicSpec(topic, QUEUES, frozenset({MessageType.DELAY})))
    rss = {0: round(rss_kib(pid) / 1024, 1)}
    at = now_ms() + 24 * 3600 * 1000
    step = max(1, n // 10)
    for start in range(0, n, step):
        end = min(n, start + step)
        await send_all(api, topic, [delayed(f"p{i}", at + i) for i in range(start, end)])
        rss[end] = round(rss_kib(pid) / 1024, 1)
    status = await api.topic_status(topic)
    return {"pending": status.pending_timers, "rss_mib_by_pending": rss}


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    settings: dict[str, Any] = {"name": BROKER_NAME, "timer": {"precision_ms": args.precision_ms}}
    proc = await asyncio.to_thread(
        start_broker_process, root, settings=settings, extra_args=["--flush", "async"], timeout_s=60.0
    )
    api = RemoteBroker(BROKER_NAME, proc.address, timeout_s=30.0)
    results: dict[str, Any] = {"precision_ms": args.precision_ms}
    try:
        if args.burst:
            results["burst"] = await burst(api, args.burst, args.burst_lead_s, proc.child.pid)
        if args.steady_rate and args.steady_seconds:
            results["steady"] = await steady(api, args.steady_rate, args.steady_seconds, args.steady_delay_ms)
        if args.pending:
            results["pending"] = await pending(api, proc.child.pid, args.pending)
    finally:
        await api.close()
        await asyncio.to_thread(proc.stop)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--burst", type=int, default=50_000, help="timers due in the same second (default 50000; 0 skips)")
    ap.add_argument("--burst-lead-s", type=float, default=20.0, help="how far ahead the burst is due (default 20)")
    ap.add_argument("--steady-rate", type=int, default=2_000, help="timers per second of the steady phase")
    ap.add_argument("--steady-seconds", type=float, default=10.0, help="length of the steady phase (0 skips)")
    ap.add_argument("--steady-delay-ms", type=int, default=2_000, help="delay of each steady timer (default 2000)")
    ap.add_argument("--pending", type=int, default=0, help="timers left pending a day ahead, for RSS (default 0)")
    ap.add_argument("--precision-ms", type=int, default=1_000, help="broker timer precision (default 1000)")
    ap.add_argument("--dir", type=Path, default=None, help="where data goes (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="timer-bench-"))
    try:
        results = asyncio.run(run(args, root))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, value in results.items():
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
