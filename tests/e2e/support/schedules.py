"""Fault schedules against a replicated group while applications run: what an application sees.

`run_schedule` starts etcd, a NameServer, one group of three `--min-insync 2` members and two
proxies that list each other in routes (support/replicated.py, `lease_ttl_s` 2), then runs, through
the official Python client given both proxies: a producer of a normal topic and one of a FIFO topic
(`FIFO_GROUPS` message groups, each sent in order), a SimpleConsumer of the normal topic and
`FIFO_CONSUMERS` of the FIFO topic's group (so a message group's next message could reach one consumer
while another still holds the previous one), each acking everything.
Meanwhile it injects the given faults `gap_s` apart, then stops producing and consumes until every
acknowledged send is settled. The result says, per topic, how many sends were acknowledged and how
many failed after the client's own retries, the longest span without an acknowledged send around
each fault, whether sends were acknowledged again after each fault, and the history verdicts
(support/history.py: lost, redelivered after ack, FIFO order, one handle version delivered twice).

Faults (`FAULTS`): SIGKILL of the primary (restarted once replaced), SIGSTOP of the primary for
`STOP_S`, SIGKILL of a replica (restarted `DOWN_S` later), SIGSTOP of etcd for `ETCD_STOP_S`
(shorter than the lease), SIGKILL of the proxy the client's FIFO sends go through (restarted
`DOWN_S` later). With `partitions`, each member dials the others' replication ports through a
fault proxy per pair (`--repl-dial`, tests/helpers/faultproxy.py), and `PARTITIONS` join them: one
replica's path to the primary cut for `DOWN_S` as a blackhole (bytes stall) or with resets, and
both replicas' paths blackholed (writes are refused "fewer than min_insync" while it lasts: the one
fault that may fail sends). Used by tests/e2e/test_failover_schedules.py (short, bounded) and
tests/bench/failover_soak.py (longer).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketmq import FilterExpression, Producer

from tests.e2e.support.clients import message, producer, simple_consumer
from tests.e2e.support.cluster import Cluster
from tests.e2e.support.history import History
from tests.e2e.support.replicated import (
    MEMBERS,
    consume,
    new_primary,
    primary,
    restart,
    retrying,
    start_replicated,
    wait,
)
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.faultproxy import FaultProxy, Mode
from tests.helpers.procs import LOOPBACK, free_port

FAULTS = ("kill-primary", "stop-primary", "kill-replica", "stop-etcd", "kill-proxy")
PARTITIONS = ("blackhole-replica", "reset-replica", "blackhole-replicas")
FIFO_GROUPS = 4
FIFO_CONSUMERS = 2  # SimpleConsumers of the FIFO topic's group, each in a thread of its own
STOP_S = 4.0  # a paused primary: past its term (lease 2 s), so a replica takes over
DOWN_S = 3.0  # a killed replica or proxy stays down this long
ETCD_STOP_S = 1.5  # shorter than the 2-s lease: no failover should follow
NOISE = ("Traceback", "DbClosedError", "Task was destroyed", "Unhandled exception")


@dataclass
class Sends:
    """What one producer saw: each acknowledged send's time, and sends that failed after retries."""

    acked_at: list[float] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def failed(self) -> int:
        return len(self.failed_at)

    def ok(self) -> None:
        with self.lock:
            self.acked_at.append(time.monotonic())

    def fail(self) -> None:
        with self.lock:
            self.failed_at.append(time.monotonic())

    def failed_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.failed_at if start <= t <= end)

    def attempts(self) -> int:
        return len(self.acked_at) + self.failed

    def between(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [t for t in self.acked_at if start <= t <= end]

    def longest_gap(self, start: float, end: float) -> float:
        stamps = [start, *self.between(start, end), end]
        return max(b - a for a, b in itertools.pairwise(stamps))


def produce(client: Producer, topic: str, history: History, sends: Sends, stop: threading.Event, fifo: bool) -> None:
    """Send until `stop`: one message at a time, a FIFO topic's to `FIFO_GROUPS` groups in turn
    (each group's messages numbered in order); a send failed after the client's retries is sent
    again with the same number, so each group's order stays defined."""
    rng, n = random.Random(7), Counter[str]()
    while not stop.is_set():
        key = f"k{rng.randrange(FIFO_GROUPS)}" if fifo else "n"
        body = f"{topic}:{key}:{n[key]}"
        try:
            client.send(message(topic, body.encode(), group=key if fifo else None))
        except Exception:  # failed after the client's own retries
            sends.fail()
            time.sleep(0.05)
            continue
        history.sent(body, stream=key if fifo else None)
        sends.ok()
        n[key] += 1


def fifo_proxy(cluster: Cluster) -> str:
    """The proxy the Python client's FIFO sends go through: its channel to a queue listing every
    proxy (proxy/grpc/route.py) sorts the addresses and connects to the first that answers."""
    return cluster.proxy_process(min(cluster.proxies))


def inject(cluster: Cluster, etcd: EtcdProcess, fault: str, links: dict[tuple[str, str], FaultProxy]) -> None:
    """Cause `fault` and end it (restart, resume, heal); `links`: (member, other) -> the fault proxy
    on member's path to other's replication port (for partitions)."""
    if fault == "kill-proxy":
        victim = fifo_proxy(cluster)
        cluster.kill(victim)
        time.sleep(DOWN_S)
        restart(cluster, victim)
        return
    leader = primary(cluster)
    if fault == "kill-primary":
        cluster.kill(leader)
        wait("a new primary", lambda: new_primary(cluster, leader))
        restart(cluster, leader)
    elif fault == "stop-primary":
        cluster.processes[leader].signal(signal.SIGSTOP)
        time.sleep(STOP_S)
        cluster.processes[leader].signal(signal.SIGCONT)
    elif fault == "kill-replica":
        replica = next(m for m in MEMBERS if m != leader)
        cluster.kill(replica)
        time.sleep(DOWN_S)
        restart(cluster, replica)
    elif fault == "stop-etcd":
        etcd.child.signal(signal.SIGSTOP)
        time.sleep(ETCD_STOP_S)
        etcd.child.signal(signal.SIGCONT)
    elif fault in PARTITIONS:
        replicas = [m for m in MEMBERS if m != leader]
        cut = [links[r, leader] for r in (replicas if fault == "blackhole-replicas" else replicas[:1])]
        for path in cut:
            path.set_mode(Mode.CLOSE if fault == "reset-replica" else Mode.BLACKHOLE)
        time.sleep(DOWN_S)
        for path in cut:
            path.set_mode(Mode.FORWARD)
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def draw(seed: int, count: int, *, partitions: bool = False) -> list[str]:
    """`count` faults drawn from `seed` (from `PARTITIONS` too with `partitions`)."""
    rng = random.Random(seed)
    kinds = FAULTS + PARTITIONS if partitions else FAULTS
    return [rng.choice(kinds) for _ in range(count)]


@dataclass
class FaultSeen:
    fault: str
    longest_gap_s: float  # longest span without an acknowledged send (either topic) from the fault on
    resumed: bool  # a send of each topic was acknowledged after the fault ended
    failed: int  # sends (either topic) that failed after the client's retries, from the fault on


def run_schedule(root: Path, faults: list[str], gap_s: float, *, name: str = "s") -> dict[str, Any]:
    """Run `faults` (each `gap_s` after the previous one ended) under traffic; every process is
        stopped at the end. The result is JSON-ready (`report`), with the problems of stopping the
    processes and the noise of their logs."""
    etcd = start_etcd(root)
    links: dict[tuple[str, str], FaultProxy] = {}
    if any(f in PARTITIONS for f in faults):
        repl_ports = {name: free_port() for name in MEMBERS}
        args: dict[str, list[str]] = {name: ["--repl-port", str(port)] for name, port in repl_ports.items()}
        for name, other in itertools.permutations(MEMBERS, 2):
            links[name, other] = FaultProxy(f"{LOOPBACK}:{repl_ports[other]}").start()
            args[name] += ["--repl-dial", f"{other}={links[name, other].address}"]
    else:
        args = {}
    try:
        cluster = start_replicated(root, etcd.url, proxies=2, member_args=args)
    except BaseException:
        for path in links.values():
            path.stop()
        etcd.stop()
        raise
    try:
        # Retried: on a loaded machine the group may change primaries while it settles.
        normal, fifo, group_n, group_f = f"{name}-n", f"{name}-f", f"{name}-gn", f"{name}-gf"
        retrying("create the normal topic", lambda: cluster.create_topic(normal))
        retrying("create the FIFO topic", lambda: cluster.create_topic(fifo, message_type="fifo"))
        retrying("create a group", lambda: cluster.create_group(group_n))
        retrying("create a FIFO group", lambda: cluster.create_group(group_f, fifo=True))
        # One history per topic: a history knows stored copies by (queue, offset), not by topic.
        history_n, history_f, sends_n, sends_f, stop = History(), History(), Sends(), Sends(), threading.Event()
        seen: list[FaultSeen] = []
        with contextlib.ExitStack() as clients:
            client = clients.enter_context(producer(cluster.endpoints, normal, fifo))
            cn = clients.enter_context(simple_consumer(cluster.endpoints, group_n, {normal: FilterExpression()}))
            cfs = [clients.enter_context(simple_consumer(cluster.endpoints, group_f, {fifo: FilterExpression()}))
                   for _ in range(FIFO_CONSUMERS)]  # fmt: skip
            held: list[Any] = []
            threads = [
                threading.Thread(target=produce, args=(client, normal, history_n, sends_n, stop, False)),
                threading.Thread(target=produce, args=(client, fifo, history_f, sends_f, stop, True)),
                *(threading.Thread(target=consume, args=(c, h, held, stop.is_set),
                                   kwargs={"hold": False, "timeout_s": 3600})
                  for c, h in ((cn, history_n), *((cf, history_f) for cf in cfs))),
            ]  # fmt: skip
            for t in threads:
                t.start()
            try:
                time.sleep(gap_s)
                for fault in faults:
                    start = time.monotonic()
                    inject(cluster, etcd, fault, links)
                    ended = time.monotonic()
                    time.sleep(gap_s)
                    now = time.monotonic()
                    gap = max(sends_n.longest_gap(start, now), sends_f.longest_gap(start, now))
                    resumed = bool(sends_n.between(ended, now)) and bool(sends_f.between(ended, now))
                    failed = sends_n.failed_between(start, now) + sends_f.failed_between(start, now)
                    seen.append(FaultSeen(fault, round(gap, 2), resumed, failed))
            finally:
                stop.set()
                for t in threads:
                    t.join(120)
            for consumer, history in ((cn, history_n), (cfs[0], history_f)):
                everything = set(history.sends)
                consume(consumer, history, held, lambda h=history, e=everything: e <= h.settled(), hold=False,
                        timeout_s=120)  # fmt: skip
        result = report(faults, seen, {"normal": (sends_n, history_n), "fifo": (sends_f, history_f)})
    finally:
        problems = cluster.stop()
        for path in links.values():
            path.stop()
        etcd.stop()
    result["stop_problems"] = problems
    result["log_noise"] = log_noise(root)
    return result


def log_noise(root: Path) -> list[str]:
    """Lines of the processes' logs under `root` that a fault must not cause (docs/replication.md:
    a fault leaves no traceback in a log)."""
    return [f"{log.name}: {line.strip()}" for log in sorted(root.glob("*.log"))
            for line in log.read_text(errors="replace").splitlines() if any(n in line for n in NOISE)]  # fmt: skip


def report(faults: list[str], seen: list[FaultSeen], topics: dict[str, tuple[Sends, History]]) -> dict[str, Any]:
    out: dict[str, Any] = {"faults": faults}
    for kind, (sends, history) in topics.items():
        verdict = history.verdict()
        out[kind] = {
            "acknowledged": len(sends.acked_at),
            "failed_after_retries": sends.failed,
            "failed_pct": round(100 * sends.failed / max(1, sends.attempts()), 2),
            "lost": len(verdict.lost),
            "redelivered_after_ack": len(verdict.redelivered_after_ack),
            "out_of_order": len(verdict.out_of_order),
            "same_handle_twice": len(verdict.same_handle_twice),
            "acks_failed": len(history.unsure),
            "verdict": verdict.summary(),
        }
    per_fault: dict[str, list[float]] = {}
    failed: Counter[str] = Counter()
    for s in seen:
        per_fault.setdefault(s.fault, []).append(s.longest_gap_s)
        failed[s.fault] += s.failed
    out["longest_gap_s_per_fault"] = per_fault
    out["failed_sends_per_fault"] = dict(failed)
    out["not_resumed_after"] = [s.fault for s in seen if not s.resumed]
    return out
