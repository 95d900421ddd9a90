#!/usr/bin/env python3
"""Proxy benchmark (issue 4: load generator and performance), in one run on this machine.

    .venv/bin/python tests/bench/proxy_bench.py [--seconds 10] [--brokers 1] [--profile DIR] [--json]

Starts, measures and stops, each as child processes on 127.0.0.1 with data in a temp dir:

- the bare echo server (`sluice bench echo-server`): the gRPC + protobuf ceiling for SendMessage
  calls with the same payload, concurrency and batching (B=1 and B=32);
- the merged topology (`sluice up --flush async`);
- the separated topology (1 NameServer, `--brokers` brokers (default 1), 1 proxy; async flush).

On each topology: max produce throughput with B=1 and B=32 messages per SendMessage; send latency
at a steady 1,000 msg/s and at a light 200 msg/s (B=1, open loop: latency from each call's
scheduled time); consume (receive batches of 32 + one AckMessage per batch) of the backlog the
produce phases left; end-to-end latency at 200 msg/s (informational). The light rate is there
because a topology that cannot carry 1,000 msg/s next to the generator on 2 cores reports a queue,
not a latency: merged vs separated p50 is compared at both rates. Topics and groups are created
with `sluice admin`. Every phase is one `sluice bench ... --json` child process: the
load generator competes with the servers for the same 2 cores, so the table also shows the CPU
the servers and the generator used per message, and the CPU anything else on the machine used
during the phase ("other cores" — other work on a shared machine skews every figure).

With `--profile DIR`, extra merged phases run under `py-spy record -f raw` attached to the
`sluice up` process (produce B=1, produce B=32, consume); the raw files stay in DIR and the top
frames by self time are printed. Every process is stopped by PID and the temp dir removed.
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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.helpers.broker_fixtures import (  # noqa: E402
    SLUICE_ARGV,
    ServerProcess,
    start_broker_process,
    start_nameserver_process,
)
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process  # noqa: E402

TOPIC = "bench"
CONSUME_GROUP = "bench-consume"
E2E_GROUP = "bench-e2e"
QUEUES = 8
STEADY_RATE_PER_S = 1000
LIGHT_RATE_PER_S = 200
LIGHT_CONCURRENCY = 4
WARMUP_S = 1.0
ADMIN_TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0
PY_SPY = REPO_ROOT / ".venv" / "bin" / "py-spy"
TARGETS = (
    ("merged produce B=1 >= 60% of echo B=1", "ratio", 0.60),
    ("merged produce B=32 >= 60% of echo B=32", "ratio", 0.60),
    ("merged consume >= 50% of merged produce B=32", "ratio", 0.50),
    ("separated adds < 1 ms to p50 send latency (1,000 msg/s)", "below", 1.0),
    ("separated adds < 1 ms to p50 send latency (200 msg/s)", "below", 1.0),
    ("merged p99 send latency at 1,000 msg/s < 10 ms", "below", 10.0),
)


@dataclass
class Load:
    """How the generator is driven (the same for the echo server and both topologies)."""

    seconds: float
    single_concurrency: int
    batch_concurrency: int
    consumers: int
    e2e_consumers: int
    steady_concurrency: int
    channels: int


@dataclass
class Phase:
    topology: str
    name: str
    result: dict[str, Any]  # what `sluice bench --json` printed
    load_avg: float

    def meter(self, name: str) -> dict[str, Any]:
        meter: dict[str, Any] = self.result["meters"][name]
        return meter

    def primary(self) -> dict[str, Any]:
        """send / echo for produce phases, ack for consume, e2e for end-to-end."""
        meters: dict[str, Any] = self.result["meters"]
        for name in ("e2e", "ack", "send", "echo"):
            if name in meters:
                return self.meter(name)
        raise KeyError("no meter")

    def shown_meters(self) -> list[str]:
        return {"consume": ["receive", "ack"], "e2e": ["send", "e2e"]}.get(
            self.result["mode"], [*self.result["meters"]]
        )

    def as_json(self) -> dict[str, Any]:
        return {"topology": self.topology, "phase": self.name, "load_avg": self.load_avg, **self.result}


# -- processes ------------------------------------------------------------------------------------


@dataclass
class Topology:
    name: str
    endpoint: str
    namesrv: str
    server_pids: list[int]
    children: list[ChildProcess | ServerProcess]

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


def start_merged(root: Path) -> Topology:
    port, ns_port, broker_port = free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / "merged"), "--port", str(port), "--namesrv-port",
            str(ns_port), "--broker-port", str(broker_port), "--flush", "async", "--log-level", "warning"]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / "merged.log", name="sluice-up", timeout_s=START_TIMEOUT_S)
    _wait_line(child, "proxy listening on")
    return Topology("merged", f"{LOOPBACK}:{port}", f"{LOOPBACK}:{ns_port}", [child.pid], [child])


def start_separated(root: Path, brokers: int) -> Topology:
    children: list[ChildProcess | ServerProcess] = []
    try:
        ns = start_nameserver_process(root, "--log-level", "warning", timeout_s=START_TIMEOUT_S)
        children.append(ns)
        for i in range(brokers):
            children.append(
                start_broker_process(
                    root,
                    name=f"broker-{'abcdefgh'[i]}",
                    namesrv=ns.address,
                    extra_args=["--flush", "async", "--log-level", "warning"],
                )
            )
        port = free_port()
        argv = [*SLUICE_ARGV, "proxy", "--namesrv", ns.address, "--port", str(port), "--log-level", "warning"]
        proxy = start_process(argv, port=port, log_path=root / "proxy.log", name="sluice-proxy")
        children.append(proxy)
        _wait_line(proxy, "proxy listening on")
    except BaseException:
        for child in reversed(children):
            child.stop()
        raise
    pids = [c.child.pid if isinstance(c, ServerProcess) else c.pid for c in children]
    return Topology("separated", f"{LOOPBACK}:{port}", ns.address, pids, children)


def start_echo(root: Path) -> Topology:
    port = free_port()
    argv = [*SLUICE_ARGV, "bench", "echo-server", "--port", str(port)]
    child = start_process(argv, port=port, log_path=root / "echo.log", name="echo-server")
    return Topology("echo", f"{LOOPBACK}:{port}", "", [child.pid], [child])


def _wait_line(child: ChildProcess, line: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while line not in child.output():
        if not child.running() or time.monotonic() > deadline:
            child.stop()
            raise RuntimeError(f"{child.name} did not print {line!r}:\n{child.tail()}")
        time.sleep(0.05)


def admin(namesrv: str, *args: str) -> None:
    argv = [*SLUICE_ARGV, "admin", "--namesrv", namesrv, *args]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sluice admin {' '.join(args)} failed: {done.stderr.strip()}")


# -- measuring ------------------------------------------------------------------------------------


def bench(topo: Topology, name: str, mode: str, args: list[str], load: Load, profile: Path | None = None) -> Phase:
    """One `sluice bench` child process against `topo`; with `profile`, py-spy records the server meanwhile."""
    argv = [*SLUICE_ARGV, "bench", mode, "--endpoint", topo.endpoint, "--duration", str(load.seconds),
            "--warmup", str(WARMUP_S), "--channels", str(load.channels), "--json", "--quiet",
            "--watch-pids", ",".join(map(str, topo.server_pids)), *args]  # fmt: skip
    if mode != "echo":
        argv += ["--topic", TOPIC]
    print(f"  {topo.name:<9} {name:<20}", end="", file=sys.stderr, flush=True)
    gen = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    spy = None
    try:
        if profile is not None:
            time.sleep(WARMUP_S + 1.0)  # the generator starts, connects and warms up first
            # --gil: only the thread holding the GIL (the bottleneck of a Python server); --native: C frames too.
            spy_argv = [str(PY_SPY), "record", "-o", str(profile), "-f", "raw", "-p", str(topo.server_pids[0]),
                        "--duration", str(max(1, int(load.seconds) - 1)), "--gil", "--native"]  # fmt: skip
            spy = subprocess.Popen(spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        out, err = gen.communicate(timeout=load.seconds + WARMUP_S + 60)
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
        if spy is not None:
            _finish_spy(spy, profile)
    if not out.strip():
        raise RuntimeError(f"sluice bench {mode} printed nothing (exit {gen.returncode}):\n{err[-2000:]}")
    phase = Phase(topo.name, name, json.loads(out), os.getloadavg()[0])
    m, cpu = phase.primary(), phase.result["cpu"] or {}
    lat = m["latency_ms"]
    print(
        f"{m['messages_per_s']:>9,.0f} msg/s  p50 {lat['p50']:7.2f} ms  p99 {lat['p99']:7.2f} ms"
        f"  errors {phase.result['error_total']}  other load {cpu.get('other_cores', 0):.2f} cores",
        file=sys.stderr,
        flush=True,
    )
    return phase


def _finish_spy(spy: subprocess.Popen[str], profile: Path | None) -> None:
    """py-spy writes its file when its --duration is over: wait for it (bounded), kill it only if stuck."""
    try:
        _, spy_err = spy.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        _, spy_err = spy.communicate()
    if spy.returncode != 0 or profile is None or not profile.exists():
        print(f"\n  py-spy failed (exit {spy.returncode}): {spy_err.strip()[-500:]}", file=sys.stderr)


def produce_phases(topo: Topology, load: Load) -> list[Phase]:
    mode = "echo" if topo.name == "echo" else "produce"
    return [
        bench(
            topo, "produce B=1", mode, ["--max", "--batch", "1", "--concurrency", str(load.single_concurrency)], load
        ),
        bench(
            topo, "produce B=32", mode, ["--max", "--batch", "32", "--concurrency", str(load.batch_concurrency)], load
        ),
    ]


def topology_phases(topo: Topology, load: Load) -> list[Phase]:
    admin(topo.namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
    admin(topo.namesrv, "group", "create", CONSUME_GROUP, "--consume-from", "earliest")
    phases = produce_phases(topo, load)
    steady = ["--rate", str(STEADY_RATE_PER_S), "--batch", "1", "--concurrency", str(load.steady_concurrency)]
    phases.append(bench(topo, "steady 1k/s", "produce", steady, load))
    light = ["--rate", str(LIGHT_RATE_PER_S), "--batch", "1", "--concurrency", str(LIGHT_CONCURRENCY)]
    phases.append(bench(topo, "light 200/s", "produce", light, load))
    consume = ["--group", CONSUME_GROUP, "--concurrency", str(load.consumers), "--receive-batch", "32"]
    phases.append(bench(topo, "consume", "consume", consume, load))
    admin(topo.namesrv, "group", "create", E2E_GROUP)
    e2e = [*light, "--group", E2E_GROUP, "--consumers", str(load.e2e_consumers)]
    phases.append(bench(topo, "e2e 200/s", "e2e", e2e, load))
    return phases


def profile_phases(topo: Topology, load: Load, out_dir: Path) -> list[tuple[str, Path]]:
    """Extra phases under py-spy (not in the figures: sampling pauses the server): the merged process
    under produce B=1, B=32 and consume, and the echo server under B=1 (what grpc alone costs)."""
    produce = "echo" if topo.name == "echo" else "produce"
    runs = [("produce B=1", produce, ["--max", "--batch", "1", "--concurrency", str(load.single_concurrency)])]
    if topo.name != "echo":
        runs += [
            ("produce B=32", "produce", ["--max", "--batch", "32", "--concurrency", str(load.batch_concurrency)]),
            ("consume", "consume", ["--group", CONSUME_GROUP, "--concurrency", str(load.consumers)]),
        ]
    files = []
    for name, mode, args in runs:
        path = out_dir / f"profile-{topo.name}-{name.replace(' ', '').replace('=', '')}.txt"
        bench(topo, f"py-spy {name}", mode, args, load, profile=path)
        files.append((f"{topo.name} ({_PROCESS[topo.name]}), {name}", path))
    return files


_PROCESS = {"echo": "sluice bench echo-server", "merged": "sluice up", "separated": "sluice proxy"}


def summarise_profile(path: Path, top: int) -> list[str]:
    """From py-spy raw output: top frames by self time, self time by layer, inclusive time by module of ours."""
    leaves: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        leaves[frames[-1].strip()] += n
        layers[_layer(_file_of(frames[-1]))] += n
        for module in {f for f in map(_file_of, frames) if f.split("/", 1)[0] in OWN_PACKAGES and f not in ENTRY}:
            ours[module] += n
        total += n
    if not total:
        return ["    (no samples)"]
    pct = 100 / total
    lines = [f"    {total} samples of the thread holding the GIL; top frames by self time:"]
    lines += [f"    {n * pct:5.1f}%  {frame}" for frame, n in leaves.most_common(top)]
    lines.append("    self time by layer:")
    lines += [f"    {n * pct:5.1f}%  {layer}" for layer, n in layers.most_common()]
    lines.append("    inclusive time by module of ours (a sample counts once per module on its stack):")
    lines += [f"    {n * pct:5.1f}%  {module}" for module, n in ours.most_common(top)]
    return lines


OWN_PACKAGES = (
    "proxy",
    "broker",
    "common",
    "nameserver",
    "sluice",
    "admin",
    "console",
    "bench",
    "cluster",
    "processes",
    "ops",
    "proto",
)
ENTRY = ("sluice/main.py", "processes/runtime.py", "sluice/commands/up.py")  # on every stack: not informative
_LAYERS = (
    ("cygrpc", "grpc core (Cython/C, unsymbolised)"),
    ("grpc/", "grpc (Python part)"),
    ("_message.abi3", "protobuf (upb)"),
    ("protobuf/", "protobuf (Python part)"),
    ("libc.so", "libc: syscalls (socket I/O, eventfd/futex wake-ups)"),
    ("uvloop", "asyncio / uvloop"),
    ("asyncio/", "asyncio / uvloop"),
    ("threading.py", "threads (locks, conditions)"),
    ("concurrent/", "threads (locks, conditions)"),
    ("rocksdict", "RocksDB"),
    ("rocksdb", "RocksDB"),
)


def _layer(file: str) -> str:
    top = file.split("/", 1)[0]
    if top in OWN_PACKAGES:
        return "/".join(file.split("/")[:2]) if top in ("proxy", "broker") and file.count("/") > 1 else top
    for marker, layer in _LAYERS:
        if marker in file:
            return layer
    return "Python runtime / stdlib"


def _file_of(frame: str) -> str:
    """'send_message (proxy/grpc/produce.py:30)' -> 'proxy/grpc/produce.py'; keeps .so names."""
    inside = frame[frame.rfind("(") + 1 : frame.rfind(")")] if "(" in frame else frame
    path = inside.rsplit(":", 1)[0] if ".py:" in inside or ".h:" in inside or ".c:" in inside else inside
    for marker in ("site-packages/", "/lib/python3.11/", str(REPO_ROOT) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


# -- report ---------------------------------------------------------------------------------------


def find(phases: list[Phase], topology: str, name: str) -> Phase | None:
    return next((p for p in phases if p.topology == topology and p.name == name), None)


def evaluate(phases: list[Phase]) -> list[dict[str, Any]]:
    """Each target's value; for throughput ratios also the same ratio by server CPU per message
    (what the ratio would be if each server had the cores to itself: steadier on a shared machine)."""

    def rate(topology: str, name: str, meter: str | None = None) -> float:
        p = find(phases, topology, name)
        return float((p.primary() if meter is None else p.meter(meter))["messages_per_s"]) if p else float("nan")

    def cpu_us(topology: str, name: str) -> float:
        p = find(phases, topology, name)
        cpu = p.result["cpu"] if p else None
        return float(cpu["watched_us_per_message"]) if cpu and cpu["watched_us_per_message"] else float("nan")

    def steady(topology: str, q: str, phase: str = "steady 1k/s") -> float:
        p = find(phases, topology, phase)
        return float(p.primary()["latency_ms"][q]) if p else float("nan")

    values = [
        (rate("merged", "produce B=1") / rate("echo", "produce B=1"),
         cpu_us("echo", "produce B=1") / cpu_us("merged", "produce B=1")),
        (rate("merged", "produce B=32") / rate("echo", "produce B=32"),
         cpu_us("echo", "produce B=32") / cpu_us("merged", "produce B=32")),
        (rate("merged", "consume", "ack") / rate("merged", "produce B=32"),
         cpu_us("merged", "produce B=32") / cpu_us("merged", "consume")),
        (steady("separated", "p50") - steady("merged", "p50"), None),
        (steady("separated", "p50", "light 200/s") - steady("merged", "p50", "light 200/s"), None),
        (steady("merged", "p99"), None),
    ]  # fmt: skip
    out = []
    for (text, kind, goal), (value, by_cpu) in zip(TARGETS, values, strict=True):
        met = value >= goal if kind == "ratio" else value < goal
        entry: dict[str, Any] = {"target": text, "value": round(value, 3), "goal": goal, "met": bool(met)}
        if by_cpu is not None:
            entry["by_server_cpu"] = round(by_cpu, 3)
        out.append(entry)
    for topology in ("merged", "separated"):  # a latency at a rate means little if the rate was not kept
        for phase, rate_per_s in (("steady 1k/s", STEADY_RATE_PER_S), ("light 200/s", LIGHT_RATE_PER_S)):
            p = find(phases, topology, phase)
            if p is None:
                continue
            send = p.primary()
            unsent_share = send["unsent"] / max(1, send["unsent"] + send["messages"])
            out.append({"target": f"{topology} kept {rate_per_s:,} msg/s (share of scheduled sends never sent)",
                        "value": round(unsent_share, 3), "goal": 0.01, "met": unsent_share < 0.01,
                        "informational": True})  # fmt: skip
    return out


def table(phases: list[Phase]) -> str:
    head = (
        "topology",
        "phase",
        "meter",
        "msg/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "srv µs/msg",
        "gen µs/msg",
        "srv cores",
        "gen cores",
        "other",
        "empty/unsent",
        "errors",
    )
    rows = []
    for p in phases:
        cpu = p.result["cpu"] or {}
        for meter in p.shown_meters():
            m = p.meter(meter)
            lat = m["latency_ms"]
            rows.append(
                (
                    p.topology,
                    p.name,
                    meter,
                    f"{m['messages_per_s']:,.0f}",
                    f"{lat['p50']:.2f}",
                    f"{lat['p99']:.2f}",
                    f"{lat['p999']:.2f}",
                    f"{cpu.get('watched_us_per_message', 0):,.0f}",
                    f"{cpu.get('generator_us_per_message', 0):,.0f}",
                    f"{cpu.get('watched_cores', 0):.2f}",
                    f"{cpu.get('generator_cores', 0):.2f}",
                    f"{cpu.get('other_cores', 0):.2f}",
                    str(m["empty_calls"] or m["unsent"] or ""),
                    str(m["error_total"]),
                )
            )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = ["<", "<", "<"] + [">"] * (len(head) - 3)
    return "\n".join("  ".join(f"{c:{a}{w}}" for c, a, w in zip(r, fmt, widths, strict=True)) for r in [head, *rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured duration of each phase (default 10)")
    ap.add_argument("--brokers", type=int, default=1, choices=(1, 2), help="brokers of the separated topology")
    ap.add_argument("--single-concurrency", type=int, default=64, help="calls in flight, produce B=1 (default 64)")
    ap.add_argument("--batch-concurrency", type=int, default=16, help="calls in flight, produce B=32 (default 16)")
    ap.add_argument("--consumers", type=int, default=8, help="receive loops of the consume phase (default 8)")
    ap.add_argument("--steady-concurrency", type=int, default=16, help="tasks sharing the 1,000 msg/s (default 16)")
    ap.add_argument("--channels", type=int, default=1, help="connections of the generator (default 1)")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="also profile the merged proxy with py-spy into DIR")
    ap.add_argument("--top", type=int, default=15, help="frames to show per profile (default 15)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    args = ap.parse_args()
    load = Load(
        args.seconds,
        args.single_concurrency,
        args.batch_concurrency,
        args.consumers,
        min(args.consumers, 4),
        args.steady_concurrency,
        args.channels,
    )
    root = Path(tempfile.mkdtemp(prefix="sluice-proxy-bench-"))
    phases: list[Phase] = []
    profiles: list[tuple[str, Path]] = []
    started = time.monotonic()
    try:
        phases, profiles = run_all(root, load, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    verdicts = evaluate(phases)
    if args.json:
        print(json.dumps({"phases": [p.as_json() for p in phases], "targets": verdicts}, indent=2))
        return 0
    print_report(phases, verdicts, load, args, time.monotonic() - started)
    for name, path in profiles:
        print(f"\nprofile of {name}: {path}")
        print("\n".join(summarise_profile(path, args.top)) if path.exists() else "    (py-spy wrote nothing)")
    return 0


def run_all(root: Path, load: Load, args: argparse.Namespace) -> tuple[list[Phase], list[tuple[str, Path]]]:
    phases: list[Phase] = []
    profiles: list[tuple[str, Path]] = []
    print(f"proxy bench: {load.seconds:g} s per phase (+{WARMUP_S:g} s warm-up); work dir {root}", file=sys.stderr)
    for starter in (start_echo, start_merged, lambda r: start_separated(r, args.brokers)):
        topo = starter(root)
        try:
            phases += produce_phases(topo, load) if topo.name == "echo" else topology_phases(topo, load)
            if topo.name in ("echo", "merged") and args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                profiles += profile_phases(topo, load, args.profile)
        finally:
            topo.stop()
    return phases, profiles


def print_report(
    phases: list[Phase], verdicts: list[dict[str, Any]], load: Load, args: argparse.Namespace, elapsed_s: float
) -> None:
    print(
        f"\nproxy bench, {os.cpu_count()} cores, {load.seconds:g} s per phase after {WARMUP_S:g} s warm-up, "
        f"{elapsed_s:.0f} s in all; 1 KiB bodies; separated = 1 NameServer + {args.brokers} broker(s)"
        " + 1 proxy, all on async flush"
    )
    print(
        f"generator: one `sluice bench` process per phase on the same machine, {load.channels} connection(s); "
        f"concurrency B=1 {load.single_concurrency}, B=32 {load.batch_concurrency}, consume {load.consumers} "
        f"loops x 32, steady 1,000 msg/s over {load.steady_concurrency} tasks, light 200 msg/s over "
        f"{LIGHT_CONCURRENCY}, e2e {load.e2e_consumers} loops"
    )
    print(
        "srv/gen = CPU of the server processes / of the generator while measuring; other = cores used by"
        " everything else on the machine (other work skews every figure); empty = receives that found nothing,"
        " unsent = messages a rate phase had scheduled but could not send in time\n"
    )
    print(table(phases))
    print("\ntargets:")
    for v in verdicts:
        mark = ("ok  " if v["met"] else "NO  ") if v.get("informational") else ("MET " if v["met"] else "MISS")
        by_cpu = f"; by server CPU per message {v['by_server_cpu']:.3f}" if "by_server_cpu" in v else ""
        print(f"  {mark} {v['target']}: {v['value']:,.3f} (goal {v['goal']:g}{by_cpu})")


if __name__ == "__main__":
    sys.exit(main())
