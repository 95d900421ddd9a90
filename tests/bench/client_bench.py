#!/usr/bin/env python3
"""The official clients' path, side by side with peers (issue 17), in one run on this machine.

    .venv/bin/python tests/bench/client_bench.py [--seconds 8] [--install-peers] [--no-node] [--no-peers]
                                                 [--topology merged|separated|both] [--py-drivers 1] [--json]

What users run is one message per SendMessage and one AckMessage per message: unary calls. This bench
measures the server CPU per message on that path and compares it with the bare gRPC ceiling and with
two peer brokers driven by their own Python clients:

- echo: the bare grpc.aio echo server (`sluice bench echo-server`), unary B=1, 64 in flight: the
  server CPU of one unary call with a 1 KiB payload (the floor of any unary RPC in Python); then,
  after the Sluice rows, once more at each official client row's messages/s (`@rate` rows): a server
  that is not saturated pays more per call (fewer calls share each wake-up), and the official
  Python client's own CPU keeps Sluice below saturation, so that ratio is printed too (INFO);
- Sluice with the official Python client (`rocketmq-python-client`): `Producer.send` from 32 threads;
  `SimpleConsumer.receive(32)` + `ack` per message from 4 threads (tests/bench/clients/official_python.py);
  one process is bound by its own GIL at ~0.9 cores before Sluice is busy, so `--py-drivers N` runs N
  such processes counting over one window (rows `official python xN`);
- Sluice with the official Node.js client (`rocketmq-client-nodejs`, installed by npm into
  tests/e2e/node/node_modules as the end-to-end tests do): 64 concurrent `send()`, 8 receive loops;
- NATS JetStream (`nats-server -js`, nats-py; file storage, awaited publish acks) and RabbitMQ
  (Debian's `rabbitmq-server`, aio-pika; durable queue, persistent messages, publisher confirms),
  1 KiB, 64 in flight (tests/bench/clients/peers.py).

Every client runs in its own process; its CPU is not counted. The servers' CPU (user + system, all
threads, from /proc) is sampled when the driver prints its start and end lines, after a warm-up.
The peers are not project dependencies: `--install-peers` installs them (apt-get: rabbitmq-server,
nats-server; pip into this virtualenv: aio-pika, nats-py); without them their rows are skipped with
the reason. Every server is bound to 127.0.0.1 on free ports with data in a temp dir, stopped by PID,
and the temp dir removed.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.cpu import machine_busy_s, process_cpu_s  # noqa: E402
from tests.helpers.broker_fixtures import (  # noqa: E402
    SLUICE_ARGV,
    ServerProcess,
    start_broker_process,
    start_nameserver_process,
)
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process  # noqa: E402

CLIENTS = Path(__file__).resolve().parent / "clients"
NODE_DIR = REPO_ROOT / "tests" / "e2e" / "node"
TOPIC = "client-bench"
PY_GROUP = "client-bench-py"
NODE_GROUP = "client-bench-node"
QUEUES = 8
BODY_BYTES = 1024
WARMUP_S = 2.0
START_TIMEOUT_S = 60.0
DRIVER_GRACE_S = 90.0
TOGETHER_START_S = 12.0  # --py-drivers: start-up and warm-up before the common window
TOGETHER_LATE_S = 0.5  # a driver that starts counting later than this is noted
TARGET_ECHO_RATIO = 1.6
TARGET_RABBIT_RATIO = 2.5


@dataclass
class Row:
    system: str
    client: str
    phase: str
    messages: int = 0
    errors: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    other_cores: float = 0.0
    note: str = ""
    paced_as: str = ""  # an echo row run at the rate of the row with this key

    @property
    def key(self) -> str:
        return f"{self.system} {self.client} {self.phase}"

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else float("nan")

    @property
    def us_per_msg(self) -> float:
        return self.server_cpu_s * 1e6 / self.messages if self.messages else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {"system": self.system, "client": self.client, "phase": self.phase, "messages": self.messages,
                "errors": self.errors, "seconds": self.seconds, "messages_per_s": round(self.rate, 1),
                "server_us_per_message": round(self.us_per_msg, 1), "other_cores": self.other_cores,
                "note": self.note}  # fmt: skip


@dataclass
class Server:
    name: str
    pids: list[int]
    stoppers: list[Any] = field(default_factory=list)

    def stop(self) -> None:
        for stopper in reversed(self.stoppers):
            stopper()


# -- measuring a driver ---------------------------------------------------------------------------


def _row_started(row: Row) -> None:
    """The start of a row's progress line on stderr (`_row_done` ends it)."""
    print(f"  {row.system:<9} {row.client:<16} {row.phase:<8}", end="", file=sys.stderr, flush=True)


