#!/usr/bin/env python3
"""Broker benchmark: the Cluster `BrokerApi` (RemoteBroker → broker child process over loopback gRPC)
beside the Local one (LocalBroker in this process), in one run on this machine.

    .venv/bin/python tests/bench/broker_bench.py [--seconds 5] [--concurrency 16] [--flush async] [--json]

Both backends run at once, each on a fresh data dir. Send: `--concurrency` tasks send batches of
`--batch` 1 KiB messages (one batch per call, to one queue) for `--seconds` per backend. Pop+ack:
as many tasks pop up to `--batch` messages and ack them, for `--seconds` or until everything sent
was consumed. Each phase runs in `--slices` slices alternating Local and Cluster, so other load on
the machine hits both alike. Reports messages/s, MiB/s and the p50/p99 latency of one send call or
one pop+ack cycle, and the Cluster/Local throughput ratios against the target (>= 0.5). The broker
child uses the async flush policy unless `--flush sync`. The run stops by itself; the child
process is stopped by PID and the temp dir removed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: make `tests.helpers` importable
    sys.path.insert(0, str(REPO_ROOT))

from broker.client.api import BrokerApi, ConsumeFrom, GroupSpec, PopRequest, TopicSpec  # noqa: E402
from broker.client.remote import RemoteBroker  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.local import LocalBroker  # noqa: E402
from common.config import load_config  # noqa: E402
from common.record import outgoing  # noqa: E402
from processes.runtime import install_uvloop  # noqa: E402
from tests.helpers.broker_fixtures import start_broker_process  # noqa: E402

MIB = 1 << 20
TARGET_RATIO = 0.5
TOPIC, GROUP, QUEUES = "bench", "bench-consumers", 8
BROKER_NAME = "bench-broker"
INVISIBLE_MS = 60_000
DRAIN_WAIT_S = 30.0
SETUP_TIMEOUT_S = 60.0


@dataclass
class Phase:
    messages: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    slice_rates: list[float] = field(default_factory=list)  # msgs/s of each slice added

    def summary(self, body_bytes: int) -> dict[str, float]:
        lat = sorted(self.latencies_s) or [0.0]
        rate = self.messages / self.seconds if self.seconds else 0.0
        return {
            "msgs_s": rate,
            "mib_s": rate * body_bytes / MIB,
            "p50_ms": lat[len(lat) // 2] * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
            "calls": float(len(self.latencies_s)),
            "messages": float(self.messages),
        }

    def add(self, other: Phase) -> None:
        self.slice_rates.append(other.messages / other.seconds if other.seconds else 0.0)
        self.messages += other.messages
        self.seconds += other.seconds
        self.latencies_s += other.latencies_s


async def run_workers(concurrency: int, worker: Callable[[int, Phase], Awaitable[None]]) -> Phase:
    phase = Phase()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w, phase) for w in range(concurrency)))
    phase.seconds = time.perf_counter() - t0
    return phase


_ids = itertools.count()


async def send_slice(api: BrokerApi, args: argparse.Namespace, seconds: float, body: bytes) -> Phase:
    stop_at = time.perf_counter() + seconds

    async def worker(w: int, phase: Phase) -> None:
        for i in itertools.count():
            if time.perf_counter() >= stop_at:
                return
            batch = [outgoing(body, f"{next(_ids):032X}", tag="bench") for _ in range(args.batch)]
            t = time.perf_counter()
            await api.send(TOPIC, (w + i) % QUEUES, batch)
            phase.latencies_s.append(time.perf_counter() - t)
            phase.messages += len(batch)

    return await run_workers(args.concurrency, worker)


async def pop_ack_slice(api: BrokerApi, args: argparse.Namespace, seconds: float, available: int) -> Phase:
    stop_at = time.perf_counter() + seconds
    request = PopRequest(GROUP, TOPIC, max_messages=args.batch, invisible_ms=INVISIBLE_MS)

    async def worker(w: int, phase: Phase) -> None:
        while time.perf_counter() < stop_at and phase.messages < available:
            t = time.perf_counter()
            messages = await api.pop(request)
            if not messages:
                return  # drained
            results = await api.ack(GROUP, TOPIC, [m.receipt_handle for m in messages])
            phase.latencies_s.append(time.perf_counter() - t)
            assert all(r.ok for r in results), "an ack failed during the benchmark"
            phase.messages += len(messages)

    return await run_workers(args.concurrency, worker)


async def wait_stored(api: BrokerApi, count: int) -> None:
    deadline = time.monotonic() + DRAIN_WAIT_S
    while sum(q.max_offset for q in (await api.topic_status(TOPIC)).queues) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} sent messages not visible within {DRAIN_WAIT_S} s")
        await asyncio.sleep(0.05)


async def setup(api: BrokerApi) -> None:
    await api.create_topic(TopicSpec(TOPIC, QUEUES))
    await api.create_group(GroupSpec(GROUP, consume_from=ConsumeFrom.EARLIEST))


@asynccontextmanager
async def local_backend(root: Path, flush: str) -> AsyncIterator[BrokerApi]:
    table = {"name": BROKER_NAME, "data_dir": str(root / "local"), "store": {"commitlog": {"flush_policy": flush}}}
    broker = LocalBroker(load_config(BrokerConfig, section="broker", data={"broker": table}))
    await asyncio.wait_for(broker.start(), SETUP_TIMEOUT_S)
    try:
        yield broker
    finally:
        await asyncio.wait_for(broker.close(), SETUP_TIMEOUT_S)


@asynccontextmanager
async def cluster_backend(root: Path, flush: str) -> AsyncIterator[BrokerApi]:
    proc = await asyncio.to_thread(
        start_broker_process,
        root / "cluster",
        name=BROKER_NAME,
        extra_args=("--flush", flush, "--log-level", "warning"),
    )
    try:
        async with RemoteBroker(BROKER_NAME, proc.address, timeout_s=30.0) as remote:
            yield remote
    finally:
        await asyncio.to_thread(proc.stop)


async def run(args: argparse.Namespace, root: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Both backends up at once; each phase runs in `--slices` slices alternating local and cluster,
    so load from elsewhere on the machine hits both alike."""
    body = (b"sluice-broker-bench-" * 64)[: args.body_bytes]
    slice_s = args.seconds / args.slices
    async with local_backend(root, args.flush) as local, cluster_backend(root, args.flush) as cluster:
        backends: dict[str, BrokerApi] = {"local": local, "cluster": cluster}
        sent = {name: Phase() for name in backends}
        popped = {name: Phase() for name in backends}
        for api in backends.values():
            await setup(api)
        print("send ...", file=sys.stderr, flush=True)
        for _ in range(args.slices):
            for name, api in backends.items():
                sent[name].add(await send_slice(api, args, slice_s, body))
        for name, api in backends.items():
            await wait_stored(api, sent[name].messages)
        print("pop+ack ...", file=sys.stderr, flush=True)
        for _ in range(args.slices):
            for name, api in backends.items():
                left = sent[name].messages - popped[name].messages
                if left > 0:
                    popped[name].add(await pop_ack_slice(api, args, slice_s, left))
    results = {
        name: {"send": sent[name].summary(len(body)), "pop_ack": popped[name].summary(len(body))} for name in backends
    }
    for phase, runs in (("send", sent), ("pop_ack", popped)):
        pairs = [c / lo for lo, c in zip(runs["local"].slice_rates, runs["cluster"].slice_rates, strict=False) if lo]
        results["cluster"][phase]["paired_ratio_median"] = statistics.median(pairs) if pairs else 0.0
    return results


