"""A replicated broker group under the official client: SIGKILL the primary under load, in a bounded
loop, and check the history: every send the client saw acknowledged is consumable afterwards
(with --min-insync 2), duplicates are reported, per-message-group order holds.

Topology: etcd (started here), a NameServer, one group of three `sluice broker --group g1` members,
one proxy. The killed member is started again at once (same port and data) and rejoins as a replica.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rocketmq import FilterExpression

from tests.e2e.support.clients import message, producer, receive_until, simple_consumer
from tests.e2e.support.cluster import LOOPBACK, SLUICE, Cluster, _start, _wait_for_brokers
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.procs import free_port

GROUP = "g1"
MEMBERS = ("b1", "b2", "b3")
KILLS = 3
SEED = 18
CONFIG = """
[broker]
heartbeat_interval_s = 1.0
[broker.replication]
lease_ttl_s = 2
max_lag_ms = 1500
[proxy]
route_refresh_s = 1.0
"""


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[Cluster, EtcdProcess]]:
    etcd = start_etcd(tmp_path)
    config = tmp_path / "replicated.toml"
    config.write_text(CONFIG)
    ns_port = free_port()
    cluster = Cluster("replicated", tmp_path, f"{LOOPBACK}:{ns_port}", [], [GROUP])
    try:
        _start(cluster, "nameserver", [*SLUICE, "nameserver", "--port", str(ns_port)], ns_port,
               f"nameserver listening on {cluster.namesrv}")  # fmt: skip
        for name in MEMBERS:
            port = free_port()
            argv = [*SLUICE, "broker", "--name", name, "--port", str(port), "--data-dir", str(tmp_path / name),
                    "--namesrv", cluster.namesrv, "--group", GROUP, "--etcd", etcd.url, "--min-insync", "2",
                    "--config", str(config)]  # fmt: skip
            _start(cluster, name, argv, port, f"broker {name} listening on {LOOPBACK}:{port}")
        _wait_for_brokers(cluster, 1)
        port = free_port()
        argv = [*SLUICE, "proxy", "--namesrv", cluster.namesrv, "--port", str(port), "--config", str(config)]
        _start(cluster, "proxy", argv, port, f"proxy listening on {LOOPBACK}:{port}")
        cluster.proxies.append(f"{LOOPBACK}:{port}")
        yield cluster, etcd
    finally:
        problems = cluster.stop()
        etcd.stop()
    assert not problems, "\n".join(problems)


def _primary(cluster: Cluster) -> str:
    """The member whose address the NameServer routes the group to."""
    rows = cluster.admin("broker", "list") or []
    address = next(r["address"] for r in rows if r["broker"] == GROUP)
    return next(n for n in MEMBERS if cluster.launches[n][1] == int(address.rsplit(":", 1)[1]))


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_sigkill_the_primary_under_load_loses_nothing_acknowledged(
    replicated: tuple[Cluster, EtcdProcess], unique: Callable[[str], str]
) -> None:
    cluster, etcd = replicated
    topic = cluster.create_topic(unique("t"), message_type="fifo", queues=4)
    group = unique("g")
    cluster.admin("group", "create", group, "--fifo")
    rng = random.Random(SEED)
    acked: list[tuple[str, str, int]] = []  # (body, message group, sequence in its group)
    failures: Counter[str] = Counter()
    stop = threading.Event()

    def produce() -> None:
        with producer(cluster.endpoints, topic) as client:
            seq: Counter[str] = Counter()
            while not stop.is_set():
                key = f"k{rng.randrange(4)}"
                body = f"{key}:{seq[key]}"
                try:
                    client.send(message(topic, body.encode(), group=key))
                except Exception as exc:  # retriable refusals during a failover
                    failures[type(exc).__name__] += 1
                    time.sleep(0.05)
                    continue  # the same sequence number is tried again: a group's order stays defined
                acked.append((body, key, seq[key]))
                seq[key] += 1

    worker = threading.Thread(target=produce, name="producer")
    worker.start()
    failovers: list[float] = []
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.0, 3.0))
            victim = _primary(cluster)
            before = len(acked)
            killed_at = time.monotonic()
            cluster.kill(victim)
            _wait("sends to succeed again", lambda before=before: len(acked) > before + 5)  # type: ignore[misc]
            failovers.append(time.monotonic() - killed_at)
            argv, port, ready = cluster.launches[victim]
            _start(cluster, victim, argv, port, ready, log_name=f"{victim}-again{len(failovers)}")
            cluster.killed.discard(victim)
            _wait("a new primary", lambda victim=victim: _primary(cluster) != victim)  # type: ignore[misc]
    finally:
        stop.set()
        worker.join(60)
    assert acked, "nothing was acknowledged"
    # The history: every acknowledged send is consumable, in order within its message group.
    wanted = {body for body, _, _ in acked}
    seen: Counter[str] = Counter()
    with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:
        got = receive_until(consumer, lambda msgs: wanted <= {m.body.decode() for m in msgs},
                            timeout_s=90, retry_unavailable=True)  # fmt: skip
    order: dict[str, list[int]] = {}
    for m in got:
        body = m.body.decode()
        seen[body] += 1
        key, n = body.split(":")
        order.setdefault(key, []).append(int(n))
    lost = wanted - set(seen)
    duplicates = sum(c - 1 for c in seen.values() if c > 1)
    print(f"acknowledged {len(acked)}, refused {dict(failures)}, duplicates {duplicates}, "
          f"sends succeeded again after each SIGKILL (s): {[round(f, 2) for f in failovers]}")  # fmt: skip
    assert not lost, f"{len(lost)} acknowledged messages lost: {sorted(lost)[:10]}"
    for key, numbers in order.items():
        firsts = list(dict.fromkeys(numbers))  # first deliveries, in order
        assert firsts == sorted(firsts), f"message group {key} out of order: {firsts[:40]}"

    # Every member listed with its role, epoch and lag; the restarted one back in sync.
    def listing() -> list[dict[str, object]]:
        return [r for r in cluster.admin("broker", "list", "--etcd", etcd.url) or [] if r["group"] == GROUP]

    _wait("every member in sync", lambda: sum(bool(r["in_sync"]) for r in listing()) == len(MEMBERS))
    rows = listing()
    assert sorted(r["name"] for r in rows) == sorted(MEMBERS)
    assert [r["role"] for r in rows].count("primary") == 1
    assert {r["epoch"] for r in rows} == {KILLS + 1}
    assert all(isinstance(r["lag_bytes"], int) for r in rows)