def _row_done(row: Row) -> None:
    print(f"{row.rate:>9,.0f} msg/s  server {row.us_per_msg:7,.0f} µs/msg  errors {row.errors}  "
          f"other {row.other_cores:.2f} cores {row.note}", file=sys.stderr, flush=True)  # fmt: skip


def drive(row: Row, argv: list[str], server: Server) -> Row:
    """Run a driver (its own process) and sample `server`'s CPU at its start and end lines."""
    _row_started(row)
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: tuple[float, float, float] | None = None
    deadline = time.monotonic() + DRIVER_GRACE_S + WARMUP_S + 60
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            now = (time.process_time(), process_cpu_s(tuple(server.pids)), machine_busy_s())
            if event.get("event") == "start":
                started = now
            elif event.get("event") == "end" and started is not None:
                row.messages, row.errors, row.seconds = event["messages"], event["errors"], event["seconds"]
                row.server_cpu_s = now[1] - started[1]
                other = (now[2] - started[2]) - row.server_cpu_s
                row.other_cores = round(max(0.0, other) / max(row.seconds, 1e-9), 2)  # includes the driver
            elif event.get("event") == "error":
                row.note = str(event.get("error", ""))[:200]
            if time.monotonic() > deadline:
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        row.note = row.note or "driver did not stop in time"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not row.messages and not row.note:
        lines = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        row.note = lines[-1][:200] if lines else f"driver exited {proc.returncode} with no messages"
    _row_done(row)
    return row


def drive_together(row: Row, opts: dict[str, Any], drivers: int, server: Server) -> Row:
    """`drivers` official Python driver processes counting over one window: each is told to start
    counting at the same instant (`start_at`, after `TOGETHER_START_S` for start-up and warm-up), and
    the server's CPU is sampled at that instant and `seconds` later. One driver process is bound by
    its own GIL before the server is busy; several show what the server does at a higher rate."""
    _row_started(row)
    start_at = time.time() + TOGETHER_START_S
    argv = py_driver({**opts, "start_at": start_at})
    procs = [subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(drivers)]  # fmt: skip
    try:
        time.sleep(max(0.0, start_at - time.time()))
        begin = (process_cpu_s(tuple(server.pids)), machine_busy_s())
        time.sleep(float(opts["seconds"]))
        end = (process_cpu_s(tuple(server.pids)), machine_busy_s())
        for proc in procs:
            out, _ = proc.communicate(timeout=DRIVER_GRACE_S)
            for event in (json.loads(line) for line in out.splitlines() if line.startswith("{")):
                if event.get("event") == "start" and event.get("late_s", 0) > TOGETHER_LATE_S:
                    row.note = f"a driver started counting {event['late_s']} s late"
                elif event.get("event") == "end":
                    row.messages += event["messages"]
                    row.errors += event["errors"]
                    row.seconds = max(row.seconds, event["seconds"])
    except subprocess.TimeoutExpired:
        row.note = row.note or "a driver did not stop in time"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    row.server_cpu_s = end[0] - begin[0]
    row.other_cores = round(max(0.0, (end[1] - begin[1]) - row.server_cpu_s) / float(opts["seconds"]), 2)
    row.client = f"{row.client} x{drivers}"
    _row_done(row)
    return row


