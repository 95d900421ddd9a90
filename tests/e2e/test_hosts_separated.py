"""The separated topology on separate hosts (issue 43): a NameServer, two brokers and two proxies
each on a host of its own, listening on 0.0.0.0, and the official Python client on a client host
(support/hosttopologies.py). Partitions take one host off the network while the application
produces and consumes: a broker's (item 3: the other broker of the topic keeps taking sends), a
proxy's (the client moves to the other one, listed in routes as a peer, and that one leaves the cut
proxy out of the routes it answers until it answers again) and the NameServer's (routes already
known keep working). Each is history-checked: nothing acknowledged lost, nothing delivered
again after an ack answered OK. The times without an acknowledged send are printed here and
measured by tests/bench/partitions.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.support import hosttopologies as topo
from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Lab, unavailable

WARM_S, CUT_S, AFTER_S = 3.0, 6.0, 5.0
AMQP_USER, AMQP_SECRET = "app", "app-secret"


@pytest.fixture(scope="module")
def separated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with Lab() as lab:
        yield topo.separated(lab, tmp_path_factory.mktemp("hosts-separated"))


@pytest.mark.parametrize("victim", ["b2", "p1", "ns"])
def test_a_host_cut_off_loses_nothing_acknowledged(
    separated: HostCluster, unique: Callable[[str], str], victim: str
) -> None:
    topic, group = unique("t"), unique("g")
    separated.admin("topic", "create", topic, "--queues", "4")
    separated.admin("group", "create", group)
    p1, p2 = (separated.lab.hosts[p].endpoint(topo.PROXY_PORT) for p in ("p1", "p2"))

    def listed(queues: list[dict[str, Any]]) -> bool:
        return any(p1 in q["endpoints"] for q in queues)

    def p1_left_out() -> None:  # p2 cannot reach p1: its routes leave p1 out until it answers again
        separated.wait_route(p2, topic, lambda queues: not listed(queues))

    cut = topo.cut_during_traffic(separated, separated.lab.hosts[victim], f"{p1};{p2}", topic, group, warm_s=WARM_S,
                                  cut_s=CUT_S, after_s=AFTER_S,
                                  while_cut=p1_left_out if victim == "p1" else None)  # fmt: skip
    assert listed(separated.wait_route(p2, topic, listed))
    print(cut.figures())
    verdict = cut.seen.history.verdict()
    verdict.assert_nothing_lost()
    assert verdict.acknowledged and not cut.seen.failed_at, cut.figures()


def test_pika_and_mqtt_on_another_host(separated: HostCluster, unique: Callable[[str], str]) -> None:
    """AMQP and MQTT at proxies on the wildcard, clients on another host (an AMQP application there
    is a user: guest/guest is for loopback, as RabbitMQ's)."""
    separated.admin("user", "create", AMQP_USER, "--secret", AMQP_SECRET)
    separated.wait_log("proxy-1", "security document in force version=1")
    p1, p2 = separated.lab.hosts["p1"], separated.lab.hosts["p2"]
    consumed = separated.pika(p1, topo.AMQP_PORT, AMQP_USER, AMQP_SECRET, unique("q"))
    assert consumed == [f"m{i}" for i in range(20)], consumed
    bind = unique("m")
    separated.admin("topic", "create", bind, "--type", "lite")
    received = separated.mqtt(p2, topo.MQTT_PORT, bind)
    assert received == [f"m{i}" for i in range(20)], received
