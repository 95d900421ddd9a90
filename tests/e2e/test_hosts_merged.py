"""Merged nodes on separate hosts (issue 43): `sluice up --host 0.0.0.0 --shards 2` on one host
(the NameServer and two merged nodes), `sluice node --host 0.0.0.0` joining it from another, and
the official Python client and pika on a third. Every process listens on the wildcard and gives
others its host's address (items 1, 2); a node cut off from the network costs producers a bounded
pause while the other host's nodes serve (item 3)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Lab, unavailable

UP_PORT, NODE_PORT, NAMESRV_PORT, AMQP_PORT = 8081, 8081, 9876, 5672
AMQP_USER, AMQP_SECRET = "app", "app-secret"


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("hosts-merged")
    with Lab() as lab:
        n1, n2, client = lab.add_host("n1"), lab.add_host("n2"), lab.add_host("client")
        cluster = HostCluster(lab, root, client, namesrv=n1.endpoint(NAMESRV_PORT))
        cluster.start(n1, "up", "up", "--host", "0.0.0.0", "--shards", "2", "--data-dir", str(root / "n1"),
                      "--console-port", "-1", "--amqp-port", str(AMQP_PORT), "--no-auto-create",
                      port=UP_PORT)  # fmt: skip
        cluster.start(n2, "node", "node", "--host", "0.0.0.0", "--namesrv", cluster.namesrv, "--name", "node-2",
                      "--data-dir", str(root / "n2"), "--no-auto-create", port=NODE_PORT)  # fmt: skip
        cluster.wait_brokers(3)
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
    child, events = merged.traffic(merged.namesrv.replace(f":{NAMESRV_PORT}", f":{UP_PORT}"), topic, group,
                                   produce_s=3)  # fmt: skip
    seen = merged.finish(child, events, 3 + 30)
    verdict = seen.history.verdict()
    assert verdict.acknowledged >= 20, verdict.summary()
    verdict.assert_nothing_lost()


def test_pika_on_another_host(merged: HostCluster, unique: Callable[[str], str]) -> None:
    n1 = merged.lab.hosts["n1"]
    done = merged.client.run([sys.executable, "-m", "tests.e2e.support.hostclient", "amqp", "--host", n1.address,
                              "--port", str(AMQP_PORT), "--user", AMQP_USER, "--password", AMQP_SECRET,
                              "--queue", unique("q"), "--count", "20"])  # fmt: skip
    result = json.loads(done.stdout)
    assert result["consumed"] == [f"m{i}" for i in range(20)], result