def py_driver(opts: dict[str, Any]) -> list[str]:
    return [sys.executable, str(CLIENTS / "official_python.py"), json.dumps(opts)]


def node_driver(opts: dict[str, Any]) -> list[str]:
    return ["node", str(CLIENTS / "official_node.js"), json.dumps(opts)]


def peer_driver(opts: dict[str, Any]) -> list[str]:
    return [sys.executable, str(CLIENTS / "peers.py"), json.dumps(opts)]


def sluice_bench_echo(server: Server, endpoint: str, seconds: float, at: Row | None = None) -> Row:
    """The bare gRPC ceiling through `sluice bench echo` (B=1, 64 in flight): as fast as it answers,
    or, given a measured row `at`, at that row's messages/s (open loop): what a unary call costs a
    server that is not saturated, as Sluice is not when a client's own CPU limits the rate."""
    row = Row("echo", "sluice bench", "unary") if at is None else Row("echo", "sluice bench", "@rate", paced_as=at.key)
    _row_started(row)
    pace = ["--max"] if at is None else ["--rate", str(max(1, round(at.rate)))]
    argv = [*SLUICE_ARGV, "bench", "echo", "--endpoint", endpoint, "--duration", str(seconds), "--warmup",
            str(WARMUP_S), "--json", "--quiet", *pace, "--batch", "1", "--concurrency", "64",
            "--watch-pids", ",".join(map(str, server.pids))]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=seconds + 120, check=False)
    result = json.loads(done.stdout)
    meter, cpu = result["meters"]["echo"], result["cpu"]
    row.messages, row.seconds = int(meter["messages"]), float(result.get("duration_s", seconds))
    row.errors = int(result["error_total"])
    row.server_cpu_s = float(cpu["watched_s"])
    row.other_cores = float(cpu["other_cores"])
    if meter.get("messages_per_s"):
        row.seconds = row.messages / float(meter["messages_per_s"])
    print(f"{row.rate:>9,.0f} msg/s  server {row.us_per_msg:7,.0f} µs/call", file=sys.stderr, flush=True)
    return row


# -- servers --------------------------------------------------------------------------------------


def _wait_line(child: ChildProcess, line: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while line not in child.output():
        if not child.running() or time.monotonic() > deadline:
            child.stop()
            raise RuntimeError(f"{child.name} did not print {line!r}:\n{child.tail()}")
        time.sleep(0.05)


def start_echo(root: Path) -> tuple[Server, str]:
    port = free_port()
    argv = [*SLUICE_ARGV, "bench", "echo-server", "--port", str(port)]
    child = start_process(argv, port=port, log_path=root / "echo.log", name="echo-server")
    return Server("echo", [child.pid], [child.stop]), f"{LOOPBACK}:{port}"


def start_merged(root: Path, workers: list[str]) -> tuple[Server, str, str]:
    port, ns_port, broker_port = free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / "merged"), "--port", str(port), "--namesrv-port",
            str(ns_port), "--broker-port", str(broker_port), "--flush", "async", "--log-level", "warning",
            "--console-port", "-1", *workers]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / "merged.log", name="sluice-up", timeout_s=START_TIMEOUT_S)
    _wait_line(child, "proxy listening on")
    return Server("merged", [child.pid], [child.stop]), f"{LOOPBACK}:{port}", f"{LOOPBACK}:{ns_port}"


