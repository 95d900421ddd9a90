#!/usr/bin/env python3
"""Broker groups (docs/replication.md): what replication costs, how fast failover is, how fast a
replica catches up. Starts its own etcd and `sluice broker --group` processes on 127.0.0.1 and
drives the primary over the internal gRPC API (RemoteBroker), so the figures are the brokers'.

    .venv/bin/python tests/bench/replication_bench.py [--seconds 5] [--kills 20] [--catchup-mib 1024]

1. produce: a standalone broker and two groups of three, `--min-insync 1` and `2`, running side by
   side (in a healthy group both wait for every in-sync member, docs/replication.md): closed-loop
   throughput with B=1 and B=32 messages per send (`--concurrency` senders), measured in turns of
   a second each so that load drifting on a shared machine weighs on all three alike; then 1,000
   msg/s open loop with B=1 and its send latency (p50, p99); the ratio min-insync 2 / 1 per B.
2. failover: `--kills` times, SIGKILL the primary of a three-member group (min-insync 2) and time
   until a send on the group's new primary is acknowledged (distribution: p50, p90, p99, max).
3. catch-up: a two-member group (min-insync 1); stop the replica, write `--catchup-mib` through the
   primary, measure the disk's sequential write speed (same filesystem, 1 MiB writes + fsync),
   start the replica and time until its CommitLog is as long as the primary's.

Every process is stopped by PID at the end. Figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

import aetcd  # noqa: E402

from broker.client.api import TopicSpec  # noqa: E402
from broker.client.remote import RemoteBroker  # noqa: E402
from common.errors import SluiceError  # noqa: E402
from common.record import outgoing  # noqa: E402
from tests.helpers.broker_fixtures import ServerProcess, start_broker_process  # noqa: E402
from tests.helpers.etcd import EtcdProcess, start_etcd  # noqa: E402

TOPIC = "bench"
BODY = os.urandom(1024)
# The targets (docs/replication.md): each figure is printed with its target, and again in
# the closing summary.
MIN_INSYNC_RATIO = 0.70  # produce throughput, --min-insync 2 / --min-insync 1, per B
P99_SEND_MS = 10.0  # at 1,000 msg/s, B=1, --min-insync 2
FAILOVER_P99_S = 5.0
CATCHUP_DISK_RATIO = 0.50
SUMMARY: list[str] = []
ROUND_S = 1.0  # one turn of a produce measurement (produce_phase)


def _target(figure: str, met: bool, target: str) -> str:
    line = f"{figure} (target {target}: {'met' if met else 'NOT MET'})"
    SUMMARY.append(line)
    return line


class Group:
    def __init__(self, root: Path, etcd: EtcdProcess, members: int, min_insync: int) -> None:
        self.root, self.etcd = root, etcd
        self.group = root.name  # one group per phase: etcd keeps a group's history
        self.settings: dict[str, Any] = {
            "replication": {"group": self.group, "etcd": [etcd.url], "min_insync": min_insync, "lease_ttl_s": 2,
                            "max_lag_ms": 2000},
        }  # fmt: skip
        self.names = [f"m{i}" for i in range(members)]
        self.procs: dict[str, ServerProcess] = {}

    def start(self, name: str) -> None:
        self.procs[name] = start_broker_process(self.root, name=name, settings=self.settings)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()

    async def key(self, key: str) -> dict[str, Any] | None:
        async with aetcd.Client(host="127.0.0.1", port=self.etcd.port, timeout=2) as client:
            got = await client.get(f"/sluice/sluice/groups/{self.group}/{key}".encode())
        return None if got is None else json.loads(got.value)

    async def wait_in_sync(self, n: int, timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader, insync = await self.key("leader"), await self.key("insync")
            if leader and insync and len(insync["members"]) >= n and insync["epoch"] == leader["epoch"]:
                return leader
            await asyncio.sleep(0.1)
        raise RuntimeError(f"group did not reach {n} in-sync members")


def _messages(n: int) -> list[bytes]:
    return [outgoing(body=BODY, message_id=f"{time.monotonic_ns():x}{i:04x}") for i in range(n)]


async def closed_loop(remote: RemoteBroker, batch: int, concurrency: int, seconds: float) -> float:
    sent = 0
    stop_at = time.monotonic() + seconds

    async def sender(q: int) -> None:
        nonlocal sent
        while time.monotonic() < stop_at:
            await remote.send(TOPIC, q % 4, _messages(batch))
            sent += batch

    started = time.monotonic()
    await asyncio.gather(*(sender(i) for i in range(concurrency)))
    return sent / (time.monotonic() - started)


async def open_loop(remote: RemoteBroker, rate: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(q: int) -> None:
        t0 = time.perf_counter()
        await remote.send(TOPIC, q % 4, _messages(1))
        latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def produce_phase(root: Path, etcd: EtcdProcess, args: argparse.Namespace) -> None:
    """min_insync 0 here means a standalone broker (no group, no etcd): what replication costs.

    The three set-ups run side by side and are measured in turns of `ROUND_S` (each idle while
    another is measured), so a shared machine's load drifting during the run weighs on all three
    alike instead of on whichever was measured last."""
    setups = (0, 1, 2)
    groups: dict[int, Group] = {}
    remotes: dict[int, RemoteBroker] = {}
    try:
        for min_insync in setups:
            group = groups[min_insync] = Group(root / f"produce-{min_insync}", etcd, 3 if min_insync else 1,
                                               max(1, min_insync))  # fmt: skip
            if not min_insync:
                group.settings = {}
            for name in group.names:
                await asyncio.to_thread(group.start, name)
        for min_insync in setups:
            if min_insync:
                leader = await groups[min_insync].wait_in_sync(3)
            else:
                leader = {"address": groups[0].procs["m0"].address}
            remotes[min_insync] = RemoteBroker(groups[min_insync].group, leader["address"], timeout_s=10)
            await remotes[min_insync].create_topic(TopicSpec(TOPIC, queue_count=4))
        results: dict[tuple[int, int], float] = {}
        rounds = max(1, round(args.seconds / ROUND_S))
        for batch in (1, 32):
            for min_insync in setups:
                await closed_loop(remotes[min_insync], batch, args.concurrency, 1.0)  # warm-up
            per_round: dict[int, list[float]] = {m: [] for m in setups}
            for _ in range(rounds):
                for min_insync in setups:
                    rate = await closed_loop(remotes[min_insync], batch, args.concurrency, args.seconds / rounds)
                    per_round[min_insync].append(rate)
            for min_insync in setups:
                results[(min_insync, batch)] = statistics.mean(per_round[min_insync])
                print(f"produce min_insync={min_insync} B={batch}: {results[(min_insync, batch)]:,.0f} msg/s "
                      f"(mean of {rounds} turns of {args.seconds / rounds:.1f} s: "
                      f"{', '.join(f'{r:,.0f}' for r in per_round[min_insync])})")  # fmt: skip
        for min_insync in setups:
            lat = await open_loop(remotes[min_insync], 1000, args.seconds)
            p99_ms = _pct(lat, 0.99) * 1000
            figure = (f"produce min_insync={min_insync} 1,000 msg/s B=1: p50 {_pct(lat, 0.5) * 1000:.2f} ms, "
                      f"p99 {p99_ms:.2f} ms")  # fmt: skip
            print(_target(figure, p99_ms < P99_SEND_MS, f"p99 < {P99_SEND_MS:.0f} ms") if min_insync == 2 else figure)
    finally:
        for remote in remotes.values():
            await remote.close()
        for group in groups.values():
            group.stop()
    for batch in (1, 32):
        ratio = results[(2, batch)] / results[(1, batch)]
        figure = (f"ratio min_insync 2 / 1, B={batch}: {ratio:.1%}; "
                  f"min_insync 2 / standalone: {results[(2, batch)] / results[(0, batch)]:.0%}")  # fmt: skip
        print(_target(figure, ratio >= MIN_INSYNC_RATIO, f">= {MIN_INSYNC_RATIO:.0%} for 2 / 1"))


async def failover_phase(root: Path, etcd: EtcdProcess, args: argparse.Namespace) -> None:
    group = Group(root / "failover", etcd, 3, 2)
    times: list[float] = []
    try:
        for name in group.names:
            await asyncio.to_thread(group.start, name)
        leader = await group.wait_in_sync(3)
        remote = RemoteBroker(group.group, leader["address"], timeout_s=2)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=4))
        await remote.close()
        for _ in range(args.kills):
            leader = await group.wait_in_sync(3)
            victim = group.procs[leader["name"]]
            victim.child.signal(signal.SIGKILL)
            victim.child.popen.wait(10)
            killed = time.monotonic()
            while True:
                now = await group.key("leader")
                if now is not None and now["name"] != leader["name"]:
                    remote = RemoteBroker(group.group, now["address"], timeout_s=1)
                    try:
                        await remote.send(TOPIC, 0, _messages(1))
                        break
                    except SluiceError:
                        pass
                    finally:
                        await remote.close()
                await asyncio.sleep(0.02)
            times.append(time.monotonic() - killed)
            print(f"failover {len(times)}: {times[-1]:.2f} s")
            await asyncio.to_thread(group.start, leader["name"])
    finally:
        group.stop()
    if times:
        p99 = _pct(times, 0.99)
        figure = (f"failover over {len(times)} kills (s): p50 {_pct(times, 0.5):.2f}, p90 {_pct(times, 0.9):.2f}, "
                  f"p99 {p99:.2f}, max {max(times):.2f}, mean {statistics.mean(times):.2f}")  # fmt: skip
        print(_target(figure, p99 < FAILOVER_P99_S, f"p99 < {FAILOVER_P99_S:.0f} s"))


def _log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "commitlog").glob("*.log"))


def disk_write_mib_s(directory: Path, mib: int) -> float:
    path = directory / "seqwrite.tmp"
    chunk = os.urandom(1 << 20)
    started = time.monotonic()
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    elapsed = time.monotonic() - started
    path.unlink()
    return mib / elapsed


def _profile(out: str, pids: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    """py-spy (raw folded stacks) on each member while it catches up, into `out`-<name>.txt."""
    if not out:
        return []
    spy = Path(sys.executable).parent / "py-spy"
    return [
        subprocess.Popen([str(spy), "record", "--nonblocking", "-f", "raw", "-o", f"{out}-{name}.txt",
                          "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, pid in pids.items()
    ]  # fmt: skip


async def catchup_phase(root: Path, etcd: EtcdProcess, args: argparse.Namespace) -> None:
    group = Group(root / "catchup", etcd, 2, 1)
    try:
        for name in group.names:
            await asyncio.to_thread(group.start, name)
        leader = await group.wait_in_sync(2)
        replica = next(n for n in group.names if n != leader["name"])
        remote = RemoteBroker(group.group, leader["address"], timeout_s=10)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=4))
        group.procs[replica].stop()
        target = args.catchup_mib << 20
        while _log_bytes(group.root / leader["name"]) < target:
            await asyncio.gather(*(remote.send(TOPIC, q, _messages(32)) for q in range(4)))
        await remote.close()
        total = _log_bytes(group.root / leader["name"])
        disk = disk_write_mib_s(group.root, args.catchup_mib)
        launched = time.monotonic()
        await asyncio.to_thread(group.start, replica)
        profilers = _profile(args.profile_catchup, {n: group.procs[n].child.pid for n in group.names})
        have = _log_bytes(group.root / replica)
        while _log_bytes(group.root / replica) == have:  # noqa: ASYNC110 (another process writes the files)
            await asyncio.sleep(0.01)
        started = time.monotonic()  # the first copied bytes: process start and store recovery excluded
        while _log_bytes(group.root / replica) < total:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
        for profiler in profilers:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            profiler.wait(30)
        speed = (total - have) / (1 << 20) / elapsed
        figure = (f"catch-up of {(total - have) / (1 << 20):.0f} MiB: {elapsed:.1f} s = {speed:.0f} MiB/s (from the "
                  f"first copied byte; {started - launched:.1f} s to start); disk sequential write {disk:.0f} MiB/s; "
                  f"ratio {speed / disk:.1%}")  # fmt: skip
        print(_target(figure, speed / disk >= CATCHUP_DISK_RATIO, f">= {CATCHUP_DISK_RATIO:.0%} of the disk"))
    finally:
        group.stop()


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="replication-bench-"))
    etcd = start_etcd(root)
    try:
        if "produce" in args.phases:
            await produce_phase(root, etcd, args)
        if "failover" in args.phases:
            await failover_phase(root, etcd, args)
        if "catchup" in args.phases:
            await catchup_phase(root, etcd, args)
    finally:
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("\nsummary (targets of issue #18):")
    for line in SUMMARY:
        print(f"  {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--catchup-mib", type=int, default=1024)
    parser.add_argument("--phases", default="produce,failover,catchup")
    parser.add_argument(
        "--profile-catchup",
        default="",
        metavar="PREFIX",
        help="record py-spy profiles of the members during catch-up into PREFIX-<member>.txt",
    )
    asyncio.run(main(parser.parse_args()))
