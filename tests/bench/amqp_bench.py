#!/usr/bin/env python3
"""AMQP throughput and server CPU per message: aio-pika against `sluice up` and RabbitMQ, in one run.

    .venv/bin/python tests/bench/amqp_bench.py [--seconds 8] [--rounds 2] [--in-flight 64]
                                                [--prefetch 256] [--flush async] [--no-rabbitmq] [--json]
                                                [--max-length N] [--max-length-bytes N]

Issue 32's bench: 1 KiB persistent messages (delivery mode 2) to a durable queue; PUBLISH with
publisher confirms and `--in-flight` unconfirmed at once, for `--seconds`; CONSUME the backlog
that left with prefetch `--prefetch` and one ack per message, for at most `--seconds`. Each phase
starts after an unmeasured warm-up. Both servers run at once; the phases alternate between them
(`--rounds` times), so both see the same machine. Server CPU is read from /proc at the start and
the end of each phase: for Sluice every process of `sluice up` (all its shards), for RabbitMQ
every process of the private node (beam.smp, epmd, erl_child_setup: the processes whose
environment names the node). RabbitMQ is Debian's rabbitmq-server, installed by this script with
apt-get when missing (not a project dependency), started as a private node on loopback (own ports,
data and log directories in a temporary directory) and stopped by its PIDs at the end. The table
ends with Sluice/RabbitMQ ratios against the issue's targets (publish >= 1.0x, consume >= 0.8x,
server CPU per message <= 1.2x). The driver runs in this process and competes with the servers for
the cores: on a shared machine, compare within one run. `--max-length` and `--max-length-bytes`
declare the queue with those limits on both servers: above the backlog they measure the check
alone (a publish batch asks the broker for the ready count, or count and body bytes), below it
drop-head at work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aio_pika
from client_bench import _popen_server, _stop_group, _wait_line, _wait_port

from bench.cpu import process_cpu_s
from tests.helpers.broker_fixtures import SLUICE_ARGV
from tests.helpers.procs import LOOPBACK, free_port, start_process

BODY = b"x" * 1024
WARMUP_S = 1.0
QUEUE = "amqp-bench"


@dataclass
class Row:
    system: str
    phase: str
    messages: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def us_per_msg(self) -> float:
        return self.server_cpu_s * 1e6 / self.messages if self.messages else 0.0


@dataclass
class Target:
    """A server under test: its AMQP URL, its CPU seconds so far, how to stop it."""

    name: str
    url: str
    cpu_s: Callable[[], float]
    stop: Callable[[], object]


def start_sluice(root: Path, flush: str, shards: int) -> Target:
    port, amqp_port = free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / "sluice"), "--port", str(port), "--namesrv-port",
            str(free_port()), "--broker-port", str(free_port()), "--amqp-port", str(amqp_port), "--flush", flush,
            "--mqtt-port", "-1", "--console-port", "-1", "--log-level", "warning"]  # fmt: skip
    if shards:
        argv += ["--shards", str(shards)]
    child = start_process(argv, port=port, log_path=root / "sluice.log", name="sluice-up", timeout_s=60.0)
    _wait_line(child, "proxy listening on")
    _wait_port(amqp_port, child.popen, "sluice up (AMQP)")
    # every process of `sluice up`: its shards (or proxy workers) are its descendants
    return Target("sluice", f"amqp://guest:guest@{LOOPBACK}:{amqp_port}/", lambda: process_cpu_s((child.pid,)),
                  child.stop)  # fmt: skip


RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def install_rabbitmq() -> None:
    """Debian's rabbitmq-server, when it is not there (apt-get as root; not a project dependency).
    Its package starts no service here (policy-rc.d); the bench starts its own node."""
    if RABBITMQ_SERVER.exists():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("installing rabbitmq-server with apt-get ...", file=sys.stderr, flush=True)
    if subprocess.run(["apt-get", "install", "-y", "-qq", "rabbitmq-server"], env=env, check=False).returncode:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "rabbitmq-server"], env=env, check=True)


def _node_pids(marker: bytes) -> list[int]:
    """The processes whose environment holds `marker` (beam.smp, epmd, erl_child_setup and the
    start script of one RabbitMQ node: epmd daemonizes, so it is no descendant of the script)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
    return pids


