"""Merged nodes among several (docs/shards.md) without processes: routes naming each queue's owner,
queue placement on a node, the client endpoint in registrations, and the data-directory guard."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from broker.client.api import TopicSpec
from broker.config import BrokerConfig
from common.config import ConfigError
from common.errors import BadRequest, TopicNotFound, Unavailable
from common.model import UNDECIDED_TYPES, MessageType, Permission, TopicInfo
from nameserver.convert import (
    broker_status_from_pb,
    broker_status_to_pb,
    registration_from_pb,
    registration_to_pb,
    route_from_pb,
    route_to_pb,
)
from nameserver.model import BrokerRegistration
from nameserver.registry import Registry
from processes.shardpool import (
    MAX_DEFAULT_SHARDS,
    UpConfig,
    default_shards,
    refuse_shard_data,
    shard_configs,
    shard_dirs,
)
from proxy.core.routing import QueueSelector, route_queues
from proxy.directory import BrokerRoute, ClusterDirectory
from proxy.shards import ShardDirectory

TYPES = frozenset({MessageType.NORMAL, MessageType.FIFO})


def _route(broker: str, queues: int = 4, endpoint: str = "") -> BrokerRoute:
    return BrokerRoute(broker, queues, Permission.READ_WRITE, TYPES, endpoint)


# -- placement ----------------------------------------------------------------------------------


def test_a_node_keeps_ungrouped_sends_on_its_own_broker() -> None:
    routes = [_route("shard-0"), _route("shard-1")]
    selector = QueueSelector("shard-1")
    picks = {selector.pick("t", routes, None) for _ in range(16)}
    assert picks == {("shard-1", q) for q in range(4)}


def test_a_group_takes_the_queue_the_python_client_hashes_it_to_on_every_node() -> None:
    routes = [_route("shard-1"), _route("shard-0")]
    writable = [(b, q) for b in ("shard-0", "shard-1") for q in range(4)]  # route order: by broker, then queue
    for group in ("orders", "mg-0", "mg-1", "客户-7"):
        python_client = writable[int.from_bytes(hashlib.sha256(group.encode()).digest(), "big") % len(writable)]
        assert QueueSelector("shard-0").pick("t", routes, group) == python_client
        assert QueueSelector("shard-1").pick("t", routes, group) == python_client


def test_without_a_home_placement_is_unchanged() -> None:
    routes = [_route("broker-a"), _route("broker-b")]
    selector = QueueSelector()
    picks = {selector.pick("t", routes, None) for _ in range(8)}
    assert {b for b, _ in picks} == {"broker-a", "broker-b"}


def test_each_broker_s_queues_carry_its_owner_s_endpoint() -> None:
    routes = [_route("shard-1", 2, "127.0.0.1:8082"), _route("shard-0", 2, "127.0.0.1:8081"), _route("plain", 1)]
    queues = route_queues(routes, ["127.0.0.1:9000", "127.0.0.1:9001"])
    by_broker = {(q.broker, q.queue_id): q.endpoint for q in queues}
    assert by_broker[("shard-0", 0)] == by_broker[("shard-0", 1)] == "127.0.0.1:8081"
    assert by_broker[("shard-1", 1)] == "127.0.0.1:8082"
    # A broker without a node of its own keeps the proxy's endpoints (virtual brokers, as before).
    assert by_broker[("plain@0", 0)] == "127.0.0.1:9000" and by_broker[("plain@1", 0)] == "127.0.0.1:9001"


# -- the directory ------------------------------------------------------------------------------


class FakeBroker:
    """A node's broker as the directory sees it: get_topic as LocalBroker answers it (created on
    first use where it auto-creates, `like` the cluster's definition, decided types never change)."""

    def __init__(self, name: str, *, queues: int = 4, auto_create: bool = True) -> None:
        self.name = name
        self.queues = queues
        self.auto_create = auto_create
        self.answers = True
        self.specs: dict[str, TopicSpec] = {}
        self.asked: list[tuple[str, bool, TopicSpec | None]] = []

    def held_topic(self, name: str) -> TopicSpec | None:
        return self.specs.get(name)

    async def get_topic(self, name: str, *, auto_create: bool = False, like: TopicSpec | None = None) -> TopicSpec:
        if not self.answers:
            raise Unavailable("down")
        self.asked.append((name, auto_create, like))
        spec = self.specs.get(name)
        if spec is None:
            if not (auto_create and self.auto_create) or name.startswith("%"):
                raise TopicNotFound(name)
            spec = self.specs[name] = like or TopicSpec(name, self.queues, UNDECIDED_TYPES)
        elif like is not None and spec.message_types == UNDECIDED_TYPES:
            spec = self.specs[name] = replace(spec, message_types=like.message_types)
        return spec

    def created(self) -> list[str]:
        return [name for name, auto_create, _ in self.asked if auto_create]


