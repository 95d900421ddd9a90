#!/usr/bin/env python3
"""Large AMQP bodies beside small traffic: aio-pika against `sluice up` and RabbitMQ, in one run.

    .venv/bin/python tests/bench/amqp_big_bodies.py [--size 16777216] [--count 8] [--in-flight 2]
                                                    [--prefetch 2] [--shards 0] [--no-rabbitmq] [--json]

Issue 44's bench (item 5): does a large body stall the server for everyone else? One connection
publishes `--count` bodies of `--size` bytes (confirms, `--in-flight` unconfirmed at once) to a
queue, then consumes them (prefetch `--prefetch`, an ack each); beside it, on a connection of its
own (in a process of its own), a small client does round trips (publish 16 bytes with a confirm,
then basic.get it) on another queue without pause. Reported per system: the large phases' throughput (MB/s) and server
CPU, and the small round trips' latency (median, p99, max) while the server is idle, while large
bodies are published and while they are consumed. A server whose event loop stops for a large
body shows it as the max. Both servers run at once and the phases alternate between them, so
both see the same machine; RabbitMQ is Debian's rabbitmq-server (3.x, default max_message_size
128 MiB), started as a private node on loopback (tests/bench/amqp_bench.py); the driver runs in
this process and competes with the servers for the cores: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing import connection as mp_connection
from multiprocessing import synchronize as mp_synchronize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aio_pika
from amqp_bench import Target, install_rabbitmq, start_rabbitmq, start_sluice

IDLE_S = 2.0  # small round trips measured with nothing else going on
SMALL = b"s" * 16


@dataclass
class Phase:
    system: str
    phase: str  # idle, publish, consume
    megabytes: float = 0.0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    small_ms: list[float] = field(default_factory=list)  # round trips of the small client meanwhile
    window: tuple[float, float] = (0.0, 0.0)  # wall-clock start and end

    def summary(self) -> dict[str, float | str]:
        ms = sorted(self.small_ms)
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else 0.0
        return {"system": self.system, "phase": self.phase, "mb_per_s": self.megabytes / self.seconds if
                self.seconds and self.megabytes else 0.0, "server_cpu_s": self.server_cpu_s,
                "small_round_trips": len(ms), "small_median_ms": statistics.median(ms) if ms else 0.0,
                "small_p99_ms": p99, "small_max_ms": ms[-1] if ms else 0.0}  # fmt: skip


async def _small_loop(url: str, queue: str, stop: mp_synchronize.Event, out: list[tuple[float, float]]) -> None:
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue(queue, exclusive=True)
        while not stop.is_set():
            start = time.perf_counter()
            await ch.default_exchange.publish(aio_pika.Message(SMALL), routing_key=queue)
            got = await q.get(fail=False, no_ack=True, timeout=30)
            if got is None:
                raise RuntimeError("the small client's confirmed message was not there")
            out.append((time.time(), (time.perf_counter() - start) * 1000))


def small_client(url: str, queue: str, stop: mp_synchronize.Event, results: mp_connection.Connection) -> None:
    """In a process of its own (so that the large client's work in this one does not delay it):
    publish-with-confirm then basic.get, again and again, until `stop`; sends (wall time at the
    end of each round trip, its ms)."""
    out: list[tuple[float, float]] = []
    asyncio.run(_small_loop(url, queue, stop, out))
    results.send(out)


async def large_phases(target: Target, args: argparse.Namespace) -> list[Phase]:
    """Idle, then publish and consume the large bodies; each phase's wall-clock window in `seconds`
    (start and end kept to assign the small client's round trips)."""
    body = os.urandom(args.size)
    queue = f"big-{os.getpid()}-{time.monotonic_ns()}"
    idle = Phase(target.name, "idle", window=(time.time(), 0.0))
    await asyncio.sleep(IDLE_S)
    idle.window, idle.seconds = (idle.window[0], time.time()), IDLE_S
    phases = [idle]
    conn = await aio_pika.connect(target.url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue(queue, exclusive=True)
        for name in ("publish", "consume"):
            phase = Phase(target.name, name)
            cpu, start, wall = target.cpu_s(), time.perf_counter(), time.time()
            if name == "publish":
                pending: set[asyncio.Future[object]] = set()
                for _ in range(args.count):
                    if len(pending) >= args.in_flight:
                        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    publish = ch.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
                    pending.add(asyncio.ensure_future(publish))
                await asyncio.gather(*pending)
            else:
                await ch.set_qos(prefetch_count=args.prefetch)
                got = 0
                async with q.iterator() as messages:
                    async for m in messages:
                        if len(m.body) != args.size:
                            raise RuntimeError(f"a body of {len(m.body)} bytes came back, {args.size} went")
                        await m.ack()
                        got += 1
                        if got == args.count:
                            break
            phase.seconds = time.perf_counter() - start
            phase.window = (wall, time.time())
            phase.server_cpu_s = target.cpu_s() - cpu
            phase.megabytes = args.count * args.size / 1e6
            phases.append(phase)
    return phases


def run_target(target: Target, args: argparse.Namespace) -> list[Phase]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    receiver, sender = ctx.Pipe(duplex=False)
    small = ctx.Process(target=small_client, args=(target.url, f"small-{os.getpid()}", stop, sender), daemon=True)
    small.start()
    try:
        time.sleep(IDLE_S)  # the small client connected and running
        phases = asyncio.run(large_phases(target, args))
    finally:
        stop.set()
    samples = receiver.recv() if receiver.poll(60) else []
    small.join(30)
    for phase in phases:
        phase.small_ms = [ms for at, ms in samples if phase.window[0] <= at <= phase.window[1]]
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=16 * 1024 * 1024, help="bytes per large body")
    parser.add_argument("--count", type=int, default=8, help="large bodies per phase")
    parser.add_argument("--in-flight", type=int, default=2, help="large publishes unconfirmed at once")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--shards", type=int, default=0, help="sluice up --shards (default: its own, one per core)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="Sluice alone")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="amqp-big-"))
    targets: list[Target] = []
    phases: list[Phase] = []
    started = time.monotonic()
    try:
        targets.append(start_sluice(root, "async", args.shards))
        if not args.no_rabbitmq:
            install_rabbitmq()
            targets.append(start_rabbitmq(root))
        for target in targets:
            phases += run_target(target, args)
    finally:
        for target in targets:
            target.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = [p.summary() for p in phases]
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows, "phases": [asdict(p) | {"small_ms": len(p.small_ms)}
                                                                      for p in phases]}))  # fmt: skip
        return 0
    print(f"\n{args.count} bodies of {args.size:,} bytes per phase, aio-pika, confirms {args.in_flight} in flight, "
          f"prefetch {args.prefetch}; a small client's publish+get round trips beside it; "
          f"{time.monotonic() - started:.0f} s in all")  # fmt: skip
    print(f"{'system':<9} {'phase':<8} {'MB/s':>7} {'server CPU s':>13} {'small n':>8} {'median ms':>10} "
          f"{'p99 ms':>8} {'max ms':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['system']:<9} {r['phase']:<8} {r['mb_per_s']:>7.1f} {r['server_cpu_s']:>13.2f} "
              f"{r['small_round_trips']:>8} {r['small_median_ms']:>10.1f} {r['small_p99_ms']:>8.1f} "
              f"{r['small_max_ms']:>8.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
