#!/usr/bin/env python3
"""Where the server CPU of one official-client send goes (issue 29, item 5).

    .venv/bin/python tests/bench/send_profile.py [--seconds 10] [--no-perf] [--no-py-spy] [--no-echo] [--keep DIR]

Starts `sluice up --shards 1 --flush async` (127.0.0.1, free ports, a temp data dir), creates the
bench topic, and drives it with the official Python client's `Producer.send` from 32 threads
(tests/bench/clients/official_python.py, as tests/bench/client_bench.py does), three windows in a row:

1. **no profiler**: the server's CPU per send, per thread (from /proc/<pid>/task: the event-loop
   thread, gRPC's `event_engine` threads, the other Python threads);
2. **`perf record -e cpu-clock -g`** (if `perf` is installed and allowed): CPU-true samples of
   every thread, native and kernel code included; each sample of the loop thread is put in a layer
   by the code it was in (its shared object; for the kernel, the syscall it was serving);
3. **`py-spy record --gil`**: the loop thread's Python stacks while it holds the GIL: which part
   of that thread's time runs under one of our frames (proxy/, broker/, common/), and in which of
   our parts.

Then, unless `--no-echo`, the bare grpc.aio echo server (`sluice bench echo-server`) at the same
calls per second (`sluice bench echo --rate`, 32 tasks), windows 1 and 2 again: what a unary call
of that shape costs at that rate with none of our code (`sluice bench` sends fewer headers than
the official client).

It prints one table, each line a share of the server's CPU and the µs per send it makes at window
1's figure (and the echo's µs per call beside it): our code on the loop thread (by part, window 3
scaled to window 2's user time of that thread), what gRPC and the event loop do there, the loop
thread's kernel time by syscall, and the other threads. py-spy's `--native` view (wall clock, with
gRPC's Cython frames) is not used for the shares: py-spy stops the process for each sample, which
slowed sends ~20x here, and a thread that a wake-up preempted is sampled "in" its syscall, so
syscalls look far bigger than their CPU. `--keep DIR` keeps perf's and py-spy's raw files there.
Stops every process it started.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.bench.client_bench import QUEUES, TOPIC, WARMUP_S, admin, py_driver, start_echo  # noqa: E402
from tests.helpers.broker_fixtures import SLUICE_ARGV  # noqa: E402
from tests.helpers.procs import LOOPBACK, free_port, start_process  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
PERF_HZ = 999
PY_SPY_HZ = 100
Window = Callable[[], None]

# Our parts of a send, matched against py-spy frames from the innermost outward (first rule wins).
OUR_PARTS = [
    ("metrics (prometheus_client)", r"prometheus_client|common/metrics\.py"),
    ("logging", r"logging/__init__|common/logs\.py"),
    ("message trace", r"broker/trace\.py"),
    ("request context from metadata", r"request_context \(|client_id_of \(|headers \(|_client_id \("),
    ("admission (guard, in-flight bytes)", r"proxy/grpc/guard\.py|proxy/core/inflight\.py|Edge\._refusal"),
    ("request parse (protobuf)", r"Edge\._parse"),
    ("proxy SendMessage: convert, response", r"proxy/grpc/produce\.py|proxy/grpc/convert\.py"),
    ("proxy producer, routing", r"proxy/core/|proxy/directory\.py"),
    ("broker: commit log append (inline round)", r"broker/store/writer\.py"),
    ("broker: dispatch, message-id index (RocksDB)", r"broker/store/dispatcher\.py|broker/store/index\.py"),
    ("broker: checks, records, store", r"broker/"),
    ("proxy edge, servicer (timing, counting)", r"proxy/grpc/"),
]
OURS = re.compile(r"\((proxy|broker|common)/")
LOOP_KERNEL = {
    "sendmsg": "kernel: sendmsg (writing responses)",
    "recv": "kernel: recv",
    "recvmsg": "kernel: recv",
    "write": "kernel: eventfd writes (waking gRPC's pollers)",
    "syscall": "kernel: futex (gRPC's locks and wake-ups)",
    "epoll_pwait": "kernel: epoll (uvloop)",
    "pwritev64v2": "kernel: commit log writes (ours)",
}


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """tid -> (thread kind, CPU seconds so far)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        kind = "event-loop thread" if tid == str(pid) else comm if comm != "python" else "other Python threads"
        out[tid] = (kind, (int(fields[11]) + int(fields[12])) / ticks)
    return out