def start_separated(root: Path, workers: list[str]) -> tuple[Server, str, str]:
    children: list[ChildProcess | ServerProcess] = []
    try:
        ns = start_nameserver_process(root, "--log-level", "warning", timeout_s=START_TIMEOUT_S)
        children.append(ns)
        children.append(start_broker_process(root, name="broker-a", namesrv=ns.address,
                                             extra_args=["--flush", "async", "--log-level", "warning"]))  # fmt: skip
        port = free_port()
        argv = [*SLUICE_ARGV, "proxy", "--namesrv", ns.address, "--port", str(port), "--log-level", "warning",
                *workers]  # fmt: skip
        proxy = start_process(argv, port=port, log_path=root / "proxy.log", name="sluice-proxy")
        children.append(proxy)
        _wait_line(proxy, "proxy listening on")
    except BaseException:
        for child in reversed(children):
            child.stop()
        raise
    pids = [c.child.pid if isinstance(c, ServerProcess) else c.pid for c in children]
    return Server("separated", pids, [c.stop for c in children]), f"{LOOPBACK}:{port}", ns.address


def admin(namesrv: str, *args: str) -> None:
    argv = [*SLUICE_ARGV, "admin", "--namesrv", namesrv, *args]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sluice admin {' '.join(args)} failed: {done.stderr.strip()}")


def _popen_server(name: str, argv: list[str], root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = (root / f"{name}.log").open("wb")
    return subprocess.Popen(argv, cwd=root, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            start_new_session=True)  # fmt: skip


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s:g} s")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a peer server we started in its own session (RabbitMQ's script starts beam and epmd under it)."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            time.sleep(0.5)
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return


def start_nats(root: Path) -> tuple[Server, str]:
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("nats-server is not installed (run with --install-peers)")
    port = free_port()
    proc = _popen_server("nats", [binary, "-js", "-a", LOOPBACK, "-p", str(port), "-sd", str(root / "nats")], root)
    _wait_port(port, proc, "nats-server")
    return Server("nats", [proc.pid], [lambda: _stop_group(proc)]), f"nats://{LOOPBACK}:{port}"


def start_rabbitmq(root: Path) -> tuple[Server, str]:
    script = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    if not script.exists():
        raise RuntimeError("rabbitmq-server is not installed (run with --install-peers)")
    home = root / "rabbitmq"
    home.mkdir()
    (home / "enabled_plugins").write_text("[].\n")
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    env = {"HOME": str(home), "RABBITMQ_NODENAME": f"sluicebench{port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(dist_port),
           "RABBITMQ_MNESIA_BASE": str(home / "mnesia"), "RABBITMQ_LOG_BASE": str(home / "log"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"), "RABBITMQ_PID_FILE": str(home / "pid"),
           "ERL_EPMD_ADDRESS": LOOPBACK, "ERL_EPMD_PORT": str(epmd_port),
           "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}  # fmt: skip
    proc = _popen_server("rabbitmq", [str(script)], root, env)
    _wait_port(port, proc, "rabbitmq-server", timeout_s=90.0)
    return Server("rabbitmq", [proc.pid], [lambda: _stop_group(proc)]), f"amqp://guest:guest@{LOOPBACK}:{port}/"


# -- the run --------------------------------------------------------------------------------------


def install_peers() -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if shutil.which("nats-server") is None or not Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists():
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "rabbitmq-server", "nats-server"], check=True, env=env)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "aio-pika", "nats-py"], check=True)


def node_modules() -> Path | None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None
    if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                       capture_output=True, timeout=300, check=False)  # fmt: skip
    modules = NODE_DIR / "node_modules"
    return modules if (modules / "rocketmq-client-nodejs").exists() else None


