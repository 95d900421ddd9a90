#!/usr/bin/env python3
"""AMQP throughput and server CPU per message: aio-pika against `sluice up`, and RabbitMQ beside it.

    .venv/bin/python tests/bench/amqp_bench.py [--seconds 10] [--in-flight 64] [--prefetch 256]
                                                [--flush async] [--workers 1] [--rabbitmq] [--json]

The shape of issue 32's bench: 1 KiB persistent messages (delivery mode 2) to a durable queue;
PUBLISH with publisher confirms and `--in-flight` unconfirmed at once, for `--seconds`; CONSUME the
backlog that left with prefetch `--prefetch` and one ack per message, for at most `--seconds`. Each
phase starts after an unmeasured warm-up. The server's CPU (all its processes, from /proc) is
sampled at the start and the end of each phase. `--rabbitmq` also runs Debian's rabbitmq-server
(tests/bench/client_bench.py starts it on free ports; `client_bench.py --install-peers` installs it)
in the same run. The driver runs in this process (one core of a 2-core machine): on a shared
machine, compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aio_pika
from client_bench import Server, _wait_line, start_rabbitmq

from deploy.bench.cpu import process_cpu_s
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


def start_sluice(root: Path, flush: str, workers: int) -> tuple[Server, str]:
    port, amqp_port = free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / "sluice"), "--port", str(port), "--namesrv-port",
            str(free_port()), "--broker-port", str(free_port()), "--amqp-port", str(amqp_port), "--flush", flush,
            "--workers", str(workers), "--console-port", "-1", "--log-level", "warning"]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / "sluice.log", name="sluice-up", timeout_s=60.0)
    _wait_line(child, "proxy listening on")
    return Server("sluice", [child.pid], [child.stop]), f"amqp://guest:guest@{LOOPBACK}:{amqp_port}/"


def _cpu(server: Server) -> float:
    return process_cpu_s(tuple(server.pids))  # with their descendants (proxy workers)


async def publish(url: str, seconds: float, in_flight: int, server: Server) -> Row:
    row = Row(server.name, "publish")
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(QUEUE, durable=True)
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
        cpu0, t0 = _cpu(server), time.monotonic()
        counting = True
        await run_for(seconds)
        await asyncio.gather(*pending)
        row.seconds, row.server_cpu_s = time.monotonic() - t0, _cpu(server) - cpu0
    return row


async def consume(url: str, seconds: float, prefetch: int, server: Server) -> Row:
    row = Row(server.name, "consume")
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=prefetch)
        queue = await ch.declare_queue(QUEUE, durable=True)
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
        cpu0, t0 = _cpu(server), time.monotonic()
        counting = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), seconds)
        row.seconds, row.server_cpu_s = time.monotonic() - t0, _cpu(server) - cpu0
        await queue.cancel(tag)
        await queue.purge()
    return row


def measure(server: Server, url: str, args: argparse.Namespace) -> list[Row]:
    rows = [asyncio.run(publish(url, args.seconds, args.in_flight, server))]
    rows.append(asyncio.run(consume(url, args.seconds, args.prefetch, server)))
    for r in rows:
        print(f"  {r.system:<9} {r.phase:<8} {r.rate:>9,.0f} msg/s  server {r.us_per_msg:7,.0f} µs/msg "
              f"({r.messages} messages in {r.seconds:.1f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--flush", choices=("sync", "async"), default="async")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rabbitmq", action="store_true", help="run rabbitmq-server beside Sluice")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="amqp-bench-"))
    rows: list[Row] = []
    try:
        starters = [lambda: start_sluice(root, args.flush, args.workers)]
        if args.rabbitmq:
            starters.append(lambda: start_rabbitmq(root))
        for start in starters:
            server, url = start()
            try:
                rows += measure(server, url, args)
            finally:
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps([asdict(r) | {"messages_per_s": round(r.rate), "server_us_per_message": round(r.us_per_msg)}
                          for r in rows]))  # fmt: skip
    else:
        print(f"{'system':<9} {'phase':<8} {'msg/s':>9} {'server µs/msg':>14}")
        for r in rows:
            print(f"{r.system:<9} {r.phase:<8} {r.rate:>9,.0f} {r.us_per_msg:>14,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
