"""A replicated broker group on separate hosts (issue 43): etcd, the NameServer, three members of
group g1 (`--min-insync 2`) and a proxy each on a host of its own, every Sluice process on 0.0.0.0,
the official Python client on a client host. Partitions: a replica cut off from its primary, and
the primary cut off from etcd and from its replicas until another member takes the group; after the
heal the old primary must never take the route back from its successor (item 4: registrations carry
the primary's epoch and the NameServer orders them by it). Each is history-checked and the time
without an acknowledged send is measured."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.support.hostclient import Seen
from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Host, Lab, unavailable

NAMESRV_PORT, BROKER_PORT, REPL_PORT, PROXY_PORT, ETCD_PORT = 9876, 10911, 10912, 8081, 2379
MEMBERS = ("m1", "m2", "m3")
GROUP = "g1"
CONFIG = """
[broker]
heartbeat_interval_s = 1.0
[broker.replication]
lease_ttl_s = 2
max_lag_ms = 1500
[proxy]
route_refresh_s = 1.0
"""
WARM_S = 3.0
REPLICA_CUT_S = 5.0
PRIMARY_CUT_S = 4.0  # past the 2-s lease (another member takes the group), short enough that the old
# primary's registrations sent during the cut reach the NameServer after the heal (TCP retransmits them)
AFTER_S = 6.0
FAILOVER_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("hosts-replicated")
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    with Lab() as lab:
        etcd, ns = lab.add_host("etcd"), lab.add_host("ns")
        members = [lab.add_host(name) for name in MEMBERS]
        px, client = lab.add_host("px"), lab.add_host("client")
        cluster = HostCluster(lab, root, client, namesrv=ns.endpoint(NAMESRV_PORT))
        cluster.start(etcd, "etcd", "etcd", "--host", etcd.address, "--port", str(ETCD_PORT),
                      "--data-dir", str(root / "etcd"), "--log-level", "warning", port=ETCD_PORT)  # fmt: skip
        cluster.start(ns, "nameserver", "nameserver", "--host", "0.0.0.0", "--port", str(NAMESRV_PORT),
                      port=NAMESRV_PORT)  # fmt: skip
        etcd_url = f"http://{etcd.endpoint(ETCD_PORT)}"
        cluster.start_together([
            (host, host.name, ["broker", "--host", "0.0.0.0", "--name", host.name, "--port", str(BROKER_PORT),
                               "--data-dir", str(root / host.name), "--namesrv", cluster.namesrv, "--group", GROUP,
                               "--etcd", etcd_url, "--min-insync", "2", "--repl-port", str(REPL_PORT),
                               "--config", str(config)], BROKER_PORT)
            for host in members
        ])  # fmt: skip
        cluster.wait_brokers(1)
        cluster.start(px, "proxy", "proxy", "--host", "0.0.0.0", "--namesrv", cluster.namesrv, "--workers", "1",
                      "--drain-s", "0", "--config", str(config), port=PROXY_PORT)  # fmt: skip
        yield cluster


def routed_primary(cluster: HostCluster) -> str | None:
    """The member host the NameServer routes the group to (None while it routes it nowhere)."""
    rows = cluster.admin("broker", "list") or []
    address = next((r["address"] for r in rows if r["broker"] == GROUP), None)
    host = None if address is None else address.rsplit(":", 1)[0]
    return next((h.name for h in cluster.lab.hosts.values() if h.address == host), None)


def wait_for_primary(cluster: HostCluster, other_than: str | None = None) -> str:
    deadline = time.monotonic() + FAILOVER_TIMEOUT_S
    while True:
        name = routed_primary(cluster)
        if name is not None and name != other_than:
            return name
        assert time.monotonic() < deadline, f"no primary other than {other_than} within {FAILOVER_TIMEOUT_S} s"
        time.sleep(0.3)


def traffic_through(cluster: HostCluster, unique: Callable[[str], str], produce_s: float) -> tuple[object, object]:
    topic, group = unique("t"), unique("g")
    cluster.admin("topic", "create", topic, "--queues", "4")
    cluster.admin("group", "create", group)
    return cluster.traffic(cluster.lab.hosts["px"].endpoint(PROXY_PORT), topic, group, produce_s=produce_s)


def summary(what: str, seen: Seen, cut_at: float, healed_at: float) -> str:
    during, after = seen.longest_gap(cut_at, healed_at), seen.longest_gap(healed_at, healed_at + AFTER_S)
    return (f"{what}: longest without an acknowledged send during the cut {during:.2f} s, after the heal "
            f"{after:.2f} s; {len(seen.failed_at)} sends failed; {seen.history.verdict().summary()}")  # fmt: skip


def test_a_replica_cut_off_from_its_primary_costs_nothing_acknowledged(
    replicated: HostCluster, unique: Callable[[str], str]
) -> None:
    primary = wait_for_primary(replicated)
    victim: Host = replicated.lab.hosts[next(m for m in MEMBERS if m != primary)]
    child, events = traffic_through(replicated, unique, WARM_S + REPLICA_CUT_S + AFTER_S)
    time.sleep(WARM_S)
    cut_at = time.monotonic()
    victim.cut()
    try:
        time.sleep(REPLICA_CUT_S)
    finally:
        victim.heal()
    healed_at = time.monotonic()
    seen = replicated.finish(child, events, WARM_S + REPLICA_CUT_S + AFTER_S + 60)  # type: ignore[arg-type]
    print(summary(f"replica {victim.name} cut", seen, cut_at, healed_at))
    seen.history.verdict().assert_nothing_lost()
    assert routed_primary(replicated) == primary


def _registrations(cluster: HostCluster) -> list[str]:
    """The addresses the NameServer registered group g1 at, in order (its log)."""
    text = cluster.processes["nameserver"][1].output()
    return re.findall(rf"broker regist\w+(?: changed)? broker={GROUP} cluster=\S+ address=(\S+)", text)


def test_a_healed_primary_never_takes_its_route_back(replicated: HostCluster, unique: Callable[[str], str]) -> None:
    old = wait_for_primary(replicated)
    victim = replicated.lab.hosts[old]
    child, events = traffic_through(replicated, unique, WARM_S + PRIMARY_CUT_S + AFTER_S)
    time.sleep(WARM_S)
    cut_at = time.monotonic()
    victim.cut()
    try:
        new = wait_for_primary(replicated, other_than=old)
        time.sleep(max(0.0, cut_at + PRIMARY_CUT_S - time.monotonic()))
    finally:
        victim.heal()
    healed_at = time.monotonic()
    seen = replicated.finish(child, events, WARM_S + PRIMARY_CUT_S + AFTER_S + 60)  # type: ignore[arg-type]
    print(summary(f"primary {old} cut", seen, cut_at, healed_at))
    seen.history.verdict().assert_nothing_lost()
    # Once the successor registered, the NameServer never routed the group to the old primary again.
    addresses = _registrations(replicated)
    new_address = replicated.lab.hosts[new].endpoint(BROKER_PORT)
    after = addresses[addresses.index(new_address) :]
    assert victim.endpoint(BROKER_PORT) not in after, addresses
    assert routed_primary(replicated) == new
