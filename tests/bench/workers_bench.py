#!/usr/bin/env python3
"""Every core: `sluice up --workers N` for N = 1..cores, measured with `sluice bench` (issue 17).

    .venv/bin/python tests/bench/workers_bench.py [--seconds 6] [--max-workers N] [--json]

For each N it starts the merged topology (`sluice up --shards 1 --workers N --flush async`, its own data dir,
free loopback ports), then runs, one after the other:

- produce: `sluice bench produce --batch 32` (32 calls in flight over 8 connections: the kernel hands
  each connection to one worker, so one connection would keep one worker busy and the rest idle);
- consume: `sluice bench consume` of the backlog the produce phase left (receive 32 per call, one
  AckMessage per batch, 16 loops over 8 connections);
- latency: `sluice bench produce --batch 1 --rate 1000` (p50 and p99 of one send at a steady 1,000
  messages/s, what an application with modest traffic sees).

`sluice bench --watch-pids` counts the server's CPU (the `sluice up` process and its workers). Last,
the separated topology on this machine (`sluice nameserver`, `sluice broker`, `sluice proxy
--workers 1`) runs the latency phase too, for the cost of the extra hop. Prints the scaling curve
(messages/s and ratio to N=1 per phase), consume/produce at the default N, and the latency figures.
Every process is stopped by PID and the temp dir removed. Bounded: about (3 phases x (seconds + 2)
+ 10 s start-up) per N.
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
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from processes.workerpool import available_cores  # noqa: E402
from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process  # noqa: E402

TOPIC = "workers-bench"
GROUP = "workers-bench"
QUEUES = 8
CONNECTIONS = 8
START_TIMEOUT_S = 90.0
LATENCY_RATE = 1000


def sluice_bench(mode: str, endpoint: str, pids: list[int], seconds: float, *extra: str) -> dict[str, Any]:
    argv = [*SLUICE_ARGV, "bench", mode, "--endpoint", endpoint, "--topic", TOPIC, "--duration", str(seconds),
            "--warmup", "1", "--channels", str(CONNECTIONS), "--json", "--quiet",
            "--watch-pids", ",".join(map(str, pids)), *extra]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds + 120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sluice bench {mode} failed: {done.stderr.strip()[-400:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def admin(namesrv: str, *args: str) -> None:
    argv = [*SLUICE_ARGV, "admin", "--namesrv", namesrv, *args]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sluice admin {' '.join(args)}: {done.stderr.strip()}")


def wait_line(child: ChildProcess, line: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while line not in child.output():
        if not child.running() or time.monotonic() > deadline:
            raise RuntimeError(f"{child.name} did not print {line!r}:\n{child.tail()}")
        time.sleep(0.1)


def summary(result: dict[str, Any], meter: str) -> dict[str, Any]:
    m = result["meters"][meter]
    cpu = result.get("cpu") or {}
    return {"messages_per_s": m["messages_per_s"], "errors": m["error_total"], "p50_ms": m["latency_ms"]["p50"],
            "p99_ms": m["latency_ms"]["p99"], "server_us_per_msg": cpu.get("watched_us_per_message"),
            "server_cores": cpu.get("watched_cores"), "other_cores": cpu.get("other_cores")}  # fmt: skip


def phases(endpoint: str, namesrv: str, pids: list[int], seconds: float) -> dict[str, dict[str, Any]]:
    admin(namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
    admin(namesrv, "group", "create", GROUP)  # created before the backlog: it consumes all of it
    out = {"produce": summary(sluice_bench("produce", endpoint, pids, seconds, "--batch", "32",
                                           "--concurrency", "32"), "send")}  # fmt: skip
    out["consume"] = summary(sluice_bench("consume", endpoint, pids, seconds, "--group", GROUP,
                                          "--concurrency", "16", "--receive-batch", "32"), "receive")  # fmt: skip
    out["latency"] = latency(endpoint, pids, seconds)
    return out


def latency(endpoint: str, pids: list[int], seconds: float) -> dict[str, Any]:
    result = sluice_bench("produce", endpoint, pids, seconds, "--batch", "1", "--rate", str(LATENCY_RATE),
                          "--concurrency", "64")  # fmt: skip
    return summary(result, "send")


def run_merged(root: Path, workers: int, seconds: float) -> dict[str, dict[str, Any]]:
    port, ns_port = free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--shards", "1", "--workers", str(workers), "--data-dir", str(root / f"w{workers}"),
            "--port", str(port), "--namesrv-port", str(ns_port), "--broker-port", str(free_port()), "--flush", "async",
            "--console-port", "-1", "--metrics-port", "0", "--log-level", "warning"]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / f"up-w{workers}.log", name=f"up-w{workers}",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    try:
        wait_line(child, "proxy listening on")
        return phases(f"{LOOPBACK}:{port}", f"{LOOPBACK}:{ns_port}", [child.pid], seconds)
    finally:
        child.stop()


def run_separated(root: Path, seconds: float) -> dict[str, Any]:
    ns_port, broker_port, port = free_port(), free_port(), free_port()
    namesrv = f"{LOOPBACK}:{ns_port}"
    children: list[ChildProcess] = []
    try:
        children.append(start_process([*SLUICE_ARGV, "nameserver", "--port", str(ns_port), "--log-level", "warning"],
                                      port=ns_port, log_path=root / "ns.log", name="nameserver",
                                      timeout_s=START_TIMEOUT_S))  # fmt: skip
        children.append(start_process([*SLUICE_ARGV, "broker", "--name", "broker-a", "--namesrv", namesrv, "--port",
                                       str(broker_port), "--data-dir", str(root / "separated"), "--flush", "async",
                                       "--log-level", "warning"], port=broker_port, log_path=root / "broker.log",
                                      name="broker", timeout_s=START_TIMEOUT_S))  # fmt: skip
        proxy = start_process([*SLUICE_ARGV, "proxy", "--namesrv", namesrv, "--port", str(port), "--workers", "1",
                               "--log-level", "warning"], port=port, log_path=root / "proxy.log", name="proxy",
                              timeout_s=START_TIMEOUT_S)  # fmt: skip
        children.append(proxy)
        wait_line(proxy, "proxy listening on")
        admin(namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
        return latency(f"{LOOPBACK}:{port}", [c.pid for c in children], seconds)
    finally:
        for child in reversed(children):
            child.stop()


def report(curve: dict[int, dict[str, dict[str, Any]]], separated: dict[str, Any], default: int) -> list[str]:
    lines = ["workers  produce B=32 msg/s  (xN=1)  µs/msg  consume msg/s  (xN=1)  µs/msg  server cores p/c"]
    base = curve[1]
    for n, r in curve.items():
        p, c = r["produce"], r["consume"]
        p_x = p["messages_per_s"] / base["produce"]["messages_per_s"]
        c_x = c["messages_per_s"] / base["consume"]["messages_per_s"]
        lines.append(f"{n:>7}  {p['messages_per_s']:>18,.0f}  {p_x:>6.2f}  {p['server_us_per_msg'] or 0:>6.0f}"
                     f"  {c['messages_per_s']:>13,.0f}  {c_x:>6.2f}  {c['server_us_per_msg'] or 0:>6.0f}"
                     f"  {p['server_cores']}/{c['server_cores']}")  # fmt: skip
    d = curve[default]
    lines.append(f"\nconsume / produce B=32 at the default {default} workers: "
                 f"{d['consume']['messages_per_s'] / d['produce']['messages_per_s']:.2f}")  # fmt: skip
    if 2 in curve:
        for phase in ("produce", "consume"):
            ratio = curve[2][phase]["messages_per_s"] / base[phase]["messages_per_s"]
            lines.append(f"{phase}: 2 workers / 1 worker = {ratio:.2f}")
    lines.append(f"\nsend latency at {LATENCY_RATE} msg/s (B=1):")
    for n, r in curve.items():
        lat = r["latency"]
        lines.append(f"  merged, {n} worker(s): p50 {lat['p50_ms']:.2f} ms  p99 {lat['p99_ms']:.2f} ms  "
                     f"({lat['messages_per_s']:,.0f} msg/s, {lat['errors']} errors)")  # fmt: skip
    extra = separated["p50_ms"] - curve[1]["latency"]["p50_ms"]
    lines.append(f"  separated (1 proxy process): p50 {separated['p50_ms']:.2f} ms  p99 {separated['p99_ms']:.2f} ms"
                 f"  (p50 {extra:+.2f} ms over merged --workers 1)")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per phase (default 6)")
    ap.add_argument("--max-workers", type=int, default=available_cores(), help="largest N (default: the cores)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-workers-bench-"))
    try:
        curve = {n: run_merged(root, n, args.seconds) for n in range(1, args.max_workers + 1)}
        separated = run_separated(root, args.seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    default = min(available_cores(), args.max_workers)
    if args.json:
        print(json.dumps({"curve": curve, "separated_latency": separated, "default_workers": default}, indent=2))
        return 0
    print(
        f"workers bench: {os.cpu_count()} cores, {args.seconds:g} s per phase, 1 KiB messages, flush async, "
        f"{CONNECTIONS} connections; server µs/msg = CPU of sluice up and its workers per message\n"
    )
    print("\n".join(report(curve, separated, default)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