def sluice_rows(name: str, server: Server, endpoint: str, namesrv: str, seconds: float,
                modules: Path | None, py_drivers: int = 1) -> list[Row]:  # fmt: skip
    admin(namesrv, "topic", "create", TOPIC, "--queues", str(QUEUES))
    for group in (PY_GROUP, NODE_GROUP):
        admin(namesrv, "group", "create", group, "--consume-from", "earliest")
    base = {"endpoint": endpoint, "topic": TOPIC, "warmup_s": WARMUP_S, "seconds": seconds}

    def python(phase: str, opts: dict[str, Any]) -> Row:
        row = Row(name, "official python", phase)
        if py_drivers > 1:
            return drive_together(row, {**base, **opts}, py_drivers, server)
        return drive(row, py_driver({**base, **opts}), server)

    rows = [python("send", {"mode": "produce", "threads": 32, "body_bytes": BODY_BYTES})]
    node_base = {**base, "modulesDir": str(modules), "warmupS": WARMUP_S, "bodyBytes": BODY_BYTES}
    if modules is not None:
        rows.append(drive(Row(name, "official node", "send"),
                          node_driver({**node_base, "mode": "produce", "concurrency": 64}), server))  # fmt: skip
    rows.append(python("recv+ack", {"mode": "consume", "group": PY_GROUP, "threads": 4, "batch": 32}))
    if modules is not None:
        rows.append(drive(Row(name, "official node", "recv+ack"),
                          node_driver({**node_base, "mode": "consume", "group": NODE_GROUP, "concurrency": 8,
                                       "batch": 32}), server))  # fmt: skip
    return rows


def peer_rows(name: str, server: Server, url: str, seconds: float) -> list[Row]:
    base = {"peer": name, "url": url, "warmup_s": WARMUP_S, "seconds": seconds, "body_bytes": BODY_BYTES}
    client = {"nats": "nats-py", "rabbitmq": "aio-pika"}[name]
    return [
        drive(Row(name, client, "send"), peer_driver({**base, "mode": "produce", "concurrency": 64}), server),
        drive(
            Row(name, client, "recv+ack"), peer_driver({**base, "mode": "consume", "batch": 32, "consumers": 2}), server
        ),
    ]


def run(args: argparse.Namespace, root: Path) -> list[Row]:
    rows: list[Row] = []
    server, endpoint = start_echo(root)
    try:
        rows.append(sluice_bench_echo(server, endpoint, args.seconds))
    finally:
        server.stop()
    modules = None if args.no_node else node_modules()
    if modules is None and not args.no_node:
        print("  (official Node.js client skipped: node/npm missing or npm install failed)", file=sys.stderr)
    topologies = ("merged", "separated") if args.topology == "both" else (args.topology,)
    for name in topologies:
        starter = start_merged if name == "merged" else start_separated
        workers = ["--workers", str(args.workers)] if args.workers else []
        if workers and name == "merged":  # sluice up takes proxy workers only as one shard (docs/workers.md)
            workers = ["--shards", "1", *workers]
        server, endpoint, namesrv = starter(root / name, workers)
        try:
            rows += sluice_rows(name, server, endpoint, namesrv, args.seconds, modules, args.py_drivers)
        finally:
            server.stop()
    matched = [r for r in rows if r.client.startswith("official") and r.messages] if args.matched_echo else []
    if matched:
        server, endpoint = start_echo(root)
        try:
            rows += [sluice_bench_echo(server, endpoint, args.seconds, at=r) for r in matched]
        finally:
            server.stop()
    if not args.no_peers:
        for name, peer_starter in (("nats", start_nats), ("rabbitmq", start_rabbitmq)):
            try:
                server, url = peer_starter(root)
            except RuntimeError as exc:
                print(f"  {name} skipped: {exc}", file=sys.stderr)
                continue
            try:
                rows += peer_rows(name, server, url, args.seconds)
            finally:
                server.stop()
    return rows


