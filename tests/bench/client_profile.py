#!/usr/bin/env python3
"""Where the server CPU of the official clients' messages goes, per process and per part of ours
(issue 41): tests/bench/client_bench.py's topologies and drivers, with py-spy on every server process.

    .venv/bin/python tests/bench/client_profile.py [--topology merged|separated] [--seconds 8]
        [--phase py-send,node-send,py-recv,node-recv] [--keep DIR] [--no-py-spy]

For each phase it runs client_bench's driver twice: once with no profiler (the CPU per message of
each server process, from /proc, by its command line: `up`, a shard, `broker`, `proxy` worker,
`nameserver`), once with `py-spy record --gil` on each of them (samples of the thread holding the
GIL, i.e. Python running: the loop thread almost always). The second window's samples are put in
parts by the innermost of our frames they are under (PARTS, first match wins) and printed as shares
of that process's samples. py-spy samples wall time while the GIL is held: a syscall made with the
GIL held (uvloop's socket writes) counts though the thread may have been preempted inside it, so
`transport writes` reads high on a loaded machine (perf shows their CPU: tests/bench/send_profile.py).
`--keep DIR` keeps the raw py-spy files. Stops every process it started.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.cpu import pid_cpu_s, process_tree  # noqa: E402
from tests.bench.client_bench import (  # noqa: E402
    BODY_BYTES,
    NODE_GROUP,
    PY_GROUP,
    QUEUES,
    TOPIC,
    WARMUP_S,
    Server,
    admin,
    node_driver,
    node_modules,
    py_driver,
    start_merged,
    start_separated,
)
from tests.bench.send_profile import run_driver  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
PY_SPY_HZ = 200

# Parts of ours, matched against the frames from the innermost outward (first rule wins).
PARTS = [
    ("transport writes (socket send, GIL held)", r"ServerConnection\._flush|Connection\._flush"),
    ("metrics, logging", r"prometheus_client|common/metrics\.py|logging/__init__|common/logs\.py"),
    ("HTTP/2 request headers: HPACK, validation", r"common/http2/hpackcodec\.py|common/http2/request\.py"),
    ("HTTP/2 server: frames, streams, flow control", r"common/http2/server\.py|common/http2/frames\.py"),
    ("gRPC server layer: calls, tasks, deadlines", r"common/http2/grpcserver\.py"),
    ("HTTP/2 client (proxy -> broker)", r"common/http2/client\.py"),
    ("internal service: broker side (h2rpc, BrokerServicer, convert)", r"proto/h2rpc\.py|broker/service\.py"),
    ("internal service: proxy side (RemoteBroker, convert, coalescing)", r"broker/client/"),
    ("message trace", r"broker/trace\.py"),
    ("broker: commit log writer", r"broker/store/writer\.py"),
    ("broker: dispatch, indexes (RocksDB)", r"broker/store/dispatcher\.py|broker/store/index\.py"),
    ("broker: pop, ack, invisibility", r"broker/consumer\.py|broker/popstate\.py|broker/longpoll\.py"),
    ("broker: store reads", r"broker/store/"),
    ("broker: checks, records, produce", r"broker/|common/record\.py"),
    ("proxy edge: admission, parse, context", r"proxy/grpc/edge\.py|proxy/grpc/guard\.py|proxy/grpc/status\.py"),
    ("proxy: conversion, servicer", r"proxy/grpc/"),
    ("proxy core: producer, consumer, routing, renew", r"proxy/"),
]
OURS = re.compile(r"\((proxy|broker|common|proto)/")


def processes(root_pids: list[int]) -> dict[int, str]:
    """pid -> a short name from its command line, for every process of the server."""
    out: dict[int, str] = {}
    for pid in {p for root in root_pids for p in process_tree(root)}:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        sub = next((w for w in words if w in ("up", "broker", "proxy", "nameserver", "node", "navigation")), "?")
        shard = next((words[i + 1] for i, w in enumerate(words) if w in ("--name", "--shard") and i + 1 < len(words)),
                     "")  # fmt: skip
        out[pid] = f"{sub} {shard}".strip() + f" [{pid}]"
    return out


def parts_of(raw: str) -> tuple[collections.Counter[str], int]:
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        if not any(OURS.search(f) for f in frames):
            parts["not under our frames (event loop, other threads)"] += n
            continue
        parts[next((name for f in reversed(frames) for name, rx in PARTS if re.search(rx, f)), "other ours")] += n
    return parts, total


def phases(endpoint: str, seconds: float, modules: Path | None) -> dict[str, list[str]]:
    base = {"endpoint": endpoint, "topic": TOPIC, "warmup_s": WARMUP_S, "seconds": seconds}
    node_base = {**base, "modulesDir": str(modules), "warmupS": WARMUP_S, "bodyBytes": BODY_BYTES}
    out = {
        "py-send": py_driver({**base, "mode": "produce", "threads": 32, "body_bytes": BODY_BYTES}),
        "py-recv": py_driver({**base, "mode": "consume", "group": PY_GROUP, "threads": 4, "batch": 32}),
    }
    if modules is not None:
        out["node-send"] = node_driver({**node_base, "mode": "produce", "concurrency": 64})
        out["node-recv"] = node_driver({**node_base, "mode": "consume", "group": NODE_GROUP, "concurrency": 8,
                                        "batch": 32})  # fmt: skip
    return out


def profile(server: Server, name: str, argv: list[str], out: Path, py_spy: bool) -> None:
    procs = processes(server.pids)
    marks: list[dict[int, float]] = []
    end = run_driver(argv, lambda: marks.append({p: pid_cpu_s(p) for p in procs}),
                lambda: marks.append({p: pid_cpu_s(p) for p in procs}))  # fmt: skip
    messages = int(end.get("messages", 0))
    if not messages or len(marks) != 2:
        print(f"{name}: the driver sent nothing ({end})")
        return
    print(f"\n{name}: {messages / float(end['seconds']):,.0f} msg/s; server CPU µs per message by process")
    total = 0.0
    for pid, label in sorted(procs.items(), key=lambda kv: kv[1]):
        used = marks[1][pid] - marks[0][pid]
        total += used
        if used > 0:
            print(f"  {label:<28} {used * 1e6 / messages:7.0f}")
    print(f"  {'all':<28} {total * 1e6 / messages:7.0f}")
    if not py_spy:
        return
    spies: dict[int, subprocess.Popen[bytes]] = {}

    def start() -> None:
        for pid in procs:
            raw = out / f"{name}-{pid}.raw"
            spies[pid] = subprocess.Popen([str(PY_SPY), "record", "-p", str(pid), "--gil", "-r", str(PY_SPY_HZ), "-f",
                                           "raw", "-o", str(raw)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)  # fmt: skip

    def stop() -> None:
        for spy in spies.values():
            spy.send_signal(2)
        for spy in spies.values():
            spy.wait(timeout=120)

    run_driver(argv, start, stop)
    for pid, label in sorted(procs.items(), key=lambda kv: kv[1]):
        raw = out / f"{name}-{pid}.raw"
        if not raw.exists():
            continue
        parts, samples = parts_of(raw.read_text())
        if samples < PY_SPY_HZ:  # an idle process
            continue
        used = (marks[1][pid] - marks[0][pid]) * 1e6 / messages
        print(f"  {label}: {samples} samples; shares of its samples (µs/msg at its CPU above)")
        for part, n in parts.most_common():
            print(f"    {n / samples:6.1%} {n / samples * used:6.0f}  {part}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", choices=("merged", "separated"), default="merged")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--phase", default="py-send,node-send,py-recv,node-recv")
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--no-py-spy", dest="py_spy", action="store_false")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-client-profile-"))
    out = args.keep or root
    out.mkdir(parents=True, exist_ok=True)
    try:
        starter = start_merged if args.topology == "merged" else start_separated
        server, endpoint, namesrv = starter(root / args.topology, [])
        try:
            admin(namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
            for group in (PY_GROUP, NODE_GROUP):
                admin(namesrv, "group", "create", group, "--consume-from", "earliest")
            time.sleep(1.0)
            runs = phases(endpoint, args.seconds, node_modules())
            for name in args.phase.split(","):
                if name in runs:
                    profile(server, name, runs[name], out, args.py_spy)
        finally:
            server.stop()
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
