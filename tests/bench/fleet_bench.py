#!/usr/bin/env python3
"""Proxy fleet benchmark (issue 5: tests and performance), in one run on this machine.

    .venv/bin/python tests/bench/fleet_bench.py [--seconds 10] [--concurrency 64] [--seed N] [--json]

Starts the shipped separated topology (`deploy/topologies/separated.toml`: 1 NameServer, 1 navigation
server, broker-a and broker-b with async flush, proxy-a with 1 worker, proxy-b with `--workers 2`)
with `sluice cluster up --port-offset N` (N chosen so every port is free; support in
tests/e2e/support/fleet.py), creates the topic with `sluice admin`, then runs one
`sluice bench produce --max` child process (1 message per SendMessage, as the official clients
send, `--concurrency` calls in flight) per phase:

    phase      --endpoint                 what it shows
    proxy-a    proxy-a                    one proxy, 1 worker
    proxy-b    proxy-b                    one proxy, 2 workers (SO_REUSEPORT) — workers 2 vs 1
    both       proxy-a;proxy-b            the fleet: one generator whose tasks alternate the two
                                          endpoints — aggregate vs one proxy, and the spread

The spread of requests is counted on the bench side (`calls_per_endpoint` in `sluice bench --json`):
the proxies' `/metrics` carries no request counter yet, only the process collector, so from
`/metrics` the script takes each proxy process's `process_cpu_seconds_total` (every worker's
metrics port) before and after each phase: the servers' side of the spread, as CPU. The bench
also reports the CPU of every server process (`--watch-pids`: the topology's processes and
proxy-b's workers), of the generator and of everything else on the machine — on 2 shared cores,
read `other cores` before any other figure.

Target, printed MET/MISS: in the `both` phase neither proxy carries more than 60% of the requests.
Ratios (informational): aggregate `both` ÷ `proxy-a`, `both` ÷ `proxy-b`, and `proxy-b` ÷ `proxy-a`
(2 workers vs 1). Prints a table, then the whole result as JSON (`--json`: only the JSON). Stops by
itself; the cluster is stopped through its supervisor (by PID), every process checked gone, and
the temp dir removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.cpu import process_tree  # noqa: E402
from tests.e2e.support.fleet import Fleet, start_fleet  # noqa: E402

SLUICE = [sys.executable, "-m", "sluice"]
TOPIC = "fleet-bench"
QUEUES = 8
WARMUP_S = 1.0
# Connections per endpoint. SO_REUSEPORT hands each connection to one worker, so one connection would
# leave proxy-b's second worker idle; 8 put both to work (the table shows each worker's cores).
CHANNELS = 8
BENCH_TIMEOUT_MARGIN_S = 60.0
HTTP_TIMEOUT_S = 3.0
SPREAD_TARGET = 0.60
PROXIES = ("proxy-a", "proxy-b")


@dataclass
class Phase:
    name: str
    endpoints: list[str]
    result: dict[str, Any]  # what `sluice bench --json` printed
    worker_cpu_s: dict[str, list[float]]  # per process of the topology, per worker, from /metrics
    wall_s: float
    load_avg: float

    @property
    def cpu_s(self) -> dict[str, float]:
        return {name: sum(workers) for name, workers in self.worker_cpu_s.items()}

    @property
    def proxy_cpu_s(self) -> dict[str, float]:
        return {p: self.cpu_s[p] for p in PROXIES}

    @property
    def broker_cores(self) -> float:
        return sum(v for k, v in self.cpu_s.items() if k.startswith("broker-")) / self.wall_s

    def busy_cores(self) -> float:
        """Cores in use on the machine while measuring: servers, generator and everything else."""
        cpu = self.result.get("cpu") or {}
        return float(sum(cpu.get(k, 0.0) for k in ("watched_cores", "generator_cores", "other_cores")))

    def proxy_us_per_call(self) -> float:
        """Proxy CPU per SendMessage call, all proxies together (calls and CPU over the whole bench run)."""
        calls = sum(self.result.get("calls_per_endpoint", {}).values())
        return 1e6 * sum(self.proxy_cpu_s.values()) / calls if calls else 0.0

    @property
    def send(self) -> dict[str, Any]:
        meter: dict[str, Any] = self.result["meters"]["send"]
        return meter

    def call_shares(self) -> dict[str, float]:
        calls: dict[str, int] = self.result.get("calls_per_endpoint", {})
        total = sum(calls.values())
        return {ep: n / total for ep, n in calls.items()} if total else {}

    def as_json(self) -> dict[str, Any]:
        return {
            "phase": self.name, "endpoints": self.endpoints, "load_avg_1m": self.load_avg,
            "wall_s": round(self.wall_s, 2),
            "cpu_s": {k: round(v, 3) for k, v in self.cpu_s.items()},
            "cores": {k: round(v / self.wall_s, 3) for k, v in self.cpu_s.items()},
            "proxy_worker_cores": {p: [round(v / self.wall_s, 3) for v in self.worker_cpu_s[p]] for p in PROXIES},
            "proxy_us_per_call": round(self.proxy_us_per_call(), 1),
            "busy_cores": round(self.busy_cores(), 2),
            "call_shares": {k: round(v, 4) for k, v in self.call_shares().items()},
            "bench": self.result,
        }  # fmt: skip


# -- the fleet ------------------------------------------------------------------------------------


def cpu_seconds(port: int) -> list[float]:
    """`process_cpu_seconds_total` from one metrics endpoint: each worker's (label `worker`, in
    index order) where the process has workers (their supervisor's own few polls are left out),
    else the process's own."""
    own: list[float] = []
    workers: dict[int, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HTTP_TIMEOUT_S) as answer:
        for family in text_string_to_metric_families(answer.read().decode()):
            if family.name == "process_cpu_seconds":
                for sample in family.samples:
                    if "worker" in sample.labels:
                        workers[int(sample.labels["worker"])] = sample.value
                    else:
                        own.append(sample.value)
    if workers:
        return [workers[i] for i in sorted(workers)]
    if own:
        return own
    raise RuntimeError(f"no process_cpu_seconds_total on :{port}/metrics")


def process_cpu(fleet: Fleet) -> dict[str, list[float]]:
    """CPU seconds so far of every process of the topology, per worker, from /metrics."""
    return {p["name"]: cpu_seconds(int(fleet.record(p["name"])["ports"]["metrics_port"]))
            for p in fleet.state()["processes"]}  # fmt: skip


def server_pids(fleet: Fleet) -> list[int]:
    """Every process of the topology, with the workers of proxies started with --workers."""
    return [pid for proc in fleet.state()["processes"] for pid in process_tree(int(proc["pid"]))]


# -- measuring ------------------------------------------------------------------------------------


def bench(fleet: Fleet, name: str, proxies: list[str], args: argparse.Namespace) -> Phase:
    endpoints = [fleet.endpoint(p) for p in proxies]
    # --ignore-routes: the phase's proxies take every call (a route may name the other proxy).
    argv = [*SLUICE, "bench", "produce", "--endpoint", ";".join(endpoints), "--ignore-routes", "--topic", TOPIC,
            "--max", "--batch", "1", "--size", str(args.size), "--concurrency", str(args.concurrency),
            "--channels", str(args.channels),
            "--duration", f"{args.seconds:g}", "--warmup", f"{WARMUP_S:g}", "--json", "--quiet",
            "--watch-pids", ",".join(map(str, server_pids(fleet)))]  # fmt: skip
    before = process_cpu(fleet)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          timeout=args.seconds + WARMUP_S + BENCH_TIMEOUT_MARGIN_S)  # fmt: skip
    wall_s = time.monotonic() - started
    after = process_cpu(fleet)
    if not done.stdout.strip():
        raise RuntimeError(f"sluice bench ({name}) exited {done.returncode} without a result: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    used = {n: [a - b for a, b in zip(after[n], before[n], strict=True)] for n in after}
    phase = Phase(name, endpoints, result, used, wall_s, os.getloadavg()[0])
    if not args.json:
        print(f"  {name:8} {phase.send['messages_per_s']:>9,.0f} msg/s  p50 {phase.send['latency_ms']['p50']:.2f} ms"
              f"  errors {result['error_total']}", file=sys.stderr, flush=True)  # fmt: skip
    return phase


def summarize(phases: dict[str, Phase], fleet: Fleet) -> dict[str, Any]:
    rate = {n: float(p.send["messages_per_s"]) for n, p in phases.items()}
    both = phases["both"]
    shares = both.call_shares()
    by_proxy = {p: shares.get(fleet.endpoint(p), 0.0) for p in PROXIES}
    cpu_total = sum(both.proxy_cpu_s.values())
    cpu_shares = {p: (both.proxy_cpu_s[p] / cpu_total if cpu_total else 0.0) for p in PROXIES}
    worst = max(by_proxy.values()) if by_proxy else 1.0
    return {
        "aggregate_vs_proxy_a": round(rate["both"] / rate["proxy-a"], 3) if rate["proxy-a"] else None,
        "aggregate_vs_proxy_b": round(rate["both"] / rate["proxy-b"], 3) if rate["proxy-b"] else None,
        "workers_2_vs_1": round(rate["proxy-b"] / rate["proxy-a"], 3) if rate["proxy-a"] else None,
        "spread_requests": {p: round(v, 4) for p, v in by_proxy.items()},
        "spread_cpu": {p: round(v, 4) for p, v in cpu_shares.items()},
        "spread_target": {"max_share": SPREAD_TARGET, "worst": round(worst, 4), "met": worst <= SPREAD_TARGET},
    }


def render(phases: dict[str, Phase], summary: dict[str, Any], fleet: Fleet, args: argparse.Namespace) -> str:
    cols = ("phase", "proxies", "msg/s", "p50 ms", "p99 ms", "errors", "calls a/b %", "proxy a/b cores",
            "b workers", "proxy us/call", "broker cores", "gen cores", "other cores", "load")  # fmt: skip
    rows = []
    for p in phases.values():
        shares = p.call_shares()
        calls = "/".join(f"{100 * shares.get(fleet.endpoint(x), 0.0):.0f}" for x in PROXIES)
        cpu = p.result.get("cpu") or {}
        rows.append((
            p.name, "+".join(x for x in PROXIES if fleet.endpoint(x) in p.endpoints),
            f"{p.send['messages_per_s']:,.0f}", f"{p.send['latency_ms']['p50']:.2f}",
            f"{p.send['latency_ms']['p99']:.2f}",
            str(p.result["error_total"]), calls,
            "/".join(f"{p.proxy_cpu_s[x] / p.wall_s:.2f}" for x in PROXIES),
            "+".join(f"{v / p.wall_s:.2f}" for v in p.worker_cpu_s["proxy-b"]), f"{p.proxy_us_per_call():,.0f}",
            f"{p.broker_cores:.2f}",
            f"{cpu.get('generator_cores', 0.0):.2f}", f"{cpu.get('other_cores', 0.0):.2f}", f"{p.load_avg:.1f}",
        ))  # fmt: skip
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells: tuple[str, ...]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs).rstrip()

    t = summary["spread_target"]
    req, cpu_share = summary["spread_requests"], summary["spread_cpu"]
    out = [
        f"fleet bench: produce --max, batch 1, {args.size}-byte bodies, concurrency {args.concurrency}, "
        f"{args.channels} connections per endpoint, "
        f"{args.seconds:g} s per phase after {WARMUP_S:g} s warm-up; proxy-a 1 worker, proxy-b 2 workers; "
        f"{os.cpu_count()} cores",
        "",
        line(cols),
        *(line(r) for r in rows),
        "",
        f"aggregate (both) vs proxy-a alone: x{summary['aggregate_vs_proxy_a']}; vs proxy-b alone: "
        f"x{summary['aggregate_vs_proxy_b']}",
        f"--workers 2 (proxy-b) vs --workers 1 (proxy-a): x{summary['workers_2_vs_1']}",
        f"spread in 'both': requests (bench side) proxy-a {100 * req['proxy-a']:.1f}% / proxy-b "
        f"{100 * req['proxy-b']:.1f}%; proxy CPU (/metrics) {100 * cpu_share['proxy-a']:.1f}% / "
        f"{100 * cpu_share['proxy-b']:.1f}%",
        f"machine: {', '.join(f'{p.name} {p.busy_cores():.2f}' for p in phases.values())} of {os.cpu_count()} "
        "cores busy (servers + generator + everything else) while measuring; a proxy costs "
        f"{phases['proxy-a'].proxy_us_per_call():,.0f} us of CPU per call alone, so a proxy worker alone on a core "
        f"would carry about {1e6 / max(phases['proxy-a'].proxy_us_per_call(), 1.0):,.0f} calls/s",
        f"target: neither proxy carries more than {100 * t['max_share']:.0f}% of the requests: "
        f"{'MET' if t['met'] else 'MISS'} (worst {100 * t['worst']:.1f}%)",
        "requests are counted by the generator per endpoint (calls_per_endpoint, warm-up included): the "
        "proxies' /metrics has no request counter yet, so /metrics gives the CPU view only",
    ]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase (default 10)")
    parser.add_argument("--concurrency", type=int, default=64, help="calls in flight (default 64)")
    parser.add_argument("--size", type=int, default=1024, help="message body bytes (default 1024)")
    parser.add_argument("--channels", type=int, default=CHANNELS,
                        help=f"connections per endpoint (default {CHANNELS}: the kernel spreads connections, "
                             "not calls, over a proxy's workers)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="seed of the port offset search (default: pid)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sluice-fleet-bench-"))
    fleet: Fleet | None = None
    problems: list[str] = []
    try:
        fleet = start_fleet(root / "cluster", restart_delay_s=None, seed=args.seed)
        if not args.json:
            print(f"cluster up in {fleet.run_dir} (port offset {fleet.port_offset})", file=sys.stderr, flush=True)
        fleet.admin("topic", "create", TOPIC, "--type", "normal", "--queues", str(QUEUES))
        phases = {
            name: bench(fleet, name, proxies, args)
            for name, proxies in (("proxy-a", ["proxy-a"]), ("proxy-b", ["proxy-b"]), ("both", list(PROXIES)))
        }
        summary = summarize(phases, fleet)
        document = {
            "topology": "deploy/topologies/separated.toml", "port_offset": fleet.port_offset,
            "options": {"seconds": args.seconds, "concurrency": args.concurrency, "size": args.size, "batch": 1},
            "phases": [p.as_json() for p in phases.values()], "summary": summary,
        }  # fmt: skip
        if not args.json:
            print(render(phases, summary, fleet, args), flush=True)
            print(flush=True)
        print(json.dumps(document, indent=2), flush=True)
    finally:
        if fleet is not None:
            problems = fleet.stop()
        shutil.rmtree(root, ignore_errors=True)
    for problem in problems:
        print(f"teardown: {problem}", file=sys.stderr, flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