def verdicts(rows: list[Row]) -> list[dict[str, Any]]:
    echo = next((r for r in rows if r.system == "echo" and r.phase == "unary"), None)
    rabbit = [r for r in rows if r.system == "rabbitmq" and r.messages]
    out: list[dict[str, Any]] = []
    for r in rows:
        if r.client.startswith("official") and r.messages:
            if echo and echo.messages:
                ratio = r.us_per_msg / echo.us_per_msg
                out.append({"target": f"{r.system} {r.client} {r.phase}: server CPU/msg <= "
                            f"{TARGET_ECHO_RATIO}x echo's per call", "value": round(ratio, 2),
                            "goal": TARGET_ECHO_RATIO, "met": ratio <= TARGET_ECHO_RATIO})  # fmt: skip
            paced = next((e for e in rows if e.paced_as == r.key and e.messages), None)
            if paced is not None:  # informational: not the target, the like-for-like figure
                ratio = r.us_per_msg / paced.us_per_msg
                out.append({"target": f"{r.system} {r.client} {r.phase}: server CPU/msg against echo's per call "
                            f"at the same rate ({paced.rate:,.0f}/s: {paced.us_per_msg:,.0f} µs)",
                            "value": round(ratio, 2), "goal": None, "met": None})  # fmt: skip
            peer = next((p for p in rabbit if p.phase == r.phase), None)
            if peer is not None:
                ratio = r.us_per_msg / peer.us_per_msg
                out.append({"target": f"{r.system} {r.client} {r.phase}: server CPU/msg <= "
                            f"{TARGET_RABBIT_RATIO}x RabbitMQ's", "value": round(ratio, 2),
                            "goal": TARGET_RABBIT_RATIO, "met": ratio <= TARGET_RABBIT_RATIO})  # fmt: skip
    return out


def table(rows: list[Row]) -> str:
    head = ("system", "client", "phase", "msg/s", "server µs/msg", "errors", "other cores", "note")
    body = [(r.system, r.client, r.phase, f"{r.rate:,.0f}", f"{r.us_per_msg:,.0f}", str(r.errors),
             f"{r.other_cores:.2f}", f"rate of {r.paced_as}" if r.paced_as else r.note) for r in rows]  # fmt: skip
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    align = ["<", "<", "<", ">", ">", ">", ">", "<"]
    return "\n".join("  ".join(f"{c:{a}{w}}" for c, a, w in zip(line, align, widths, strict=True)).rstrip()
                     for line in [head, *body])  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per phase (default 8)")
    ap.add_argument("--topology", choices=("merged", "separated", "both"), default="merged")
    ap.add_argument("--workers", type=int, help="proxy worker processes (default: Sluice's default, one per core)")
    ap.add_argument("--install-peers", action="store_true", help="apt-get/pip install RabbitMQ, NATS and their clients")
    ap.add_argument("--py-drivers", type=int, default=1,
                    help="official Python driver processes per row, counting over one window (default 1)")  # fmt: skip
    ap.add_argument("--no-node", action="store_true", help="skip the official Node.js client")
    ap.add_argument("--no-peers", action="store_true", help="skip RabbitMQ and NATS")
    ap.add_argument(
        "--no-matched-echo",
        dest="matched_echo",
        action="store_false",
        help="skip the echo runs at each official client row's rate",
    )
    ap.add_argument("--json", action="store_true", help="print rows and targets as JSON")
    args = ap.parse_args()
    if args.install_peers:
        install_peers()
    root = Path(tempfile.mkdtemp(prefix="sluice-client-bench-"))
    started = time.monotonic()
    try:
        rows = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = verdicts(rows)
    if args.json:
        print(json.dumps({"rows": [r.as_json() for r in rows], "targets": results}, indent=2))
        return 0
    print(f"\nclient bench, {os.cpu_count()} cores, {args.seconds:g} s per phase after {WARMUP_S:g} s warm-up, "
          f"{time.monotonic() - started:.0f} s in all; 1 KiB bodies; server µs/msg = CPU of the server processes "
          "per message (per call for echo); other cores = everything else, the client driver included\n")  # fmt: skip
    print(table(rows))
    print("\ntargets:")
    for v in results:
        verdict = "INFO" if v["met"] is None else "MET " if v["met"] else "MISS"
        print(f"  {verdict} {v['target']}: {v['value']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
