"""A replicated broker group on separate hosts (issue 43): etcd, the NameServer, three members of
group g1 (`--min-insync 2`) and a proxy each on a host of its own, every Sluice process on 0.0.0.0,
the official Python client on a client host (support/hosttopologies.py). Partitions: a replica cut
off from its primary, and the primary cut off from etcd and from its replicas until another member
takes the group; after the heal the old primary must never take the route back from its successor
(item 4: registrations carry the primary's epoch, and the NameServer orders them by it). Each is
history-checked; the times without an acknowledged send are printed here and measured by
tests/bench/partitions.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.support import hosttopologies as topo
from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Lab, unavailable

WARM_S, REPLICA_CUT_S, AFTER_S = 3.0, 5.0, 6.0
# Past the 2-s lease (another member takes the group), short enough that the old primary's
# registrations sent during the cut reach the NameServer after the heal (TCP retransmits them).
PRIMARY_CUT_S = 4.0
AMQP_USER, AMQP_SECRET = "app", "app-secret"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with Lab() as lab:
        yield topo.replicated(lab, tmp_path_factory.mktemp("hosts-replicated"))


def _topic(cluster: HostCluster, unique: Callable[[str], str], *, fifo: bool = False) -> tuple[str, str]:
    topic, group = unique("t"), unique("g")
    cluster.admin("topic", "create", topic, "--queues", "4", "--type", "fifo" if fifo else "normal")
    cluster.admin("group", "create", group, *(["--fifo"] if fifo else []))
    return topic, group


def test_a_replica_cut_off_from_its_primary_costs_nothing_acknowledged(
    replicated: HostCluster, unique: Callable[[str], str]
) -> None:
    primary = topo.wait_for_primary(replicated)
    victim = replicated.lab.hosts[next(m for m in topo.MEMBERS if m != primary)]
    proxy = replicated.lab.hosts["px"].endpoint(topo.PROXY_PORT)
    cut = topo.cut_during_traffic(replicated, victim, proxy, *_topic(replicated, unique), warm_s=WARM_S,
                                  cut_s=REPLICA_CUT_S, after_s=AFTER_S)  # fmt: skip
    print(cut.figures())
    cut.seen.history.verdict().assert_nothing_lost()
    assert topo.routed_primary(replicated) == primary


def _registrations(cluster: HostCluster) -> list[str]:
    """The addresses the NameServer registered group g1 at, in order (its log)."""
    text = cluster.processes["nameserver"][1].output()
    return re.findall(rf"broker regist\w+(?: changed)? broker={topo.GROUP} cluster=\S+ address=(\S+)", text)


def test_a_healed_primary_never_takes_its_route_back(replicated: HostCluster, unique: Callable[[str], str]) -> None:
    old = topo.wait_for_primary(replicated)
    victim = replicated.lab.hosts[old]
    proxy = replicated.lab.hosts["px"].endpoint(topo.PROXY_PORT)
    successor: list[str] = []

    def wait_for_successor() -> None:
        successor.append(topo.wait_for_primary(replicated, old))

    topic, group = _topic(replicated, unique, fifo=True)
    cut = topo.cut_during_traffic(replicated, victim, proxy, topic, group, warm_s=WARM_S, cut_s=PRIMARY_CUT_S,
                                  after_s=AFTER_S, fifo_groups=4, while_cut=wait_for_successor)  # fmt: skip
    print(cut.figures())
    verdict = cut.seen.history.verdict()
    verdict.assert_nothing_lost()
    assert not verdict.out_of_order, verdict.out_of_order[:5]
    # Once the successor registered, the NameServer never routed the group to the old primary again.
    addresses = _registrations(replicated)
    after = addresses[addresses.index(replicated.lab.hosts[successor[0]].endpoint(topo.BROKER_PORT)) :]
    assert victim.endpoint(topo.BROKER_PORT) not in after, addresses
    assert topo.routed_primary(replicated) == successor[0]


def test_pika_on_another_host(replicated: HostCluster, unique: Callable[[str], str]) -> None:
    """AMQP through the proxy on the wildcard to the replicated group, from the client host; etcd
    listens on 0.0.0.0 too and advertises its host's address (`sluice etcd`)."""
    replicated.admin("user", "create", AMQP_USER, "--secret", AMQP_SECRET)
    replicated.wait_log("px", "security document in force version=1")
    consumed = replicated.pika(replicated.lab.hosts["px"], topo.AMQP_PORT, AMQP_USER, AMQP_SECRET, unique("q"))
    assert consumed == [f"m{i}" for i in range(20)], consumed
