#!/usr/bin/env python3
"""The long fuzzing run: tests/e2e/support/fuzz.py against a merged and a separated Sluice.

    .venv/bin/python tests/bench/fuzz_bench.py [--requests 6000] [--workers 8] [--topology merged|separated|both]

Each topology is started as child processes on 127.0.0.1 (tests/e2e/support/cluster.py), gets a
topic and a group, and is sent `--requests` generated and byte-mutated requests, one per RPC in
turn, by `--workers` threads. Reported per topology: requests, answers by outcome
(`status:<Code>`, `grpc:<StatusCode>`, `hang`), the bad ones (INTERNAL or UNKNOWN of either kind,
a lost connection, a call that outlived its deadline: each must be 0), whether every process is
still running and stops cleanly, ERROR and WARNING lines in the server logs, and each server
process's anonymous memory (RssAnon) before the run, at its peak (sampled every 0.2 s) and after
10 s idle. The official client then sends and receives one message, to show the cluster still serves.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.e2e.support import fuzz, raw  # noqa: E402
from tests.e2e.support.cluster import Cluster, start_merged, start_separated  # noqa: E402

EXAMPLES_PER_ROUND = 20  # x 17 RPCs generated at a time (bodies past the limit are 4 MiB each)
IDLE_S = 10.0


def rss_anon_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler(threading.Thread):
    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {name: 0 for name in pids}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_anon_kib(pid))


def generate(target: fuzz.Target, examples: int) -> list[fuzz.Request]:
    out: list[fuzz.Request] = []

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.tuples(*(fuzz.requests(target, rpc) for rpc in sorted(fuzz.METHODS))))
    def draw(batch: tuple[fuzz.Request, ...]) -> None:
        out.extend(batch)

    draw()
    return out


def run_topology(kind: str, total: int, workers: int, root: Path) -> dict[str, object]:
    cluster: Cluster = start_merged(root) if kind == "merged" else start_separated(root)
    report: dict[str, object] = {"topology": kind}
    try:
        topic = cluster.create_topic(f"fuzz-bench-{kind}", queues=4)
        group = cluster.create_group(f"fuzz-bench-{kind}")
        target = fuzz.Target(cluster.first_proxy, topic, group, tuple(cluster.brokers))
        pids = {name: child.pid for name, child in cluster.processes.items()}
        time.sleep(2)
        before = {name: rss_anon_kib(pid) for name, pid in pids.items()}
        sampler = MemorySampler(pids)
        sampler.start()
        outcomes: collections.Counter[str] = collections.Counter()
        by_rpc: collections.Counter[tuple[str, str]] = collections.Counter()
        bad: list[tuple[fuzz.Request, str]] = []
        sent = 0
        started = time.monotonic()
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        with grpc.insecure_channel(target.address, options=options) as channel, ThreadPoolExecutor(workers) as pool:
            while sent < total:
                batch = generate(target, EXAMPLES_PER_ROUND)[: total - sent]
                for request, outcome in zip(batch, pool.map(lambda r: fuzz.call(channel, r), batch), strict=True):
                    outcomes[outcome] += 1
                    by_rpc[(request.rpc, outcome)] += 1
                    if fuzz.is_bad(outcome):
                        bad.append((request, outcome))
                sent += len(batch)
        elapsed = time.monotonic() - started
        time.sleep(IDLE_S)
        sampler.stop.set()
        sampler.join()
        after = {name: rss_anon_kib(pid) for name, pid in pids.items()}
        alive = {name: child.running() for name, child in cluster.processes.items()}
        with raw.stub(cluster.first_proxy) as s:
            ok = raw.send(s, raw.message(topic, b"after the fuzzing"))
            served = raw.code_name(ok.status.code)
        logs = "".join(child.output() for child in cluster.processes.values())
        report.update(
            requests=sent, seconds=round(elapsed, 1), outcomes=dict(outcomes.most_common()), bad=len(bad),
            bad_examples=[f"{r!r} -> {o}" for r, o in bad[:10]], alive=alive, send_after=served,
            error_lines=logs.count(" ERROR "), warning_lines=logs.count(" WARNING "),
            tracebacks=logs.count("Traceback"),
            memory_kib={name: {"before": before[name], "peak": sampler.peak[name], "after": after[name]}
                        for name in pids},
            by_rpc={f"{rpc} {o}": n for (rpc, o), n in sorted(by_rpc.items())},
        )  # fmt: skip
    finally:
        problems = cluster.stop()
        report["stop_problems"] = problems
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6000, help="requests per topology")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--topology", choices=("merged", "separated", "both"), default="both")
    args = parser.parse_args()
    kinds = ["merged", "separated"] if args.topology == "both" else [args.topology]
    failed = False
    with tempfile.TemporaryDirectory(prefix="sluice-fuzz-") as tmp:
        for kind in kinds:
            report = run_topology(kind, args.requests, args.workers, Path(tmp) / kind)
            by_rpc = report.pop("by_rpc")
            print(f"== {kind}")
            for key, value in report.items():
                print(f"  {key}: {value}")
            print("  by rpc and outcome:")
            for key, n in by_rpc.items():  # type: ignore[attr-defined]
                print(f"    {key}: {n}")
            failed |= bool(report["bad"]) or not all(report["alive"].values()) or bool(report["stop_problems"])  # type: ignore[attr-defined]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
