#!/usr/bin/env python3
"""Every core, no hop: `sluice up --shards N` for N = 1..cores, measured with `sluice bench` (issue 29).

    .venv/bin/python tests/bench/shards_bench.py [--seconds 6] [--max-shards N] [--json]

For each N it starts `sluice up --shards N --flush async` (its own data dir, free loopback ports;
the shards' client ports are printed) and runs, one after the other, against the client
ports of every shard (`--endpoint P0;P1;...`, 8 connections each):

- produce: `sluice bench produce --batch 32 --concurrency 32` (each shard keeps the sends it gets on
  its own broker, as it does for the official clients that follow a queue's endpoint);
- consume: `sluice bench consume` of the backlog (receive 32 per call, one ack per batch, 16 loops;
  each loop receives from a shard's queue over a connection to that shard, as the clients do);
- latency: `sluice bench produce --batch 1 --rate 1000` (p50 and p99 of one send at 1,000 msg/s).

Per row: messages/s, the ratio to N=1, server CPU µs per message (the `sluice up` process and all
its shards) and the forwarded calls the shards counted (`sluice_proxy_forwarded_calls_total` on
the parent's metrics endpoint). Every process is stopped by PID and the temp dir removed. Bounded:
about 3 x (seconds + 2) + 15 s per N.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from deploy.workerpool import available_cores  # noqa: E402
from tests.bench.workers_bench import (  # noqa: E402
    GROUP,
    LATENCY_RATE,
    QUEUES,
    START_TIMEOUT_S,
    TOPIC,
    admin,
    latency,
    sluice_bench,
    summary,
    wait_line,
)
from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402
from tests.helpers.procs import LOOPBACK, free_port, start_process  # noqa: E402


def forwarded(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "sluice_proxy_forwarded_calls_total")  # fmt: skip


def client_ports(output: str, port: int) -> list[int]:
    """The shards' client ports, from `sluice up`'s "... client ports P0, P1" line (one shard: `port`)."""
    match = re.search(r"client ports ([0-9, ]+)\)", output)
    return [int(p) for p in match.group(1).split(", ")] if match else [port]


def run(root: Path, shards: int, seconds: float, consumers: int = 16) -> dict[str, Any]:
    port, ns_port, broker_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--shards", str(shards), "--data-dir", str(root / f"s{shards}"), "--port", str(port),
            "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--flush", "async",
            "--console-port", "-1", "--metrics-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / f"up-s{shards}.log", name=f"up-s{shards}",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    try:
        wait_line(child, "proxy listening on")
        namesrv = f"{LOOPBACK}:{ns_port}"
        endpoint = ";".join(f"{LOOPBACK}:{p}" for p in client_ports(child.output(), port))
        admin(namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
        admin(namesrv, "group", "create", GROUP)
        before = forwarded(metrics_port)
        out: dict[str, Any] = {"produce": summary(sluice_bench("produce", endpoint, [child.pid], seconds, "--batch",
                                                               "32", "--concurrency", "32"), "send")}  # fmt: skip
        out["produce"]["forwarded"] = forwarded(metrics_port) - before
        before = forwarded(metrics_port)
        consume = sluice_bench("consume", endpoint, [child.pid], seconds, "--group", GROUP, "--concurrency",
                               str(consumers), "--receive-batch", "32")  # fmt: skip
        out["consume"] = summary(consume, "receive")
        out["consume"]["forwarded"] = forwarded(metrics_port) - before
        out["latency"] = latency(endpoint, [child.pid], seconds)
        return out
    finally:
        child.stop()


def report(curve: dict[int, dict[str, Any]]) -> list[str]:
    lines = ["shards  phase    msg/s     (xN=1)  server µs/msg  (xN=1)  server cores  forwarded calls"]
    base = curve[1]
    for n, r in curve.items():
        for phase in ("produce", "consume"):
            p, b = r[phase], base[phase]
            cpu, cpu_b = p["server_us_per_msg"] or 0.0, b["server_us_per_msg"] or 0.0
            ratio = p["messages_per_s"] / b["messages_per_s"]
            lines.append(f"{n:>6}  {phase:<7} {p['messages_per_s']:>9,.0f}  {ratio:>6.2f}"
                         f"  {cpu:>13.0f}  {cpu / cpu_b if cpu_b else 0:>6.2f}  {p['server_cores']!s:>12}"
                         f"  {p['forwarded']:>15,.0f}")  # fmt: skip
    lines.append(f"\nsend latency at {LATENCY_RATE} msg/s (B=1, spread over the shards' ports):")
    for n, r in curve.items():
        lat = r["latency"]
        lines.append(f"  {n} shard(s): p50 {lat['p50_ms']:.2f} ms  p99 {lat['p99_ms']:.2f} ms  "
                     f"({lat['messages_per_s']:,.0f} msg/s, {lat['errors']} errors)")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per phase (default 6)")
    ap.add_argument("--max-shards", type=int, default=available_cores(), help="largest N (default: the cores)")
    ap.add_argument("--consumers", type=int, default=16, help="consume loops in all (default 16)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-shards-bench-"))
    try:
        curve = {n: run(root, n, args.seconds, args.consumers) for n in range(1, max(1, args.max_shards) + 1)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(curve, indent=2))
        return 0
    print(f"shards bench: {os.cpu_count()} cores, {args.seconds:g} s per phase, 1 KiB messages, flush async, "
          "8 connections per shard; server µs/msg = CPU of sluice up and its shards per message\n")  # fmt: skip
    print("\n".join(report(curve)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