def report(results: dict[str, dict[str, dict[str, float]]], args: argparse.Namespace) -> dict[str, Any]:
    ratios = {
        phase: results["cluster"][phase]["msgs_s"] / max(results["local"][phase]["msgs_s"], 1e-9)
        for phase in ("send", "pop_ack")
    }
    paired = {phase: results["cluster"][phase]["paired_ratio_median"] for phase in ("send", "pop_ack")}
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"},
        "results": results,
        "ratios": {
            p: {"value": r, "target": TARGET_RATIO, "met": r >= TARGET_RATIO, "paired_slices_median": paired[p]}
            for p, r in ratios.items()
        },
    }


def print_table(summary: dict[str, Any]) -> None:
    cfg = summary["config"]
    print(f"\n{cfg['body_bytes']} B messages, batches of {cfg['batch']}, {cfg['concurrency']} tasks, "
          f"{cfg['seconds']} s per phase, flush={cfg['flush']}\n")  # fmt: skip
    cols = ("msgs_s", "mib_s", "p50_ms", "p99_ms", "calls")
    print(f"{'backend':<9}{'phase':<9}" + "".join(f"{c:>12}" for c in cols))
    for phase in ("send", "pop_ack"):
        for backend in ("local", "cluster"):
            r = summary["results"][backend][phase]
            print(f"{backend:<9}{phase:<9}" + "".join(f"{r[c]:>12,.1f}" for c in cols))
    print("\nCluster / Local throughput (target >= 50%):")
    for phase, ratio in summary["ratios"].items():
        print(f"  {'MET ' if ratio['met'] else 'MISS'} {phase}: {ratio['value']:.0%}"
              f" (median of the {cfg['slices']} paired slices: {ratio['paired_slices_median']:.0%})")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each timed phase (default 5)")
    ap.add_argument("--slices", type=int, default=5, help="alternations of local and cluster per phase (default 5)")
    ap.add_argument("--concurrency", type=int, default=16, help="concurrent sender / consumer tasks (default 16)")
    ap.add_argument("--batch", type=int, default=32, help="messages per send and per pop (default 32)")
    ap.add_argument("--body-bytes", type=int, default=1024, help="message body size (default 1024)")
    ap.add_argument("--flush", choices=("async", "sync"), default="async", help="commit log flush policy")
    ap.add_argument("--dir", type=Path, default=None, help="where data goes (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = ap.parse_args()
    if (
        args.seconds <= 0
        or args.slices <= 0
        or args.concurrency <= 0
        or not 1 <= args.batch <= 32
        or args.body_bytes <= 0
    ):
        ap.error("--seconds, --slices, --concurrency and --body-bytes must be positive, --batch within 1..32")
    root = Path(tempfile.mkdtemp(prefix="sluice-broker-bench-", dir=args.dir))
    install_uvloop()  # as in the proxy and broker processes
    budget_s = 4 * args.seconds + 2 * (SETUP_TIMEOUT_S + DRAIN_WAIT_S)
    try:
        results = asyncio.run(asyncio.wait_for(run(args, root), budget_s))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = report(results, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
