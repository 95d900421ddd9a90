"""The seeded fault schedules (support/schedules.py) across hosts, partitions made by links (issue 43).

`run_host_schedule` starts the replicated group of support/hosttopologies.py with two proxies
listing each other (etcd, NameServer, members m1-m3 `--min-insync 2`, px1, px2, each on a host of
its own) and, on the client host, the official Python client given both proxies: a producer and a
SimpleConsumer of a normal topic, and of a FIFO topic (`FIFO_GROUPS` message groups, each sent in
order) (support/hostclient.py, one process each). Meanwhile it injects the faults `gap_s` apart,
then stops producing and consumes until every acknowledged send is settled. The process faults are
schedules.py's (SIGKILL or SIGSTOP of the primary, SIGKILL of a replica, SIGSTOP of etcd, SIGKILL of
the proxy the FIFO sends go through); the partitions take hosts off the network instead of cutting
relays: `cut-replica` (a replica's host for `DOWN_S`), `cut-replicas` (both replicas' hosts: writes
are refused "fewer than min_insync" while it lasts, the one fault that may fail sends) and
`cut-primary` (the primary's host, until another member took the group and `DOWN_S` passed: cut off
from etcd and from its replicas). The result has the shape of `schedules.report`: per topic sends
acknowledged and failed after the client's retries and the history verdict, per fault kind the
longest span without an acknowledged send from the fault on and the sends that failed meanwhile;
and the lines of the processes' logs a fault must not cause (`schedules.log_noise`).
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

from tests.e2e.support import hosttopologies as topo
from tests.e2e.support.hostclient import Seen
from tests.e2e.support.hostlab import HostCluster
from tests.e2e.support.schedules import (
    DOWN_S,
    ETCD_STOP_S,
    FAULTS,
    FIFO_GROUPS,
    STOP_S,
    FaultSeen,
    Sends,
    log_noise,
    report,
)
from tests.helpers.hosts import Lab

HOST_PARTITIONS = ("cut-replica", "cut-replicas", "cut-primary")
PROXIES = 2
DRAIN_S = 120.0


def draw_on_hosts(seed: int, count: int, *, partitions: bool = False) -> list[str]:
    """`count` faults drawn from `seed` (from `HOST_PARTITIONS` too with `partitions`)."""
    rng = random.Random(seed)
    kinds = FAULTS + HOST_PARTITIONS if partitions else FAULTS
    return [rng.choice(kinds) for _ in range(count)]


def inject(cluster: HostCluster, fault: str) -> None:
    """Cause `fault` and end it (restart, resume, heal)."""
    if fault == "kill-proxy":  # the Python client's FIFO channel sorts the proxies' addresses: the first
        victim = min((h for h in cluster.lab.hosts.values() if h.name.startswith("px")), key=lambda h: h.address)
        _kill_and_restart(cluster, victim.name, DOWN_S)
        return
    if fault == "stop-etcd":
        _pause(cluster, "etcd", ETCD_STOP_S)
        return
    leader = topo.wait_for_primary(cluster)
    replicas = [m for m in topo.MEMBERS if m != leader]
    if fault == "kill-primary":
        cluster.processes[leader][1].signal(signal.SIGKILL)
        topo.wait_for_primary(cluster, other_than=leader)
        cluster.restart(leader)
    elif fault == "stop-primary":
        _pause(cluster, leader, STOP_S)
    elif fault == "kill-replica":
        _kill_and_restart(cluster, replicas[0], DOWN_S)
    elif fault in ("cut-replica", "cut-replicas"):
        hosts = [cluster.lab.hosts[r] for r in (replicas if fault == "cut-replicas" else replicas[:1])]
        _cut(hosts, DOWN_S)
    elif fault == "cut-primary":
        host = cluster.lab.hosts[leader]
        host.cut()
        try:
            topo.wait_for_primary(cluster, other_than=leader)
            time.sleep(DOWN_S)
        finally:
            host.heal()
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS + HOST_PARTITIONS)}")


def _kill_and_restart(cluster: HostCluster, name: str, down_s: float) -> None:
    child = cluster.processes[name][1]
    child.signal(signal.SIGKILL)
    child.popen.wait(timeout=10)
    time.sleep(down_s)
    cluster.restart(name)


def _pause(cluster: HostCluster, name: str, stop_s: float) -> None:
    child = cluster.processes[name][1]
    child.signal(signal.SIGSTOP)
    time.sleep(stop_s)
    child.signal(signal.SIGCONT)


def _cut(hosts: list[Any], down_s: float) -> None:
    for host in hosts:
        host.cut()
    try:
        time.sleep(down_s)
    finally:
        for host in hosts:
            host.heal()


def _sends(seen: Seen) -> Sends:
    return Sends(acked_at=list(seen.sent_at), failed_at=list(seen.failed_at))


def run_host_schedule(root: Path, faults: list[str], gap_s: float, *, name: str = "s") -> dict[str, Any]:
    """Run `faults` (each `gap_s` after the previous one ended) under traffic on namespace hosts;
    every process, namespace and bridge is removed at the end. JSON-ready (`schedules.report`)."""
    with Lab() as lab:
        cluster = topo.replicated(lab, root, proxies=PROXIES)
        endpoints = ";".join(cluster.lab.hosts[f"px{i + 1}"].endpoint(topo.PROXY_PORT) for i in range(PROXIES))
        normal, fifo = f"{name}-n", f"{name}-f"
        cluster.admin("topic", "create", normal, "--queues", "4")
        cluster.admin("topic", "create", fifo, "--queues", "4", "--type", "fifo")
        cluster.admin("group", "create", f"{name}-gn")
        cluster.admin("group", "create", f"{name}-gf", "--fifo")
        produce_s = gap_s * (len(faults) + 1) + len(faults) * (DOWN_S + STOP_S) + 60.0  # ended by the schedule
        started = time.monotonic()
        runs = {
            "normal": cluster.traffic(endpoints, normal, f"{name}-gn", produce_s=produce_s, drain_s=DRAIN_S),
            "fifo": cluster.traffic(endpoints, fifo, f"{name}-gf", produce_s=produce_s, drain_s=DRAIN_S,
                                    fifo_groups=FIFO_GROUPS),
        }  # fmt: skip
        windows: list[tuple[str, float, float, float]] = []  # fault, start, ended, next start
        time.sleep(gap_s)
        for fault in faults:
            start = time.monotonic()
            inject(cluster, fault)
            ended = time.monotonic()
            time.sleep(gap_s)
            windows.append((fault, start, ended, time.monotonic()))
        for child, _ in runs.values():  # stop producing now: the clients drain what was acknowledged
            child.signal(signal.SIGUSR1)
        seen = {kind: cluster.finish(child, events, produce_s + DRAIN_S) for kind, (child, events) in runs.items()}
        seen_faults = []
        for fault, start, ended, until in windows:
            gap = max(s.longest_gap(start, until) for s in seen.values())
            resumed = all(any(ended <= t <= until for t in s.sent_at) for s in seen.values())
            failed = sum(sum(1 for t in s.failed_at if start <= t <= until) for s in seen.values())
            seen_faults.append(FaultSeen(fault, round(gap, 2), resumed, failed))
        result = report(faults, seen_faults, {k: (_sends(s), s.history) for k, s in seen.items()})
        result["duration_s"] = round(time.monotonic() - started, 1)
    # The Sluice processes' logs; the clients' are the application's (the official client logs its
    # retried failures with tracebacks).
    result["log_noise"] = [line for line in log_noise(root / "logs") if not line.startswith("client-")]
    return result