class FakeCluster:
    """The NameServer's view (`known`, or None: unreachable) and the other nodes."""

    def __init__(self, peers: dict[str, FakeBroker], local: str = "shard-0") -> None:
        self.peers = peers
        self.endpoints = {n: f"h:{8081 + i}" for i, n in enumerate(sorted([local, *peers]))}
        self.known: dict[str, list[BrokerRoute]] | None = {}
        self.refetched: list[str] = []

    async def route(self, topic: str) -> list[BrokerRoute]:
        if self.known is None:
            raise Unavailable("NameServer down")
        if topic not in self.known:
            raise TopicNotFound(topic)
        return self.known[topic]

    async def refetch(self, topic: str) -> None:
        self.refetched.append(topic)

    def forget(self, topic: str) -> None:
        return None

    def client_endpoints(self) -> dict[str, str]:
        return self.endpoints

    def broker(self, name: str) -> Any:
        return self.peers[name]

    def broker_names(self) -> list[str]:
        return sorted(self.endpoints)

    def list(self, *brokers: FakeBroker, topic: str = "t") -> None:
        """The NameServer now lists the copies these brokers hold."""
        assert self.known is not None
        self.known[topic] = [BrokerRoute(b.name, s.queue_count, s.permission, s.message_types)
                             for b in brokers if (s := b.specs.get(topic)) is not None]  # fmt: skip


def _directory(cluster: FakeCluster, local: FakeBroker, *, auto_create: bool = True) -> ShardDirectory:
    return ShardDirectory(cast(Any, local), cluster.endpoints[local.name], cast(ClusterDirectory, cluster),
                          auto_create=auto_create)  # fmt: skip


def _nodes(local: str = "shard-0", peers: tuple[str, ...] = ("shard-1",)) -> tuple[FakeBroker, FakeCluster]:
    return FakeBroker(local), FakeCluster({p: FakeBroker(p, queues=2) for p in peers}, local)


def test_a_new_topic_is_created_on_every_node_as_the_first_node_defines_it() -> None:
    async def scenario() -> None:
        local, cluster = _nodes()
        peer = cluster.peers["shard-1"]
        directory = _directory(cluster, local)
        routes = await directory.route("t")
        assert [(r.broker, r.queue_count, r.endpoint) for r in routes] == [
            ("shard-0", 4, "h:8081"),
            ("shard-1", 4, "h:8082"),  # shard-0's definition, not shard-1's own default of 2 queues
        ]
        assert peer.specs["t"] == local.specs["t"]
        assert await directory.route("t") is routes  # unchanged: the same list (queue selectors rely on it)
        assert peer.created() == ["t"]  # created once, not per request
        cluster.list(local, peer)  # the NameServer now lists both
        routes = await directory.route("t")
        assert [(r.broker, r.endpoint) for r in routes] == [("shard-0", "h:8081"), ("shard-1", "h:8082")]
        assert peer.created() == ["t"]
        assert directory.broker_names() == ["shard-0", "shard-1"]
        # A node that left the cluster (its registration expired) leaves the route.
        cluster.list(local)
        cluster.endpoints = {"shard-0": "h:8081"}
        assert [r.broker for r in await directory.route("t")] == ["shard-0"]

    asyncio.run(scenario())