def start_rabbitmq(root: Path) -> Target:
    """A private RabbitMQ node on loopback: own node name, AMQP, distribution and epmd ports, data
    and logs under `root`."""
    home = root / "rabbitmq"
    home.mkdir()
    (home / "enabled_plugins").write_text("[].\n")
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    node = f"sluicebench{port}-{os.getpid()}@localhost"
    env = {"HOME": str(home), "RABBITMQ_NODENAME": node, "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(dist_port),
           "RABBITMQ_MNESIA_BASE": str(home / "mnesia"), "RABBITMQ_LOG_BASE": str(home / "log"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"), "RABBITMQ_PID_FILE": str(home / "pid"),
           "ERL_EPMD_ADDRESS": LOOPBACK, "ERL_EPMD_PORT": str(epmd_port),
           "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}  # fmt: skip
    proc = _popen_server("rabbitmq", [str(RABBITMQ_SERVER)], root, env)
    marker = f"RABBITMQ_NODENAME={node}".encode()

    def stop() -> None:
        _stop_group(proc)
        for pid in _node_pids(marker):  # epmd left its session: stopped by its PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    try:
        _wait_port(port, proc, "rabbitmq-server", timeout_s=120.0)
    except BaseException:
        stop()
        raise
    return Target("rabbitmq", f"amqp://guest:guest@{LOOPBACK}:{port}/",
                  lambda: process_cpu_s(tuple(_node_pids(marker))), stop)  # fmt: skip


def queue_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The bench queue's arguments: the limits asked for (`--max-length`, `--max-length-bytes`)."""
    limits = {"x-max-length": args.max_length, "x-max-length-bytes": args.max_length_bytes}
    return {name: value for name, value in limits.items() if value is not None}


async def publish(url: str, seconds: float, in_flight: int, server: Target, arguments: dict[str, Any]) -> Row:
    row = Row(server.name, "publish")
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(QUEUE, durable=True, arguments=arguments)
        slots = asyncio.Semaphore(in_flight)
        counting = False
        pending: set[asyncio.Task[None]] = set()

        async def one() -> None:
            nonlocal counting
            try:
                msg = aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                await ch.default_exchange.publish(msg, routing_key=QUEUE)
                if counting:
                    row.messages += 1
            finally:
                slots.release()

        async def run_for(duration: float) -> None:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                await slots.acquire()
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)

        await run_for(WARMUP_S)
        cpu0, t0 = server.cpu_s(), time.monotonic()
        counting = True
        await run_for(seconds)
        await asyncio.gather(*pending)
        row.seconds, row.server_cpu_s = time.monotonic() - t0, server.cpu_s() - cpu0
    return row


async def consume(url: str, seconds: float, prefetch: int, server: Target, arguments: dict[str, Any]) -> Row:
    row = Row(server.name, "consume")
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=prefetch)
        queue = await ch.declare_queue(QUEUE, durable=True, arguments=arguments)
        backlog = queue.declaration_result.message_count or 0
        done = asyncio.Event()
        counting = False
        seen = 0
        t0 = cpu0 = 0.0

        async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal counting, seen, t0, cpu0
            await msg.ack()
            seen += 1
            if counting:
                row.messages += 1
            if seen >= backlog:
                done.set()

        tag = await queue.consume(on_message)
        await asyncio.sleep(WARMUP_S)
        cpu0, t0 = server.cpu_s(), time.monotonic()
        counting = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), seconds)
        row.seconds, row.server_cpu_s = time.monotonic() - t0, server.cpu_s() - cpu0
        await queue.cancel(tag)
        await queue.purge()
    return row


