"""Unit tests of the proxy's defences against hostile input and sick neighbours: in-flight byte
bounds, Duration/Timestamp checks, stale-while-revalidate routes, peers in routes, config checks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from common.errors import BadRequest, IllegalPollingTime, TooManyRequests, TopicNotFound
from common.model import MessageType, Permission
from nameserver.model import BrokerQueues, BrokerStatus, TopicRoute
from navigation.model import ProxyLoad
from proxy.config import FlowConfig, ProxyConfig
from proxy.core.inflight import InFlightBytes
from proxy.directory import ClusterDirectory
from proxy.fleet import Fleet
from proxy.grpc import convert
from proxy.grpc.telemetry import language_name


def test_in_flight_bytes_are_bounded_per_client_and_in_all() -> None:
    held = InFlightBytes(max_total=100, max_per_client=60)
    held.acquire("a", 50)
    with pytest.raises(TooManyRequests, match=r"client a has 0\.0 MiB"):
        held.acquire("a", 11)
    held.acquire("a", 10)
    held.acquire("b", 40)
    with pytest.raises(TooManyRequests, match="this proxy holds"):
        held.acquire("c", 1)
    assert (held.total, held.client_bytes("a"), held.refused) == (100, 60, 2)
    held.release("a", 50)
    held.release("a", 10)
    held.acquire("c", 60)
    assert (held.total, held.client_bytes("a"), held.client_bytes("c")) == (100, 0, 60)


@pytest.mark.parametrize(
    ("seconds", "nanos", "ms"), [(0, 0, 0), (20, 0, 20_000), (1, 500_000_000, 1_500), (0, 999_999_999, 999)]
)
def test_valid_durations_convert(seconds: int, nanos: int, ms: int) -> None:
    assert convert.duration_ms(Duration(seconds=seconds, nanos=nanos), "f") == ms


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(-1, 0), (0, -1), (1, -1), (-1, 1), (0, 1_000_000_000), (315_576_000_001, 0), (2**63 - 1, 0), (-(2**63), 0)],
)
def test_invalid_durations_are_refused_naming_the_field(seconds: int, nanos: int) -> None:
    with pytest.raises(IllegalPollingTime, match="long_polling_timeout"):
        convert.duration_ms(Duration(seconds=seconds, nanos=nanos), "long_polling_timeout", IllegalPollingTime)


def test_timestamps_outside_years_1_to_9999_are_refused() -> None:
    assert convert.timestamp_ms(Timestamp(seconds=1, nanos=2_000_000), "t") == 1_002
    for seconds, nanos in ((253_402_300_800, 0), (-62_135_596_801, 0), (0, -1), (0, 1_000_000_000)):
        with pytest.raises(BadRequest, match="born_timestamp"):
            convert.timestamp_ms(Timestamp(seconds=seconds, nanos=nanos), "born_timestamp")


def test_unknown_language_numbers_are_kept_as_numbers() -> None:
    assert language_name(6) == "PYTHON"
    assert language_name(13) == "13"


class FakeNameServer:
    """Counts lookups; while `answering` is clear every call waits (a hung NameServer)."""

    def __init__(self) -> None:
        self.route_calls = 0
        self.list_calls = 0
        self.answering = asyncio.Event()
        self.answering.set()
        self.answered = asyncio.Event()  # set by every answer
        self.topics = {"t"}

    async def _maybe_hang(self) -> None:
        await self.answering.wait()
        self.answered.set()

    async def get_route(self, topic: str) -> TopicRoute:
        self.route_calls += 1
        await self._maybe_hang()
        if topic not in self.topics:
            raise TopicNotFound(f"topic {topic} not found")
        queues = BrokerQueues("broker-a", "127.0.0.1:1", "c", 2, Permission.READ_WRITE, frozenset({MessageType.NORMAL}))
        return TopicRoute(topic, (queues,))

    async def list_brokers(self, cluster_name: str = "") -> list[BrokerStatus]:
        self.list_calls += 1
        await self._maybe_hang()
        return [BrokerStatus("c", "broker-a", "127.0.0.1:1", 1, 0.0)]

    async def close(self) -> None:
        return None


def _directory(ns: FakeNameServer, refresh_s: float = 0.05) -> ClusterDirectory:
    return ClusterDirectory(ns, refresh_s=refresh_s)  # type: ignore[arg-type]


def test_a_stale_route_is_served_from_the_cache_without_asking_the_nameserver() -> None:
    async def scenario() -> None:
        ns = FakeNameServer()
        directory = _directory(ns)
        first = await directory.route("t")
        ns.answering.clear()  # the NameServer stops answering
        await asyncio.sleep(0.1)  # the route is older than refresh_s now
        assert await directory.route("t") == first
        assert ns.route_calls == 1  # requests never asked again (the background loop refreshes)
        ns.answering.set()
        await directory.close()

    asyncio.run(scenario())


def test_concurrent_first_lookups_of_a_topic_share_one_nameserver_call() -> None:
    async def scenario() -> None:
        ns = FakeNameServer()
        directory = _directory(ns)
        routes = await asyncio.gather(*(directory.route("t") for _ in range(5)))
        assert ns.route_calls == 1 and all(r == routes[0] for r in routes)
        with pytest.raises(TopicNotFound):
            await directory.route("missing")
        await directory.close()

    asyncio.run(scenario())


def test_the_refresh_loop_survives_a_hung_nameserver_and_renews_routes_after() -> None:
    async def scenario() -> None:
        ns = FakeNameServer()
        directory = _directory(ns, refresh_s=0.02)
        await directory.route("t")
        directory.start()
        ns.answering.clear()
        await asyncio.sleep(0.1)
        ns.answered.clear()
        ns.answering.set()
        await asyncio.wait_for(ns.answered.wait(), 10)  # the hung calls complete and the loop goes on
        ns.answered.clear()
        await asyncio.wait_for(ns.answered.wait(), 10)
        await directory.close()

    asyncio.run(scenario())


def test_unknown_broker_names_are_looked_up_at_most_once_per_refresh() -> None:
    async def scenario() -> None:
        ns = FakeNameServer()
        directory = _directory(ns, refresh_s=60.0)
        assert await directory.lookup("forged-1") is None
        assert await directory.lookup("forged-2") is None
        assert await directory.lookup("broker-a") is not None  # learned by the one listing
        assert ns.list_calls == 1
        await directory.close()

    asyncio.run(scenario())


def _fleet(**overrides: Any) -> Fleet:
    config = ProxyConfig(host="127.0.0.1", port=8081, **overrides)
    return Fleet(config, lambda: ProxyLoad(in_flight_requests=0, connected_clients=0))


def test_peers_follow_this_proxy_in_routes_and_replace_it_while_draining() -> None:
    async def scenario() -> None:
        fleet = _fleet(peers=["127.0.0.1:8082", "127.0.0.1:8081", "127.0.0.1:8083"], max_route_endpoints=2)
        assert await fleet.endpoints("", "default") == ["127.0.0.1:8081", "127.0.0.1:8082"]
        await fleet.drain()
        assert await fleet.endpoints("", "default") == ["127.0.0.1:8082", "127.0.0.1:8083"]
        assert await _fleet().endpoints("", "default") == ["127.0.0.1:8081"]

    asyncio.run(scenario())


def test_size_limits_must_fit_the_largest_request() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        ProxyConfig(max_message_bytes=1024 * 1024)
    with pytest.raises(ValueError, match="max_client_in_flight_bytes"):
        ProxyConfig(flow=FlowConfig(max_client_in_flight_bytes=1024 * 1024))
    with pytest.raises(ValueError, match="at most max_in_flight_bytes"):
        FlowConfig(max_in_flight_bytes=10, max_client_in_flight_bytes=20)
