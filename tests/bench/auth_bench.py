#!/usr/bin/env python3
"""Cost of authentication and authorisation on the produce path (issue 9), in one run.

    .venv/bin/python tests/bench/auth_bench.py [--seconds 10] [--rounds 2] [--concurrency 64] [--json]

Starts two merged topologies side by side (`sluice up --flush async`), one with `--auth off`
and one with `--auth on`, each with data in a temp dir. The auth-on one gets a user with an
ADMIN rule on one topic prefix, a few dozen other users and rules (so lookups are not trivially
small) and a rate limit on another namespace (so the flow-control lookup runs too, and finds no
limit for the measured topic: under a limit nothing should slow down).

Then alternates, `--rounds` times, the same `sluice bench produce` phase (B=1, as fast as the
server answers; and B=1 at a steady `--rate` for latency) against each topology; the auth-on
generator signs every request exactly like the official clients (HMAC-SHA1 of the date-time,
a new value each second). Alternating spreads a noisy machine's drift over both sides.

Reports throughput and p50/p99 send latency per side (best round for throughput, median round
for latency) and the target: auth on keeps >= 90% of auth-off throughput. Every process is
stopped by PID and the temp dir removed. Timing figures are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process  # noqa: E402

TOPIC = "bench-auth"
ACCESS_KEY, SECRET = "bench", "bench-secret"
FILLER_USERS = 40
WARMUP_S = 1.0
START_TIMEOUT_S = 60.0
ADMIN_TIMEOUT_S = 60.0
POLICY_PICKUP_S = 30.0
TARGET_RATIO = 0.90


@dataclass
class Side:
    name: str  # "auth off" / "auth on"
    endpoint: str
    namesrv: str
    child: ChildProcess
    sign: bool


def start(root: Path, auth: bool) -> Side:
    port, ns_port, broker_port = free_port(), free_port(), free_port()
    tag = "on" if auth else "off"
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / f"auth-{tag}"), "--port", str(port), "--namesrv-port",
            str(ns_port), "--broker-port", str(broker_port), "--flush", "async", "--log-level", "warning",
            "--auth", tag]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / f"auth-{tag}.log", name=f"up-auth-{tag}",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while "proxy listening on" not in child.output():
        if not child.running() or time.monotonic() > deadline:
            child.stop()
            raise RuntimeError(f"sluice up --auth {tag} did not start:\n{child.tail()}")
        time.sleep(0.05)
    return Side(f"auth {tag}", f"{LOOPBACK}:{port}", f"{LOOPBACK}:{ns_port}", child, auth)


def admin(side: Side, *args: str) -> None:
    argv = [*SLUICE_ARGV, "admin", "--namesrv", side.namesrv, *args]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sluice admin {' '.join(args)} failed: {done.stderr.strip()}")


def prepare(side: Side) -> None:
    admin(side, "topic", "create", TOPIC, "--type", "normal", "--queues", "8")
    if not side.sign:
        return
    for i in range(FILLER_USERS):
        admin(side, "user", "create", f"filler{i}", "--secret", f"filler-secret-{i}")
        admin(side, "acl", "grant", f"filler{i}", "--resource", f"topic:filler{i}-*", "--actions", "PUB,SUB")
    admin(side, "limit", "set", "--namespace", "other", "--messages-per-s", "100")
    admin(side, "user", "create", ACCESS_KEY, "--secret", SECRET)
    admin(side, "acl", "grant", ACCESS_KEY, "--resource", "topic:bench-*", "--actions", "ADMIN")


def bench(side: Side, args: list[str], seconds: float) -> dict[str, Any]:
    argv = [*SLUICE_ARGV, "bench", "produce", "--endpoint", side.endpoint, "--topic", TOPIC, "--duration",
            str(seconds), "--warmup", str(WARMUP_S), "--json", "--quiet", "--watch-pids", str(side.child.pid),
            *args]  # fmt: skip
    if side.sign:
        argv += ["--access-key", ACCESS_KEY, "--secret", SECRET]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds + 120, check=False)
    if not done.stdout.strip():
        raise RuntimeError(f"sluice bench failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def wait_policy(side: Side) -> None:
    """The auth-on proxy picks the user up within seconds: wait until a signed send succeeds."""
    deadline = time.monotonic() + POLICY_PICKUP_S
    while True:
        try:
            result = bench(side, ["--concurrency", "1", "--rate", "10"], 1.0)
            if result["error_total"] == 0 and result["meters"]["send"]["messages_per_s"] > 0:
                return
            problem = str(result.get("errors"))
        except RuntimeError as exc:  # the setup's QueryRoute is refused until the user is known
            problem = str(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(f"signed sends still fail after {POLICY_PICKUP_S} s: {problem}")
        time.sleep(1.0)


def summary(results: list[dict[str, Any]], best: bool) -> dict[str, float]:
    sends = [r["meters"]["send"] for r in results]
    rates = [s["messages_per_s"] for s in sends]
    return {
        "messages_per_s": max(rates) if best else statistics.median(rates),
        "p50_ms": statistics.median(s["latency_ms"]["p50"] for s in sends),
        "p99_ms": statistics.median(s["latency_ms"]["p99"] for s in sends),
        "errors": sum(r["error_total"] for r in results),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase (default 10)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of off/on (default 2)")
    ap.add_argument("--concurrency", type=int, default=64, help="calls in flight, max-throughput phase (default 64)")
    ap.add_argument("--rate", type=float, default=1000.0, help="msg/s of the steady latency phase (default 1000)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-auth-bench-"))
    sides: list[Side] = []
    try:
        sides = [start(root, False), start(root, True)]
        for side in sides:
            prepare(side)
        wait_policy(sides[1])
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for side in sides:
                for phase, extra in (("max", ["--concurrency", str(args.concurrency)]),
                                     ("steady", ["--concurrency", "16", "--rate", str(args.rate)])):  # fmt: skip
                    print(f"  round {r + 1} {side.name:<8} {phase:<6}", end="", file=sys.stderr, flush=True)
                    result = bench(side, extra, args.seconds)
                    runs.setdefault((side.name, phase), []).append(result)
                    send = result["meters"]["send"]
                    print(f"{send['messages_per_s']:>9,.0f} msg/s  p99 {send['latency_ms']['p99']:7.2f} ms"
                          f"  errors {result['error_total']}", file=sys.stderr, flush=True)  # fmt: skip
        report = {f"{name} {phase}": summary(results, best=phase == "max") for (name, phase), results in runs.items()}
        off, on = report["auth off max"]["messages_per_s"], report["auth on max"]["messages_per_s"]
        ratio = on / off if off else 0.0
        verdict = {"target": f"auth on >= {TARGET_RATIO:.0%} of auth off throughput", "ratio": round(ratio, 3),
                   "met": ratio >= TARGET_RATIO}  # fmt: skip
        if args.json:
            print(json.dumps({"results": report, "verdict": verdict}, indent=2))
        else:
            print(f"{'phase':<20}{'msg/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
            for key, s in report.items():
                print(f"{key:<20}{s['messages_per_s']:>10,.0f}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}{s['errors']:>8}")
            print(f"{verdict['target']}: {ratio:.1%} -> {'met' if verdict['met'] else 'NOT met'}")
        return 0
    finally:
        for side in reversed(sides):
            side.child.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