Driver = Callable[[float], list[str]]  # measured seconds -> argv of a driver printing start and end lines


def official_python(endpoint: str) -> Driver:
    def argv(seconds: float) -> list[str]:
        return py_driver({"endpoint": endpoint, "topic": TOPIC, "warmup_s": WARMUP_S, "seconds": seconds,
                          "mode": "produce", "threads": 32, "body_bytes": 1024})  # fmt: skip

    return argv


def echo_at(endpoint: str, rate: float) -> Driver:
    """`sluice bench echo` at `rate` calls/s, wrapped to print the same start and end lines."""

    def argv(seconds: float) -> list[str]:
        bench = [*SLUICE_ARGV, "bench", "echo", "--endpoint", endpoint, "--rate", str(max(1, round(rate))),
                 "--concurrency", "32", "--size", "1024", "--warmup", str(WARMUP_S), "--duration", str(seconds),
                 "--json"]  # fmt: skip
        return [sys.executable, "-c", _ECHO_WRAPPER, json.dumps(bench)]

    return argv


# The echo bench prints nothing at the end of its warm-up: time it from outside, like the driver.
_ECHO_WRAPPER = """
import json, subprocess, sys, time
bench = json.loads(sys.argv[1])
warmup = float(bench[bench.index("--warmup") + 1])
proc = subprocess.Popen(bench, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
time.sleep(warmup)
print(json.dumps({"event": "start"}), flush=True)
result = json.loads(proc.communicate()[0])
echo = result["meters"]["echo"]
print(json.dumps({"event": "end", "messages": echo["calls"], "errors": 0, "seconds": result["measured_s"]}), flush=True)
"""


def run_driver(argv: list[str], on_start: Window, on_end: Window) -> dict[str, Any]:
    """Run a driver (`argv`) to its end; `on_start`/`on_end` run at its start and end lines (after
    its warm-up). Its end line ({} if it printed none)."""
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    end: dict[str, Any] = {}
    try:
        for line in proc.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "start":
                on_start()
            elif event.get("event") == "end":
                on_end()
                end = event
    finally:
        proc.wait(timeout=120)
    return end


def drive(driver: Driver, seconds: float, on_start: Window, on_end: Window) -> dict[str, Any]:
    """One driver run (`run_driver`) that must have sent something."""
    end = run_driver(driver(seconds), on_start, on_end)
    if not end.get("messages"):
        raise RuntimeError("the driver sent nothing")
    return end


def window_threads(pid: int, driver: Driver, seconds: float) -> tuple[int, dict[str, float]]:
    marks: list[dict[str, tuple[str, float]]] = []
    end = drive(driver, seconds, lambda: marks.append(thread_cpu(pid)), lambda: marks.append(thread_cpu(pid)))
    per_kind: dict[str, float] = collections.defaultdict(float)
    for tid, (kind, cpu) in marks[1].items():
        per_kind[kind] += cpu - marks[0].get(tid, (kind, 0.0))[1]
    return int(end["messages"]), dict(per_kind)


