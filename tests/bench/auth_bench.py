#!/usr/bin/env python3
"""Cost of signature checks, access rules and metrics on the produce path (issue 9), in one run.

    .venv/bin/python tests/bench/auth_bench.py [--seconds 6] [--rounds 5] [--concurrency 64] [--rate 1000] [--json]

Starts three merged topologies side by side (`sluice up --flush async --no-trace`, each with data
in a temp dir): `off` (`--auth off --no-metrics`: neither), `metrics` (`--auth off`, metrics on)
and `on` (`--auth on`, metrics on). The message trace is off on all three: its cost is measured
by tests/bench/obs_bench.py, and the issue's target is about signatures, access rules and metrics.
The `on` cluster gets a user with an ADMIN rule on one topic prefix, 40 other users with rules (so
lookups are not trivially small) and a rate limit on another namespace (so the flow-control lookup
runs too, and finds no limit for the measured topic: under a limit nothing should slow down); they
are written in one security-document edit, in process, the way `sluice admin user|acl|limit`
writes them (admin/security.py), which keeps the setup to a second instead of 80 CLI runs.

Then, `--rounds` times, runs the same `sluice bench produce` phases against each side in turn (B=1
as fast as the server answers with `--concurrency` calls in flight; and B=1 at a steady `--rate`
for latency), each round starting with another side so that neither the first nor the last slot
favours one. The generator is the same on every side, byte for byte: it signs every request with
the bench user's credentials, as the official Python client does (rocketmq/v5/util/signature.py:
`Signature.metadata` puts `x-mq-date-time` and `authorization` on every request whatever the
server's setting, with an empty access key when none is configured), and a proxy with auth off
ignores them. So the sides differ only by what the server does with those headers (verify the
signature, check the access rules and the limits) and by its metrics. As that client's two headers
are identical for every request within one second (the date-time has one-second resolution and is
the only signed value), the generator computes them once per second and reuses them within it
(bench/client.py `signed_headers`): on the wire, the same headers as the official client.

Reports per side throughput (best round) and p50/p99 send latency (median round), and the ratio
of `on` to `off` max throughput both as the median of the per-round ratios (each round's sides
ran back to back, so a round's ratio cancels slow drift of the machine) and best round against
best round. Target: `on` keeps >= 90% of `off` throughput (the median of per-round ratios
decides). The `metrics`/`off` and `on`/`metrics` ratios split the cost between metrics and auth.
Each phase also shows the server's CPU per message (`--watch-pids`) and the CPU that other work
on the machine used meanwhile ("other work", cores): the median per-round ratio of server CPU per
message is the server-side cost seen without the throughput's sensitivity to that other work, and
a round with other work near a core is a disturbed one.
Every process is stopped by PID and the temp dir removed. Only meaningful on a quiet machine (run
it under the CPU lock): the three sides and the generator share the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
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

from admin import security  # noqa: E402
from admin.cluster import Cluster  # noqa: E402
from common.security import Action, Limit, LimitScope, Pattern, ResourceKind, SecurityDoc  # noqa: E402
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
# name, `sluice up` flags, whether the cluster gets the bench user and rules
SIDES = (("off", ["--auth", "off", "--no-metrics"], False), ("metrics", ["--auth", "off"], False),
         ("on", ["--auth", "on"], True))  # fmt: skip


@dataclass
class Side:
    name: str  # "off" / "metrics" / "on"
    endpoint: str
    namesrv: str
    child: ChildProcess
    auth: bool


def start(root: Path, name: str, flags: list[str], auth: bool) -> Side:
    port, ns_port, broker_port = free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / name), "--port", str(port), "--namesrv-port", str(ns_port),
            "--broker-port", str(broker_port), "--flush", "async", "--log-level", "warning", "--no-trace",
            *flags]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / f"{name}.log", name=f"up-{name}",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while "proxy listening on" not in child.output():
        if not child.running() or time.monotonic() > deadline:
            child.stop()
            raise RuntimeError(f"sluice up ({name}) did not start:\n{child.tail()}")
        time.sleep(0.05)
    return Side(name, f"{LOOPBACK}:{port}", f"{LOOPBACK}:{ns_port}", child, auth)


def admin(side: Side, *args: str) -> None:
    argv = [*SLUICE_ARGV, "admin", "--namesrv", side.namesrv, *args]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sluice admin {' '.join(args)} failed: {done.stderr.strip()}")


def security_edits() -> list[security.Edit]:
    """The users, rules and limit of the `on` side, as `sluice admin user|acl|limit` would add them."""
    pub_sub = frozenset({Action.PUB, Action.SUB})
    edits: list[security.Edit] = []
    for i in range(FILLER_USERS):
        edits.append(security.create_user(f"filler{i}", f"filler-secret-{i}"))
        edits.append(security.grant(f"filler{i}", "", Pattern(ResourceKind.TOPIC, f"filler{i}-", prefix=True), pub_sub,
                                    security.Effect.ALLOW))  # fmt: skip
    edits.append(security.set_limit(Limit(LimitScope.NAMESPACE, "other", "", messages_per_s=100)))
    edits.append(security.create_user(ACCESS_KEY, SECRET))
    edits.append(security.grant(ACCESS_KEY, "", Pattern(ResourceKind.TOPIC, "bench-", prefix=True),
                                frozenset({Action.ADMIN}), security.Effect.ALLOW))  # fmt: skip
    return edits


async def write_security(namesrv: str) -> None:
    """All of `security_edits()` in one new version of the cluster's security document."""

    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        for edit in security_edits():
            doc, _ = edit(doc)
        return doc, "bench users"

    async with Cluster(namesrv, timeout_s=ADMIN_TIMEOUT_S) as cluster:
        await security.edit(cluster, change)


