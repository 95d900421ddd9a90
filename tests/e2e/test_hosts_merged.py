"""Merged nodes on separate hosts (issue 43): `sluice up --host 0.0.0.0 --shards 2` on one host
(the NameServer and two merged nodes), `sluice node --host 0.0.0.0` joining it from another, and
the official Python client, pika and paho-mqtt on a third. Every process listens on the wildcard
and gives others its host's address (items 1, 2); a node cut off from the network costs producers
a bounded pause while the other host's nodes serve (item 3; the figures:
tests/bench/partitions.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.support import hosttopologies as topo
from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Lab, unavailable

AMQP_USER, AMQP_SECRET = "app", "app-secret"
WARM_S, CUT_S, AFTER_S = 3.0, 6.0, 5.0


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with Lab() as lab:
        cluster = topo.merged(lab, tmp_path_factory.mktemp("hosts-merged"))
        # An AMQP application on another host is a user (guest/guest is for loopback, as RabbitMQ's).
        cluster.admin("user", "create", AMQP_USER, "--secret", AMQP_SECRET)
        cluster.wait_log("up", "security document in force version=1")
        yield cluster


def test_every_registered_address_is_the_host_s_own(merged: HostCluster) -> None:
    """Items 1, 2: brokers listening on 0.0.0.0 registered 0.0.0.0:<port>. (The client endpoints in
    routes, 127.0.0.1 for `sluice up`'s shards, are what the official client dials below.)"""
    rows = merged.admin("broker", "list")
    hosts = {h.address for h in merged.lab.hosts.values()}
    for row in rows:
        assert row["address"].rsplit(":", 1)[0] in hosts, row
    assert len(rows) == 3, rows


def test_a_group_created_from_another_host_reaches_every_node(
    merged: HostCluster, unique: Callable[[str], str]
) -> None:
    """Item 2: `group create` on a cluster of wildcard brokers wrote twice to one node."""
    group = unique("g")
    merged.admin("group", "create", group)
    listed = merged.admin("group", "list")
    brokers = next(row["brokers"] for row in listed if row["group"] == group)
    assert sorted(brokers) == sorted(row["broker"] for row in merged.admin("broker", "list")), listed


def test_messages_cross_hosts_with_the_official_client(merged: HostCluster, unique: Callable[[str], str]) -> None:
    topic, group = unique("t"), unique("g")
    merged.admin("topic", "create", topic, "--queues", "4")
    merged.admin("group", "create", group)
    child, events = merged.traffic(merged.lab.hosts["n1"].endpoint(topo.PROXY_PORT), topic, group,
                                   produce_s=3)  # fmt: skip
    seen = merged.finish(child, events, 3 + 30)
    verdict = seen.history.verdict()
    assert verdict.acknowledged >= 20, verdict.summary()
    verdict.assert_nothing_lost()


def test_pika_on_another_host(merged: HostCluster, unique: Callable[[str], str]) -> None:
    consumed = merged.pika(merged.lab.hosts["n1"], topo.AMQP_PORT, AMQP_USER, AMQP_SECRET, unique("q"))
    assert consumed == [f"m{i}" for i in range(20)], consumed


def test_mqtt_on_another_host(merged: HostCluster, unique: Callable[[str], str]) -> None:
    """Every shard serves the MQTT port on the wildcard; a paho client on another host publishes and
    subscribes there (no MQTT answer names an address: nothing to hand out wrong)."""
    bind = unique("m")
    merged.admin("topic", "create", bind, "--type", "lite")
    received = merged.mqtt(merged.lab.hosts["n1"], topo.MQTT_PORT, bind)
    assert received == [f"m{i}" for i in range(20)], received


def test_a_node_cut_off_loses_nothing_acknowledged(merged: HostCluster, unique: Callable[[str], str]) -> None:
    """Item 3 on merged nodes: routes send the client straight to the node owning a queue, so with
    node-2's host cut off, a send to one of its queues waits the client's request timeout. The route
    spreads each host's queues (the Python client retries on the next queue: it reaches n1, and no
    send fails), and n1, which cannot reach node-2, answers routes with node-2's queues unusable
    until it answers again (the client stops dialling it at its next route refresh)."""
    topic, group = unique("t"), unique("g")
    merged.admin("topic", "create", topic, "--queues", "4")
    merged.admin("group", "create", group)
    n1, n2 = merged.lab.hosts["n1"], merged.lab.hosts["n2"]
    access, node_2 = n1.endpoint(topo.PROXY_PORT), n2.endpoint(topo.PROXY_PORT)

    def node_2_permissions(queues: list[dict[str, Any]]) -> set[str]:
        return {q["permission"] for q in queues if node_2 in q["endpoints"]}

    def left_out() -> None:
        merged.wait_route(access, topic, lambda queues: node_2_permissions(queues) == {"NONE"})

    assert node_2_permissions(merged.route(access, topic)) == {"READ_WRITE"}
    cut = topo.cut_during_traffic(merged, n2, access, topic, group, warm_s=WARM_S, cut_s=CUT_S, after_s=AFTER_S,
                                  while_cut=left_out)  # fmt: skip
    merged.wait_route(access, topic, lambda queues: node_2_permissions(queues) == {"READ_WRITE"})
    print(cut.figures())
    cut.seen.history.verdict().assert_nothing_lost()
    assert cut.seen.sent_at and not cut.seen.failed_at, cut.figures()