def window_tool(argv: list[str], driver: Driver, seconds: float) -> None:
    """Run a profiler (its own process) from the driver's start line until its end line."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop() -> None:
        for proc in procs:
            proc.send_signal(2)  # both write their output on SIGINT
            proc.wait(timeout=120)

    drive(driver, seconds, start, stop)


def perf_layers(perf_data: Path, loop_tid: int) -> tuple[collections.Counter[str], int]:
    text = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "comm,tid,ip,sym,dso"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    return layers_of(text, loop_tid)


def layers_of(text: str, loop_tid: int) -> tuple[collections.Counter[str], int]:
    """`perf script -F comm,tid,ip,sym,dso` samples by layer: the loop thread's by the syscall its
    kernel time serves (the first user-space frame above `do_syscall_64`) or user space, the other
    threads' by thread; and the number of samples."""
    layers: collections.Counter[str] = collections.Counter()
    total = 0
    for block in text.split("\n\n"):
        lines = block.strip("\n").splitlines()
        if len(lines) < 2:
            continue
        comm, tid = lines[0].split()[:2]
        frames = [m.groups() for m in (re.match(r"\s*[0-9a-f]+ (.*) \((.*)\)\s*$", x) for x in lines[1:]) if m]
        if not frames:
            continue
        total += 1
        if int(tid) != loop_tid:
            layers["event_engine" if comm.startswith("event_engine") else "other Python threads"] += 1
        elif "kernel" not in frames[0][1]:
            layers["loop: user"] += 1
        else:
            user = next((f for f in frames if "kernel" not in f[1]), ("?", "?"))
            call = re.sub(r"^(__GI_)?_*(libc_)?", "", user[0]) if any(f[0] == "do_syscall_64" for f in frames) else ""
            layers[LOOP_KERNEL.get(call, "kernel: interrupts, scheduling, other")] += 1
    return layers, total


def gil_parts(raw: str) -> tuple[collections.Counter[str], int]:
    """The loop thread's samples in py-spy's raw output (`frame;frame;... count`, outermost first)
    under one of our frames, by part (the innermost frame a rule matches); and all its samples."""
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if "processes/runtime.py" not in stack:  # the loop thread runs `serve` there
            continue
        total += int(count)
        frames = stack.split(";")
        if not any(OURS.search(f) for f in frames):
            continue
        part = next((name for f in reversed(frames) for name, rx in OUR_PARTS if re.search(rx, f)), "other ours")
        parts[part] += int(count)
    return parts, total


@dataclass
class Measured:
    calls: int = 0
    seconds: float = 0.0
    per_kind: dict[str, float] = field(default_factory=dict)  # thread kind -> CPU seconds
    layers: collections.Counter[str] = field(default_factory=collections.Counter)  # perf samples by layer
    samples: int = 0

    @property
    def us(self) -> float:
        return sum(self.per_kind.values()) * 1e6 / self.calls

    def share(self, layer: str) -> float:
        return self.layers.get(layer, 0) / self.samples if self.samples else float("nan")


def measure(pid: int, driver: Driver, seconds: float, perf_data: Path | None) -> Measured:
    """Windows 1 (threads, no profiler) and 2 (perf, when `perf_data` is given) against `pid`."""
    m = Measured(seconds=seconds)
    m.calls, m.per_kind = window_threads(pid, driver, seconds)
    if perf_data is not None:
        window_tool(["perf", "record", "-q", "-F", str(PERF_HZ), "-g", "-e", "cpu-clock", "-p", str(pid), "-o",
                     str(perf_data)], driver, seconds)  # fmt: skip
        m.layers, m.samples = perf_layers(perf_data, pid)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per window (default 10)")
    ap.add_argument("--no-perf", dest="perf", action="store_false", help="skip the perf windows")
    ap.add_argument("--no-py-spy", dest="py_spy", action="store_false", help="skip the py-spy window")
    ap.add_argument("--no-echo", dest="echo", action="store_false", help="skip the bare echo server's windows")
    ap.add_argument("--keep", type=Path, help="keep perf.data and the py-spy raw file in this directory")
    args = ap.parse_args()
    if args.perf and shutil.which("perf") is None:
        print("perf is not installed: no perf window (apt-get install linux-perf)", file=sys.stderr)
        args.perf = False
    root = Path(tempfile.mkdtemp(prefix="sluice-send-profile-"))
    out = args.keep or root
    out.mkdir(parents=True, exist_ok=True)
    parts: collections.Counter[str] = collections.Counter()
    gil_total = 0
    echo: Measured | None = None
    try:
        port, ns_port, broker_port = free_port(), free_port(), free_port()
        argv = [*SLUICE_ARGV, "up", "--shards", "1", "--data-dir", str(root / "data"), "--port", str(port),
                "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--flush", "async",
                "--log-level", "warning", "--console-port", "-1"]  # fmt: skip
        child = start_process(argv, port=port, log_path=root / "up.log", name="sluice-up", timeout_s=60)
        try:
            admin(f"{LOOPBACK}:{ns_port}", "topic", "create", TOPIC, "--queues", str(QUEUES))
            driver = official_python(f"{LOOPBACK}:{port}")
            send = measure(child.pid, driver, args.seconds, out / "perf-send.data" if args.perf else None)
            if args.py_spy:
                raw = out / "py-spy-gil.raw"
                window_tool([str(PY_SPY), "record", "-p", str(child.pid), "--gil", "-r", str(PY_SPY_HZ), "-f", "raw",
                             "-o", str(raw)], driver, args.seconds)  # fmt: skip
                parts, gil_total = gil_parts(raw.read_text())
        finally:
            child.stop()
        if args.echo:
            server, endpoint = start_echo(root)
            try:
                rate = send.calls / args.seconds
                echo = measure(server.pids[0], echo_at(endpoint, rate), args.seconds,
                               out / "perf-echo.data" if args.perf else None)  # fmt: skip
            finally:
                server.stop()
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    report(send, parts, gil_total, echo)
    return 0