def test_the_first_node_by_name_decides_wherever_the_topic_is_first_used() -> None:
    async def scenario() -> None:
        local, cluster = _nodes("shard-1", ("shard-0", "shard-2"))
        routes = await _directory(cluster, local).route("t")
        first = cluster.peers["shard-0"]
        assert [(r.broker, r.queue_count) for r in routes] == [("shard-1", 2), ("shard-0", 2), ("shard-2", 2)]
        assert first.asked == [("t", False, None), ("t", True, None)]  # asked whether it holds it, then to create
        assert local.specs["t"] == cluster.peers["shard-2"].specs["t"] == first.specs["t"]

    asyncio.run(scenario())


def test_a_topic_on_some_nodes_is_never_created_on_the_others() -> None:
    """The issue's repro: a one-queue LITE topic created on shard-0 only stays there, whichever node
    routes it; a dead-letter topic another node made is routed there and created nowhere."""

    async def scenario() -> None:
        local, cluster = _nodes()
        peer = cluster.peers["shard-1"]
        local.specs["chats"] = TopicSpec("chats", 1, frozenset({MessageType.LITE}))
        cluster.list(local, peer, topic="chats")
        routes = await _directory(cluster, local).route("chats")
        assert [(r.broker, r.queue_count) for r in routes] == [("shard-0", 1)]
        on_peer = ShardDirectory(cast(Any, peer), "h:8082", cast(ClusterDirectory, cluster), auto_create=True)
        assert [(r.broker, r.endpoint) for r in await on_peer.route("chats")] == [("shard-0", "h:8081")]
        peer.specs["%DLQ%g"] = TopicSpec("%DLQ%g", 1)
        cluster.list(local, peer, topic="%DLQ%g")
        assert [(r.broker, r.endpoint) for r in await _directory(cluster, local).route("%DLQ%g")] == [
            ("shard-1", "h:8082")
        ]
        with pytest.raises(TopicNotFound, match="never on first use"):
            await _directory(cluster, local).route("%DLQ%other")
        assert local.created() == peer.created() == []

    asyncio.run(scenario())


def test_copies_the_nameserver_does_not_list_yet_are_found_not_doubled() -> None:
    """A NameServer that restarted moments ago does not know a topic shard-1 holds: routed there."""

    async def scenario() -> None:
        local, cluster = _nodes()
        peer = cluster.peers["shard-1"]
        peer.specs["t"] = TopicSpec("t", 1, frozenset({MessageType.PRIORITY}))
        routes = await _directory(cluster, local).route("t")
        assert [(r.broker, r.queue_count) for r in routes] == [("shard-1", 1)]
        assert "t" not in local.specs

    asyncio.run(scenario())


def test_without_the_nameserver_a_silent_node_stops_creation() -> None:
    async def scenario() -> None:
        local, cluster = _nodes()
        cluster.known = None
        cluster.peers["shard-1"].answers = False
        with pytest.raises(Unavailable, match="shard-1"):
            await _directory(cluster, local).route("t")
        assert "t" not in local.specs

    asyncio.run(scenario())


def test_a_node_that_does_not_answer_is_left_out_and_asked_again_later() -> None:
    async def scenario() -> None:
        local, cluster = _nodes()
        peer = cluster.peers["shard-1"]
        peer.answers = False
        directory = _directory(cluster, local)
        assert [r.broker for r in await directory.route("t")] == ["shard-0"]  # the NameServer said: unknown
        peer.answers = True
        assert [r.broker for r in await directory.route("t")] == ["shard-0"]  # not asked again at once
        assert peer.created() == []

    asyncio.run(scenario())


