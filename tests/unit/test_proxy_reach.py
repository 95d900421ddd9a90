"""Routes leave out what this proxy cannot reach (proxy/reach.py, issue 43): a merged node's queues,
a peer proxy's endpoint. The official Python client reads routes every 30 s and retries a send on
the next queue; with a cut host's queues in its route, a share of its sends waited its 3-s request
timeout for as long as the cut lasted."""

from __future__ import annotations

import asyncio
import logging

import pytest

from common.model import MessageType, Permission
from proxy.app import ProxyApp
from proxy.config import ProxyConfig, ReachConfig
from proxy.core.routing import reachable_only
from proxy.directory import BrokerRoute
from proxy.reach import ReachWatch

OWN, NODE_2, NODE_3 = "10.0.0.1:8081", "10.0.0.2:8081", "10.0.0.3:8081"
NORMAL = frozenset({MessageType.NORMAL})


class Network:
    """Which hosts answer a connection, and a clock the test moves."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.dialled: list[str] = []
        self.now = 0.0

    async def connect(self, host: str, port: int) -> None:
        self.dialled.append(f"{host}:{port}")
        if host in self.down:
            raise ConnectionRefusedError(f"{host} is down")

    def watch(self, **config: float) -> ReachWatch:
        return ReachWatch(ReachConfig(**config), {OWN}, connect=self.connect, clock=lambda: self.now)  # type: ignore[arg-type]


def test_an_endpoint_that_fails_its_probes_is_unreachable_until_one_answers(caplog: pytest.LogCaptureFixture) -> None:
    net = Network()
    watch = net.watch(failures=2)
    assert watch.reachable(NODE_2) and watch.reachable(NODE_3)
    net.down.add("10.0.0.2")
    asyncio.run(watch.probe_all())
    assert watch.reachable(NODE_2), "one failed probe is not enough"
    with caplog.at_level(logging.INFO, logger="sluice.proxy.reach"):
        asyncio.run(watch.probe_all())
        asyncio.run(watch.probe_all())
        assert not watch.reachable(NODE_2) and watch.reachable(NODE_3)
        net.down.clear()
        asyncio.run(watch.probe_all())
        assert watch.reachable(NODE_2)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["route endpoint unreachable: left out of routes until it answers",
                     "route endpoint reachable again: back in routes"], lines  # fmt: skip
    assert all(getattr(r, "kv", {}).get("endpoint") == NODE_2 for r in caplog.records)


def test_own_endpoints_are_never_probed_and_what_routes_stop_naming_is_forgotten() -> None:
    net = Network()
    watch = net.watch(forget_s=10.0, watched_max=2)
    assert watch.reachable(OWN)
    asyncio.run(watch.probe_all())
    assert net.dialled == []
    for endpoint in (NODE_2, NODE_3, "10.0.0.4:8081"):  # at most two watched: the oldest named goes
        watch.reachable(endpoint)
    asyncio.run(watch.probe_all())
    assert sorted(net.dialled) == [NODE_3, "10.0.0.4:8081"]
    net.dialled.clear()
    net.now = 11.0
    watch.reachable(NODE_3)
    asyncio.run(watch.probe_all())
    assert net.dialled == [NODE_3]


def test_a_probe_that_does_not_connect_in_time_fails() -> None:
    async def hang(host: str, port: int) -> None:
        await asyncio.sleep(10)

    watch = ReachWatch(ReachConfig(timeout_s=0.01, failures=1), {OWN}, connect=hang)
    watch.reachable(NODE_2)
    asyncio.run(watch.probe_all())
    assert not watch.reachable(NODE_2)


def _routes(types: frozenset[MessageType]) -> list[BrokerRoute]:
    return [BrokerRoute("node-1", 4, Permission.READ_WRITE, types, OWN),
            BrokerRoute("node-2", 4, Permission.READ_WRITE, types, NODE_2),
            BrokerRoute("plain", 4, Permission.READ_WRITE, types)]  # fmt: skip


def test_a_node_this_proxy_cannot_reach_is_answered_unusable() -> None:
    routes = _routes(NORMAL)
    answered = reachable_only(routes, lambda e: e != NODE_2)
    assert [(r.broker, r.permission) for r in answered] == [
        ("node-1", Permission.READ_WRITE), ("node-2", Permission.NONE), ("plain", Permission.READ_WRITE)
    ]  # fmt: skip
    assert reachable_only(routes, lambda e: True) is routes
    mixed = _routes(frozenset(MessageType))  # also takes messages without a group: answered the same
    assert reachable_only(mixed, lambda e: e != NODE_2)[1].permission == Permission.NONE


def test_a_fifo_only_topic_is_answered_complete() -> None:
    """Its groups' queues are the proxy's choice, and the Python client's hash over the whole route
    keeps its sends on the owning node: leaving a node out would move every group's sends."""
    routes = _routes(frozenset({MessageType.FIFO}))
    assert reachable_only(routes, lambda e: e != NODE_2) is routes


class _NoBrokers:
    def on_silent(self, callback: object) -> None:
        pass

    def broker_names(self) -> list[str]:
        return []


def test_peer_proxies_this_proxy_cannot_reach_are_left_out_of_route_endpoints() -> None:
    peers = ["10.0.0.5:8081", "10.0.0.6:8081"]
    app = ProxyApp(ProxyConfig(host="10.0.0.4", peers=peers), _NoBrokers())  # type: ignore[arg-type]
    net = Network()
    app.reach = ReachWatch(ReachConfig(failures=1), {"10.0.0.4:8081"}, connect=net.connect)
    assert asyncio.run(app.endpoints("", "default")) == ["10.0.0.4:8081", *peers]
    net.down.add("10.0.0.5")
    asyncio.run(app.reach.probe_all())
    assert asyncio.run(app.endpoints("", "default")) == ["10.0.0.4:8081", "10.0.0.6:8081"]