def report(send: Measured, parts: collections.Counter[str], gil_total: int, echo: Measured | None) -> None:
    beside = f"; bare echo at that rate {echo.us:.0f} µs per call" if echo else ""
    print(f"\nofficial Python client, 32 sending threads: {send.calls / send.seconds:,.0f} sends/s; server CPU "
          f"{send.us:.0f} µs per send{beside}")  # fmt: skip
    print("by thread (no profiler), µs per send" + (" | per echo call" if echo else ""))
    for kind, cpu in sorted(send.per_kind.items(), key=lambda kv: -kv[1]):
        if cpu > 0:
            beside = f"  | {echo.per_kind.get(kind, 0.0) * 1e6 / echo.calls:6.0f}" if echo else ""
            print(f"  {kind:<24} {cpu * 1e6 / send.calls:6.0f}{beside}")
    if not send.samples:
        return
    user = send.share("loop: user")
    ours = sum(parts.values()) / gil_total if gil_total else float("nan")
    rows: list[tuple[str, float, str]] = []  # (what, share of the send's server CPU, layer for the echo column)
    if gil_total:
        rows += [(f"ours, loop thread: {name}", user * n / gil_total, "") for name, n in parts.most_common()]
        rows.append(("gRPC aio + event loop, loop thread (Cython, uvloop, asyncio, serialising)", user * (1 - ours),
                     "loop: user"))  # fmt: skip
    else:
        rows.append(("loop thread, user space (run with py-spy to split it)", user, "loop: user"))
    kernel = sorted((k for k in send.layers if k.startswith("kernel")), key=lambda k: -send.layers[k])
    rows += [(k, send.share(k), k) for k in kernel]
    rows.append(("gRPC C-core event_engine threads", send.share("event_engine"), "event_engine"))
    rows.append(("other Python threads (gRPC's poller, commit log flush, executors)",
                 send.share("other Python threads"), "other Python threads"))  # fmt: skip
    print(f"\nattribution (perf: {send.samples} samples; py-spy --gil: {gil_total} loop-thread samples, "
          f"{ours:.0%} under our frames)")  # fmt: skip
    print(f"| {'where':<78} | share | µs/send | echo µs/call |")
    print(f"|{'-' * 80}|-------|---------|--------------|")
    for name, frac, layer in rows:
        beside = f"{echo.share(layer) * echo.us:12.0f}" if echo and echo.samples and layer else " " * 12
        print(f"| {name:<78} | {frac:5.1%} | {frac * send.us:7.0f} | {beside} |")


if __name__ == "__main__":
    sys.exit(main())
