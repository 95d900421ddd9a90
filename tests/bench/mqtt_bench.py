#!/usr/bin/env python3
"""MQTT throughput, server CPU per message and memory per connection: `sluice up` and Mosquitto side
by side, the same client and load for both (docs/mqtt.md, docs/benchmarks.md).

    .venv/bin/python tests/bench/mqtt_bench.py [--phases publish,fanout,idle,topics] [--seconds 8]
        [--rounds 1] [--publishers 4] [--window 32] [--payload 256] [--subscribers 100]
        [--connections 10000] [--topics 10,1000000] [--filters 10000] [--shards 0] [--no-mosquitto] [--json]

Phases, each after an unmeasured warm-up, alternating between the servers `--rounds` times:

- **publish**: `--publishers` connections publish QoS 1 to topics `bench/p<i>/t<j>` (8 each), each
  with `--window` PUBLISHes awaiting their PUBACK; msg/s = PUBACKs per second.
- **fanout**: `--subscribers` QoS 1 subscribers of one topic, one QoS 1 publisher; deliveries/s =
  PUBLISHes the subscribers received (and acknowledged) per second.
- **idle**: `--connections` connections (CONNECT, keep alive 600 s), 256 at a time; connects/s, and
  the servers' resident memory per connection once all are open.
- **topics** (Sluice only unless `--mosquitto-topics`): `--filters` wildcard subscriptions
  (`dev/<k>/+`, offline persistent sessions of 1,000 filters each) and, for each N of `--topics`,
  every topic `dev/<i>/t` (i < N) made by one publish, then QoS 1 publishes to random ones of them:
  server CPU per publish, which should not grow with N.

Server CPU is read from /proc (every process of `sluice up`, its shards included; the mosquitto
process) at the start and end of each measured window. The client runs here (asyncio, its own
packets) and competes with the servers for the cores: compare within one run. Mosquitto is Debian's
(`apt-get install mosquitto`, installed by this script when missing), run on loopback with its own
configuration: anonymous clients, in-memory (no persistence), max_inflight_messages as Sluice's
max_inflight (32), max_queued_messages 0 (unlimited, as a persistent Sluice session keeps every
message), TCP_NODELAY.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_bench import _popen_server, _stop_group, _wait_line, _wait_port

from bench.cpu import process_cpu_s, process_tree
from tests.helpers.broker_fixtures import SLUICE_ARGV
from tests.helpers.procs import LOOPBACK, free_port, start_process

WARMUP_S = 1.5
CONNECT_CONCURRENCY = 256
FILTERS_PER_SESSION = 1000


@dataclass
class Row:
    system: str
    phase: str
    count: int = 0  # messages, deliveries or connections
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    rss_per_conn_kib: float = 0.0
    n_topics: int = 0

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    @property
    def us_per(self) -> float:
        return self.server_cpu_s * 1e6 / self.count if self.count else 0.0


@dataclass
class Target:
    name: str
    port: int
    pids: Callable[[], list[int]]
    stop: Callable[[], object]

    def cpu_s(self) -> float:
        return process_cpu_s(tuple(self.pids()))

    def rss_kib(self) -> int:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total


def start_sluice(root: Path, shards: int) -> Target:
    port, mqtt_port = free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--data-dir", str(root / "sluice"), "--port", str(port), "--namesrv-port",
            str(free_port()), "--broker-port", str(free_port()), "--amqp-port", "-1", "--mqtt-port", str(mqtt_port),
            "--console-port", "-1", "--log-level", "warning"]  # fmt: skip
    if shards:
        argv += ["--shards", str(shards)]
    child = start_process(argv, port=port, log_path=root / "sluice.log", name="sluice-up", timeout_s=60.0)
    _wait_line(child, "proxy listening on")
    _wait_port(mqtt_port, child.popen, "sluice up (MQTT)")
    return Target("sluice", mqtt_port, lambda: process_tree(child.pid), child.stop)


def start_mosquitto(root: Path) -> Target:
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print("installing mosquitto with apt-get ...", file=sys.stderr, flush=True)
        if subprocess.run(["apt-get", "install", "-y", "-qq", "mosquitto"], env=env, check=False).returncode:
            subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "mosquitto"], env=env, check=True)
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = root / "mosquitto.conf"
    conf.write_text(f"listener {port} {LOOPBACK}\nallow_anonymous true\npersistence false\n"
                    "max_inflight_messages 32\nmax_queued_messages 0\nset_tcp_nodelay true\n"
                    "log_type error\nsys_interval 0\n")  # fmt: skip
    proc = _popen_server("mosquitto", [binary, "-c", str(conf)], root)
    _wait_port(port, proc, "mosquitto")
    return Target("mosquitto", port, lambda: [proc.pid] if proc.poll() is None else [], lambda: _stop_group(proc))


# -- the client: MQTT 3.1.1 packets written and read here ------------------------------------------


def _packet(first: int, body: bytes) -> bytes:
    n, head = len(body), bytearray((first,))
    while True:
        byte, n = n & 0x7F, n >> 7
        head.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(head) + body


def _utf8(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def connect_packet(client_id: str, clean: bool = True, keepalive: int = 600) -> bytes:
    body = _utf8("MQTT") + bytes((4, 0x02 if clean else 0)) + struct.pack(">H", keepalive) + _utf8(client_id)
    return _packet(0x10, body)


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, client_id: str, clean: bool = True) -> Client:
        reader, writer = await asyncio.open_connection(LOOPBACK, port, limit=1 << 20)
        c = cls(reader, writer)
        writer.write(connect_packet(client_id, clean))
        first, body = await c.read()
        if first != 0x20 or body[1] != 0:
            raise RuntimeError(f"CONNECT refused: {body!r}")
        return c

    async def read(self) -> tuple[int, bytes]:
        head = await self.reader.readexactly(2)
        first, size, shift, byte = head[0], head[1] & 0x7F, 7, head[1]
        while byte & 0x80:
            byte = (await self.reader.readexactly(1))[0]
            size |= (byte & 0x7F) << shift
            shift += 7
        return first, await self.reader.readexactly(size) if size else b""

    async def subscribe(self, filters: list[str], qos: int) -> None:
        body = struct.pack(">H", 1) + b"".join(_utf8(f) + bytes((qos,)) for f in filters)
        self.writer.write(_packet(0x82, body))
        while True:
            first, _ = await self.read()
            if first == 0x90:
                return

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(b"\xe0\x00")
            self.writer.close()


async def publisher(port: int, name: str, topics: Callable[[int], str], payload: bytes, window: int,
                    until: float, counted: list[int], measure_from: float, most: int = 1 << 62) -> None:  # fmt: skip
    """QoS 1 PUBLISHes with `window` awaiting PUBACK, until `until` (or `most` were sent); counts the
    PUBACKs after `measure_from`."""
    c = await Client.open(port, name)
    pid, n, outstanding = 0, 0, 0
    try:
        while True:
            now = time.monotonic()
            while outstanding < window and now < until and n < most:
                pid = pid % 65535 + 1
                topic = topics(n)
                n += 1
                c.writer.write(_packet(0x32, _utf8(topic) + struct.pack(">H", pid) + payload))
                outstanding += 1
            if outstanding == 0:
                return
            first, _ = await c.read()
            if first == 0x40:
                outstanding -= 1
                if time.monotonic() >= measure_from and time.monotonic() < until:
                    counted[0] += 1
    finally:
        c.close()


async def subscriber(c: Client, counted: list[int], measure: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            first, body = await asyncio.wait_for(c.read(), 0.5)
        except TimeoutError:
            continue
        if first & 0xF0 == 0x30:
            qos = (first >> 1) & 3
            if qos:
                (n,) = struct.unpack(">H", body[:2])
                c.writer.write(b"\x40\x02" + body[2 + n : 4 + n])
            if measure[0] <= time.monotonic() < measure[1]:
                counted[0] += 1


# -- phases ----------------------------------------------------------------------------------------


async def phase_publish(t: Target, args: argparse.Namespace) -> Row:
    counted = [0]
    start = time.monotonic()
    measure_from, until = start + WARMUP_S, start + WARMUP_S + args.seconds
    cpu: list[float] = []
    payload = b"x" * args.payload

    async def sample() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        cpu.append(t.cpu_s())
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        cpu.append(t.cpu_s())

    tag = f"{t.name}{random.randrange(1 << 30)}"
    await asyncio.gather(sample(), *(publisher(t.port, f"pub-{tag}-{i}", lambda n, i=i: f"bench/p{i}/t{n % 8}",
                                               payload, args.window, until, counted, measure_from)
                                     for i in range(args.publishers)))  # fmt: skip
    return Row(t.name, "publish", counted[0], args.seconds, cpu[1] - cpu[0])


async def phase_fanout(t: Target, args: argparse.Namespace) -> Row:
    tag = f"{random.randrange(1 << 30)}"
    topic = f"fan/{tag}"
    subs = []
    for i in range(args.subscribers):
        c = await Client.open(t.port, f"fan-{tag}-{i}")
        await c.subscribe([topic], 1)
        subs.append(c)
    counted = [0]
    start = time.monotonic()
    measure = [start + WARMUP_S, start + WARMUP_S + args.seconds]
    stop = asyncio.Event()
    readers = [asyncio.create_task(subscriber(c, counted, measure, stop)) for c in subs]
    cpu: list[float] = []

    async def sample() -> None:
        await asyncio.sleep(max(0.0, measure[0] - time.monotonic()))
        cpu.append(t.cpu_s())
        await asyncio.sleep(max(0.0, measure[1] - time.monotonic()))
        cpu.append(t.cpu_s())

    await asyncio.gather(sample(), publisher(t.port, f"fanpub-{tag}", lambda n: topic, b"y" * args.payload,
                                             args.fanout_window, measure[1], [0], measure[0]))  # fmt: skip
    stop.set()
    await asyncio.gather(*readers)
    for c in subs:
        c.close()
    return Row(t.name, "fanout", counted[0], args.seconds, cpu[1] - cpu[0])


async def phase_idle(t: Target, args: argparse.Namespace) -> Row:
    tag = f"{random.randrange(1 << 30)}"
    before_rss = t.rss_kib()
    clients: list[Client] = []
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(i: int) -> None:
        async with gate:
            clients.append(await Client.open(t.port, f"idle-{tag}-{i}"))

    cpu0 = t.cpu_s()
    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(args.connections)))
    took = time.monotonic() - start
    cpu = t.cpu_s() - cpu0
    await asyncio.sleep(3.0)  # settled
    rss = (t.rss_kib() - before_rss) / max(1, len(clients))
    for c in clients:
        c.close()
    await asyncio.sleep(2.0)
    return Row(t.name, "idle", len(clients), took, cpu, rss_per_conn_kib=rss)


async def phase_topics(t: Target, args: argparse.Namespace) -> list[Row]:
    """Wildcard filters first (offline sessions), then each N: make the topics, measure publishes."""
    rows = []
    tag = f"{random.randrange(1 << 20)}"
    for s in range(0, args.filters, FILTERS_PER_SESSION):
        c = await Client.open(t.port, f"wild-{tag}-{s}", clean=False)
        await c.subscribe([f"dev{tag}/{k}/+" for k in range(s, min(args.filters, s + FILTERS_PER_SESSION))], 1)
        c.close()
    made = 0
    payload = b"z" * args.payload
    for n_topics in sorted(int(x) for x in args.topics.split(",")):
        if n_topics > made:  # one publish to each new topic, 4 connections
            first = made
            counted = [0]
            far = time.monotonic() + 3600
            step = (n_topics - first + 3) // 4

            def new_topic(n: int, j: int, first: int = first, step: int = step) -> str:
                return f"dev{tag}/{first + j * step + n}/t"

            await asyncio.gather(*(publisher(t.port, f"mk-{tag}-{n_topics}-{j}", lambda n, j=j: new_topic(n, j),
                                             payload, args.window, far, counted, 0.0,
                                             most=min(step, n_topics - first - j * step))
                                   for j in range(4) if first + j * step < n_topics))  # fmt: skip
            made = n_topics
        rng = random.Random(n_topics)
        print(f"{t.name}: topics: {n_topics:,} made; measuring publishes to them", file=sys.stderr, flush=True)
        start = time.monotonic()
        counted, measure_from, until = [0], start + WARMUP_S, start + WARMUP_S + args.seconds
        cpu: list[float] = []

        async def sample(measure_from: float = measure_from, until: float = until, cpu: list[float] = cpu) -> None:
            await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
            cpu.append(t.cpu_s())
            await asyncio.sleep(max(0.0, until - time.monotonic()))
            cpu.append(t.cpu_s())

        def topic(_n: int, rng: random.Random = rng, n_topics: int = n_topics) -> str:
            return f"dev{tag}/{rng.randrange(n_topics)}/t"

        await asyncio.gather(sample(), *(publisher(t.port, f"tp-{tag}-{n_topics}-{i}", topic, payload,
                                                   args.window, until, counted, measure_from)
                                         for i in range(args.publishers)))  # fmt: skip
        rows.append(Row(t.name, "topics", counted[0], args.seconds, cpu[1] - cpu[0], n_topics=n_topics))
    return rows


# -- the run ---------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    out = [
        f"{'system':<10} {'phase':<8} {'topics':>8} {'count':>9} {'per s':>10} {'server us/each':>15} {'KiB/conn':>9}"
    ]
    for r in rows:
        out.append(f"{r.system:<10} {r.phase:<8} {r.n_topics or '':>8} {r.count:>9} {r.rate:>10,.0f} "
                   f"{r.us_per:>15,.1f} {r.rss_per_conn_kib or '':>9}")  # fmt: skip
    return "\n".join(out)


def best_round(rows: list[Row], system: str, phase: str) -> Row | None:
    """The round of `phase` in which `system` reached its highest rate (None if it ran none)."""
    return max((r for r in rows if r.system == system and r.phase == phase), key=lambda r: r.rate, default=None)


def ratios(rows: list[Row]) -> list[str]:
    out = []
    for phase, target in (("publish", 1.0), ("fanout", 0.8)):
        s, m = best_round(rows, "sluice", phase), best_round(rows, "mosquitto", phase)
        if s and m and m.rate:
            cpu_ratio = s.us_per / max(m.us_per, 1e-9)
            out.append(f"{phase}: {s.rate / m.rate:.2f}x Mosquitto's rate (target >= {target}x); server CPU "
                       f"{s.us_per:.1f} vs {m.us_per:.1f} us per message ({cpu_ratio:.2f}x)")  # fmt: skip
    idle = [r for r in rows if r.phase == "idle" and r.system == "sluice"]
    for r in idle:
        out.append(f"idle: {r.count} connections at {r.rate:,.0f}/s (target >= 2,000/s), {r.rss_per_conn_kib:.1f} KiB "
                   "each (target < 20 KiB)")  # fmt: skip
    topics = sorted((r for r in rows if r.phase == "topics" and r.system == "sluice"), key=lambda r: r.n_topics)
    if len(topics) >= 2 and topics[0].us_per:
        grown = topics[-1].us_per / topics[0].us_per
        out.append(f"topics: {grown:.2f}x the CPU per publish at {topics[-1].n_topics:,} topics as at "
                   f"{topics[0].n_topics:,} (target within 1.15x)")  # fmt: skip
    return out


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the publish and fan-out phases' load (shared with mqtt_floor.py)."""
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--fanout-window", type=int, default=8)
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--subscribers", type=int, default=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="publish,fanout,idle,topics")
    add_load_arguments(parser)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--topics", default="10,1000000")
    parser.add_argument("--filters", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=0, help="sluice up --shards (0: its default)")
    parser.add_argument("--no-mosquitto", action="store_true")
    parser.add_argument("--mosquitto-topics", action="store_true", help="run the topics phase on Mosquitto too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="mqtt-bench-") as tmp:
        root = Path(tmp)
        targets = [start_sluice(root, args.shards)]
        try:
            if not args.no_mosquitto:
                targets.append(start_mosquitto(root))
            for _ in range(args.rounds):
                for phase in phases:
                    for t in targets:
                        if phase == "topics" and t.name == "mosquitto" and not args.mosquitto_topics:
                            continue
                        print(f"{t.name}: {phase} ...", file=sys.stderr, flush=True)
                        if phase == "topics":
                            rows += asyncio.run(phase_topics(t, args))
                        else:
                            run = {"publish": phase_publish, "fanout": phase_fanout, "idle": phase_idle}[phase]
                            rows.append(asyncio.run(run(t, args)))
        finally:
            for t in targets:
                t.stop()
    if args.json:
        print(json.dumps([asdict(r) | {"rate": r.rate, "us_per": r.us_per} for r in rows], indent=2))
    else:
        print(table(rows))
        for line in ratios(rows):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