def test_without_auto_create_a_topic_only_other_nodes_hold_is_routed_there() -> None:
    async def scenario() -> None:
        local, cluster = _nodes()
        peer = cluster.peers["shard-1"]
        peer.specs["t"] = TopicSpec("t", 3)
        cluster.list(peer)
        routes = await _directory(cluster, local, auto_create=False).route("t")
        assert [(r.broker, r.queue_count, r.endpoint) for r in routes] == [("shard-1", 3, "h:8082")]
        with pytest.raises(TopicNotFound):
            await _directory(cluster, local, auto_create=False).route("unknown")
        assert peer.created() == []

    asyncio.run(scenario())


def test_the_first_message_decides_the_types_on_every_copy() -> None:
    async def scenario() -> None:
        local, cluster = _nodes("shard-1", ("shard-0",))
        first = cluster.peers["shard-0"]
        directory = _directory(cluster, local)
        await directory.route("t")
        cluster.list(first, local)
        routes = await directory.decide("t", MessageType.LITE)
        lite = frozenset({MessageType.LITE})
        assert first.specs["t"].message_types == local.specs["t"].message_types == lite
        assert cluster.refetched == ["t"]
        cluster.list(first, local)
        routes = await directory.route("t")
        assert {r.message_types for r in routes} == {lite}
        # Decided: another kind of first message elsewhere changes nothing.
        assert await directory.decide("t", MessageType.NORMAL) is routes
        assert first.specs["t"].message_types == lite

    asyncio.run(scenario())


def test_no_copy_decides_its_type_alone_when_the_deciding_node_does_not_answer() -> None:
    """Before, a send went on undecided when shard-0 (which decides) did not answer, and the copy it
    reached decided by that message alone: a later first message of another kind on another copy
    made two definitions. Now the send is refused (retriable) and nothing is decided; a copy that
    misses a decision shard-0 made is left out of that send's route."""

    async def scenario() -> None:
        local, cluster = _nodes("shard-1", ("shard-0", "shard-2"))
        first, third = cluster.peers["shard-0"], cluster.peers["shard-2"]
        directory = _directory(cluster, local)
        await directory.route("t")
        cluster.list(first, local, third)
        first.answers = False
        with pytest.raises(Unavailable, match="shard-0"):
            await directory.decide("t", MessageType.LITE)
        assert {b.specs["t"].message_types for b in (first, local, third)} == {UNDECIDED_TYPES}
        first.answers, third.answers = True, False
        routes = await directory.decide("t", MessageType.LITE)
        assert sorted(r.broker for r in routes) == ["shard-0", "shard-1"]
        lite = frozenset({MessageType.LITE})
        assert (first.specs["t"].message_types, local.specs["t"].message_types) == (lite, lite)
        assert third.specs["t"].message_types == UNDECIDED_TYPES  # takes shard-0's decision at a later send

    asyncio.run(scenario())


class _RacedByAdmin(FakeBroker):
    """shard-0 answers that it holds no such topic, and `sluice admin topic create --brokers
    shard-0` creates it right after, before the node that asked creates it on first use."""

    def __init__(self, name: str, made: TopicSpec) -> None:
        super().__init__(name)
        self.made = made

    async def get_topic(self, name: str, *, auto_create: bool = False, like: TopicSpec | None = None) -> TopicSpec:
        if not auto_create and like is None and name not in self.specs:
            self.asked.append((name, auto_create, like))
            self.specs[name] = self.made
            raise TopicNotFound(name)
        return await super().get_topic(name, auto_create=auto_create, like=like)