def prepare(side: Side) -> None:
    admin(side, "topic", "create", TOPIC, "--type", "normal", "--queues", "8")
    if side.auth:
        asyncio.run(write_security(side.namesrv))


def bench(side: Side, args: list[str], seconds: float) -> dict[str, Any]:
    argv = [*SLUICE_ARGV, "bench", "produce", "--endpoint", side.endpoint, "--topic", TOPIC, "--duration",
            str(seconds), "--warmup", str(WARMUP_S), "--json", "--quiet", "--watch-pids", str(side.child.pid),
            *args]  # fmt: skip
    argv += ["--access-key", ACCESS_KEY, "--secret", SECRET]  # every side: the same requests (see above)
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


def server_us(result: dict[str, Any]) -> float:
    """CPU time of the side's server process per message sent (µs), from `--watch-pids`."""
    cpu = result.get("cpu") or {}
    return float(cpu.get("watched_us_per_message", 0.0))


def summary(results: list[dict[str, Any]], best: bool) -> dict[str, float]:
    sends = [r["meters"]["send"] for r in results]
    rates = [s["messages_per_s"] for s in sends]
    return {
        "messages_per_s": max(rates) if best else statistics.median(rates),
        "p50_ms": statistics.median(s["latency_ms"]["p50"] for s in sends),
        "p99_ms": statistics.median(s["latency_ms"]["p99"] for s in sends),
        "server_us_per_msg": statistics.median(server_us(r) for r in results),
        "errors": sum(r["error_total"] for r in results),
    }


def ratios(runs: dict[tuple[str, str], list[dict[str, Any]]], top: str, base: str) -> dict[str, Any]:
    """Max-phase throughput of `top` over `base`: per round, their median, and best over best."""
    tops = [r["meters"]["send"]["messages_per_s"] for r in runs[(top, "max")]]
    bases = [r["meters"]["send"]["messages_per_s"] for r in runs[(base, "max")]]
    paired = [t / b if b else 0.0 for t, b in zip(tops, bases, strict=True)]
    # Server CPU per message, top over base: what the server itself spends, whatever else ran.
    cpu = [server_us(t) / server_us(b) if server_us(b) else 0.0
           for t, b in zip(runs[(top, "max")], runs[(base, "max")], strict=True)]  # fmt: skip
    return {"per_round": [round(x, 3) for x in paired], "median": round(statistics.median(paired), 3),
            "best_of_rounds": round(max(tops) / max(bases) if max(bases) else 0.0, 3),
            "server_cpu_per_msg_median": round(statistics.median(cpu), 3)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per phase (default 6)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the three sides (default 5)")
    ap.add_argument("--concurrency", type=int, default=64, help="calls in flight, max-throughput phase (default 64)")
    ap.add_argument("--rate", type=float, default=1000.0, help="msg/s of the steady latency phase (default 1000)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-auth-bench-"))
    sides: list[Side] = []
    try:
        for name, flags, auth in SIDES:
            sides.append(start(root, name, flags, auth))
        for side in sides:
            prepare(side)
        wait_policy(sides[-1])
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:  # each round starts with another side
                for phase, extra in (("max", ["--concurrency", str(args.concurrency)]),
                                     ("steady", ["--concurrency", "16", "--rate", str(args.rate)])):  # fmt: skip
                    print(f"  round {r + 1} {side.name:<8} {phase:<6}", end="", file=sys.stderr, flush=True)
                    result = bench(side, extra, args.seconds)
                    runs.setdefault((side.name, phase), []).append(result)
                    send = result["meters"]["send"]
                    other = (result.get("cpu") or {}).get("other_cores", 0.0)
                    print(f"{send['messages_per_s']:>9,.0f} msg/s  p99 {send['latency_ms']['p99']:7.2f} ms"
                          f"  server {server_us(result):5.0f} us/msg  other work {other:.2f} cores"
                          f"  errors {result['error_total']}", file=sys.stderr, flush=True)  # fmt: skip
        report = {f"{name} {phase}": summary(runs[(name, phase)], best=phase == "max")
                  for name, _, _ in SIDES for phase in ("max", "steady")}  # fmt: skip
        split = {"on/off": ratios(runs, "on", "off"), "metrics/off": ratios(runs, "metrics", "off"),
                 "on/metrics": ratios(runs, "on", "metrics")}  # fmt: skip
        ratio = split["on/off"]["median"]
        verdict = {"target": f"auth and metrics on >= {TARGET_RATIO:.0%} of off throughput (median of rounds)",
                   "ratio": ratio, "met": ratio >= TARGET_RATIO}  # fmt: skip
        if args.json:
            print(json.dumps({"results": report, "ratios": split, "verdict": verdict}, indent=2))
        else:
            print(f"{'phase':<20}{'msg/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'us/msg':>9}{'errors':>8}")
            for key, s in report.items():
                print(f"{key:<20}{s['messages_per_s']:>10,.0f}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}"
                      f"{s['server_us_per_msg']:>9,.0f}{s['errors']:>8}")  # fmt: skip
            for key, q in split.items():
                rounds_text = " ".join(f"{x:.1%}" for x in q["per_round"])
                print(f"{key:<12} msg/s per round {rounds_text}  median {q['median']:.1%}"
                      f"  best/best {q['best_of_rounds']:.1%}"
                      f"  server CPU/msg x{q['server_cpu_per_msg_median']:.3f}")  # fmt: skip
            print(f"{verdict['target']}: {ratio:.1%} -> {'met' if verdict['met'] else 'NOT met'}")
        return 0
    finally:
        for side in reversed(sides):
            side.child.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