def measure(server: Target, args: argparse.Namespace) -> list[Row]:
    arguments = queue_arguments(args)
    rows = [asyncio.run(publish(server.url, args.seconds, args.in_flight, server, arguments))]
    rows.append(asyncio.run(consume(server.url, args.seconds, args.prefetch, server, arguments)))
    for r in rows:
        print(f"  {r.system:<9} {r.phase:<8} {r.rate:>9,.0f} msg/s  server {r.us_per_msg:7,.0f} µs/msg "
              f"({r.messages} messages in {r.seconds:.1f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def summed(rows: list[Row]) -> list[Row]:
    """One row per system and phase over the rounds."""
    out: dict[tuple[str, str], Row] = {}
    for r in rows:
        s = out.setdefault((r.system, r.phase), Row(r.system, r.phase))
        s.messages, s.seconds, s.server_cpu_s = (
            s.messages + r.messages,
            s.seconds + r.seconds,
            s.server_cpu_s + r.server_cpu_s,
        )
    return list(out.values())


TARGETS = {"publish": ("msg/s", 1.0, ">="), "consume": ("msg/s", 0.8, ">=")}
CPU_TARGET = 1.2


def ratios(rows: list[Row]) -> list[tuple[str, float, str]]:
    """(what, Sluice/RabbitMQ, target) per phase: the rate and the server CPU per message."""
    by = {(r.system, r.phase): r for r in rows}
    out = []
    for phase, (_, target, _) in TARGETS.items():
        s, r = by.get(("sluice", phase)), by.get(("rabbitmq", phase))
        if s is None or r is None or not r.rate or not r.us_per_msg:
            continue
        out.append((f"{phase} msg/s", s.rate / r.rate, f">= {target:g}x"))
        out.append((f"{phase} server CPU/msg", s.us_per_msg / r.us_per_msg, f"<= {CPU_TARGET:g}x"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measured phase")
    parser.add_argument("--rounds", type=int, default=2, help="publish+consume rounds per system, alternating")
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--flush", choices=("sync", "async"), default="async")
    parser.add_argument("--shards", type=int, default=0, help="sluice up --shards (default: its own, one per core)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="Sluice alone")
    parser.add_argument("--max-length", type=int, default=None, help="declare the queue with this x-max-length")
    parser.add_argument("--max-length-bytes", type=int, default=None,
                        help="declare the queue with this x-max-length-bytes (the cost of a byte limit; "
                             "set it above the backlog for the check alone, below for drop-head at work)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="amqp-bench-"))
    rows: list[Row] = []
    targets: list[Target] = []
    started = time.monotonic()
    try:
        targets.append(start_sluice(root, args.flush, args.shards))
        if not args.no_rabbitmq:
            install_rabbitmq()
            targets.append(start_rabbitmq(root))
        for _ in range(args.rounds):
            for target in targets:
                rows += measure(target, args)
    finally:
        for target in targets:
            target.stop()
        shutil.rmtree(root, ignore_errors=True)
    total = summed(rows)
    if args.json:
        print(json.dumps({"rows": [asdict(r) | {"messages_per_s": round(r.rate), "server_us_per_message":
                                                round(r.us_per_msg)} for r in total],
                          "ratios": {what: round(v, 2) for what, v, _ in ratios(total)}}))  # fmt: skip
        return 0
    limit = "".join(f" {k} {v:,}" for k, v in queue_arguments(args).items())
    print(f"\n1 KiB persistent, durable queue{limit}, aio-pika; confirms {args.in_flight} in flight, prefetch "
          f"{args.prefetch} + ack each; {args.rounds} x {args.seconds:g} s per phase; Sluice --flush {args.flush}; "
          f"{time.monotonic() - started:.0f} s in all")  # fmt: skip
    print(f"{'system':<9} {'phase':<8} {'messages':>9} {'msg/s':>9} {'server µs/msg':>14}")
    for r in total:
        print(f"{r.system:<9} {r.phase:<8} {r.messages:>9,} {r.rate:>9,.0f} {r.us_per_msg:>14,.0f}")
    for what, value, goal in ratios(total):
        print(f"sluice/rabbitmq {what:<22} {value:5.2f}x  (target {goal})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