def test_a_topic_created_with_admin_meanwhile_is_not_spread_by_first_use() -> None:
    """A one-queue PRIORITY topic made on shard-0 alone between this node's check and its creation:
    first use finds it at shard-0 (the deciding node) and routes it there; before, it copied that
    definition to every node, two queues of one priority topic and no global order."""

    async def scenario() -> None:
        priority = TopicSpec("t", 1, frozenset({MessageType.PRIORITY}))
        local = FakeBroker("shard-1")
        cluster = FakeCluster({"shard-0": _RacedByAdmin("shard-0", priority), "shard-2": FakeBroker("shard-2")},
                              "shard-1")  # fmt: skip
        routes = await _directory(cluster, local).route("t")
        assert [(r.broker, r.queue_count) for r in routes] == [("shard-0", 1)]
        assert "t" not in local.specs and "t" not in cluster.peers["shard-2"].specs

    asyncio.run(scenario())


# -- registration -------------------------------------------------------------------------------


def test_the_client_endpoint_is_registered_listed_and_validated() -> None:
    reg = BrokerRegistration("sluice", "shard-1", "127.0.0.1:10912", (TopicInfo("t", 4),), client_endpoint="h:8082")
    assert registration_from_pb(registration_to_pb(reg)) == reg
    registry = Registry(broker_expiry_s=30.0)
    registry.register(reg)
    (status,) = registry.brokers()
    assert status.client_endpoint == "h:8082"
    assert broker_status_from_pb(broker_status_to_pb(status)) == status
    route = registry.route("t")  # routes carry it too: a node knows a new node from a route at once
    assert [b.client_endpoint for b in route.brokers] == ["h:8082"]
    assert route_from_pb(route_to_pb(route)) == route
    with pytest.raises(BadRequest, match="client endpoint"):
        registry.register(BrokerRegistration("sluice", "shard-2", "127.0.0.1:10913", client_endpoint="no-port"))


# -- data directories ---------------------------------------------------------------------------


def test_shards_get_their_own_names_ports_and_directories(tmp_path: Path) -> None:
    brokers = shard_configs(BrokerConfig(port=20000), 3, tmp_path / "data")
    assert [(b.name, b.data_dir) for b in brokers] == [
        (f"shard-{i}", tmp_path / "data" / f"shard-{i}") for i in range(3)
    ]
    assert brokers[0].port == 20000  # shard 0 on the given port, the others on free ones
    assert len({b.port for b in brokers}) == 3 and all(b.port > 0 for b in brokers)


def test_data_that_would_be_orphaned_is_refused(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"shard-{i}").mkdir()
    assert len(shard_dirs(tmp_path, 4)) == 4  # growing is fine: the new shard starts empty
    with pytest.raises(ConfigError, match="shard-2"):
        shard_dirs(tmp_path, 2)
    with pytest.raises(ConfigError, match="--shards"):
        refuse_shard_data(tmp_path)
    single = tmp_path / "single"
    (single / "commitlog").mkdir(parents=True)
    with pytest.raises(ConfigError, match="single broker"):
        shard_dirs(single, 2)
    refuse_shard_data(single)  # a single process's own directory is fine for it
    with pytest.raises(ValueError):
        UpConfig(shards=0)


def test_the_default_is_a_shard_per_core_unless_the_data_dir_says_otherwise(tmp_path: Path) -> None:
    """No `--shards`: one per usable core (capped), one for a directory holding one process's data
    (an existing `sluice up` data dir keeps working), and never fewer than the shards a directory holds."""
    assert default_shards(tmp_path / "new", 2) == 2
    assert default_shards(tmp_path / "new", 1) == 1
    assert default_shards(tmp_path / "new", 512) == MAX_DEFAULT_SHARDS
    (tmp_path / "single" / "broker").mkdir(parents=True)
    assert default_shards(tmp_path / "single", 8) == 1
    for i in range(3):
        (tmp_path / "sharded" / f"shard-{i}").mkdir(parents=True)
    assert default_shards(tmp_path / "sharded", 2) == 3
    assert default_shards(tmp_path / "sharded", 4) == 4
    assert UpConfig().shards is None  # unset: the default above
