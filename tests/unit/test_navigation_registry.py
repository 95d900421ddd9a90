"""The navigation registry on its own: ordering, filtering, expiry, stale sequences, bad input.

Also the model's conversions to protobuf and the HTTP handlers called directly (no sockets). A
fake clock drives expiry; nothing here touches the network.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from aiohttp.test_utils import make_mocked_request
from aiohttp.web import Response
from yarl import URL

from common.config import ConfigError, load_config
from common.errors import BadRequest, TooManyRequests
from common.httpserver import HttpError
from navigation import convert
from navigation.client import parse_addresses
from navigation.config import NavigationConfig
from navigation.http import NavigationHttp
from navigation.model import (
    EndpointQuery,
    ProxyLoad,
    ProxyRegistration,
    RegisterOutcome,
    access_points,
    distinct_endpoints,
    split_endpoint,
)
from navigation.registry import Registry

EXPIRY_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def proxy(
    proxy_id: str,
    port: int = 8081,
    *,
    zone: str = "",
    load: tuple[int, int] = (0, 0),
    networks: dict[str, str] | None = None,
    **kwargs: Any,
) -> ProxyRegistration:
    return ProxyRegistration(
        proxy_id=proxy_id,
        endpoints=networks if networks is not None else {"default": f"10.0.0.1:{port}"},
        zone=zone,
        load=ProxyLoad(*load),
        **kwargs,
    )


def ids(registry: Registry, **query: Any) -> list[str]:
    return [p.proxy_id for p in registry.select(EndpointQuery(**query))]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> Registry:
    return Registry(proxy_expiry_s=EXPIRY_S, clock=clock)


# -- ordering -----------------------------------------------------------------------------------


def test_least_loaded_first_and_ties_by_id(registry: Registry) -> None:
    registry.register(proxy("c", 1, load=(1, 1)))  # score 2
    registry.register(proxy("b", 2, load=(0, 5)))  # score 5
    registry.register(proxy("a", 3, load=(2, 0)))  # score 2, ties with c
    registry.register(proxy("d", 4))  # score 0
    assert ids(registry) == ["d", "a", "c", "b"]
    answer = registry.select(EndpointQuery())
    assert [p.endpoint for p in answer] == ["10.0.0.1:4", "10.0.0.1:3", "10.0.0.1:1", "10.0.0.1:2"]
    assert answer[1].load.score == 2


def test_same_zone_first_then_load(registry: Registry) -> None:
    registry.register(proxy("a1", 1, zone="a", load=(9, 0)))
    registry.register(proxy("a2", 2, zone="a", load=(1, 0)))
    registry.register(proxy("b1", 3, zone="b", load=(0, 0)))
    registry.register(proxy("nozone", 4, load=(0, 0)))
    assert ids(registry, zone="a") == ["a2", "a1", "b1", "nozone"]
    assert ids(registry, zone="b") == ["b1", "nozone", "a2", "a1"]
    # No zone asked (or one no proxy is in): load alone decides.
    assert ids(registry) == ["b1", "nozone", "a2", "a1"]
    assert ids(registry, zone="c") == ["b1", "nozone", "a2", "a1"]


def test_limit_keeps_the_best(registry: Registry) -> None:
    for i in range(5):
        registry.register(proxy(f"p{i}", 8000 + i, load=(i, 0)))
    assert ids(registry, limit=2) == ["p0", "p1"]
    assert len(registry.select(EndpointQuery(limit=0))) == 5


def test_load_changes_reorder_at_the_next_heartbeat(registry: Registry) -> None:
    registry.register(proxy("a", 1, load=(0, 0)))
    registry.register(proxy("b", 2, load=(5, 0)))
    assert ids(registry) == ["a", "b"]
    assert registry.register(proxy("a", 1, load=(10, 0))) is RegisterOutcome.HEARTBEAT
    assert ids(registry) == ["b", "a"]


def test_shared_endpoint_appears_once_at_its_best_rank(registry: Registry) -> None:
    registry.register(proxy("w1", 8081, load=(9, 0)))
    registry.register(proxy("w2", 8081, load=(0, 0)))
    registry.register(proxy("other", 8082, load=(5, 0)))
    answer = registry.select(EndpointQuery())
    assert [p.proxy_id for p in answer] == ["w2", "other", "w1"]
    assert distinct_endpoints(answer) == ["10.0.0.1:8081", "10.0.0.1:8082"]


# -- filters ------------------------------------------------------------------------------------


def test_draining_proxies_are_excluded_but_listed(registry: Registry) -> None:
    registry.register(proxy("a", 1))
    registry.register(proxy("b", 2))
    assert registry.register(proxy("a", 1, draining=True)) is RegisterOutcome.CHANGED
    assert ids(registry) == ["b"]
    assert [(s.proxy_id, s.draining) for s in registry.proxies()] == [("a", True), ("b", False)]
    registry.register(proxy("a", 1, draining=False))
    assert ids(registry) == ["a", "b"]


def test_namespace_filter(registry: Registry) -> None:
    registry.register(proxy("all", 1))
    registry.register(proxy("ns1-only", 2, namespaces=frozenset({"ns1"})))
    registry.register(proxy("ns1-ns2", 3, namespaces=frozenset({"ns1", "ns2"})))
    assert ids(registry, namespace="ns1") == ["all", "ns1-ns2", "ns1-only"]
    assert ids(registry, namespace="ns2") == ["all", "ns1-ns2"]
    assert ids(registry, namespace="ns3") == ["all"]
    # The default (empty) namespace is served only by proxies serving every namespace.
    assert ids(registry, namespace="") == ["all"]


def test_network_filter_and_endpoint_per_network(registry: Registry) -> None:
    registry.register(proxy("both", networks={"internal": "10.0.0.1:8081", "public": "pub.example.com:443"}))
    registry.register(proxy("internal-only", networks={"internal": "10.0.0.2:8081"}, load=(1, 0)))
    assert [p.endpoint for p in registry.select(EndpointQuery(network="internal"))] == [
        "10.0.0.1:8081",
        "10.0.0.2:8081",
    ]
    assert [p.endpoint for p in registry.select(EndpointQuery(network="public"))] == ["pub.example.com:443"]
    assert registry.select(EndpointQuery()) == []  # neither has a "default" endpoint


# -- liveness -----------------------------------------------------------------------------------


def test_silent_proxy_expires_at_once_and_sweep_frees_it(registry: Registry, clock: FakeClock) -> None:
    registry.register(proxy("a", 1))
    registry.register(proxy("b", 2))
    clock.advance(EXPIRY_S - 0.1)
    registry.register(proxy("b", 2))  # b heartbeats, a does not
    assert ids(registry) == ["a", "b"]
    clock.advance(0.1)
    assert ids(registry) == ["b"]
    assert [s.proxy_id for s in registry.proxies()] == ["b"]
    assert registry.live_count() == 1
    gone = registry.expire()
    assert [(g.proxy_id, g.last_heartbeat_age_s) for g in gone] == [("a", pytest.approx(EXPIRY_S))]
    assert registry.expire() == []
    # Registering again after expiry is a new proxy.
    assert registry.register(proxy("a", 1)) is RegisterOutcome.NEW


def test_stale_sequence_is_ignored_and_does_not_refresh(registry: Registry, clock: FakeClock) -> None:
    assert registry.register(proxy("a", 1, instance_id="i1", sequence=5, draining=True)) is RegisterOutcome.NEW
    clock.advance(EXPIRY_S / 2)
    # An older heartbeat arrives late: it must not un-drain the proxy, nor keep it alive.
    assert registry.register(proxy("a", 1, instance_id="i1", sequence=4)) is RegisterOutcome.STALE
    assert registry.proxies()[0].draining
    clock.advance(EXPIRY_S / 2)
    assert registry.proxies() == []


def test_new_instance_replaces_the_old_whatever_its_sequence(registry: Registry) -> None:
    registry.register(proxy("a", 1, instance_id="old", sequence=100))
    outcome = registry.register(proxy("a", 2, instance_id="new", sequence=1))
    assert outcome is RegisterOutcome.RESTARTED
    assert [p.endpoint for p in registry.select(EndpointQuery())] == ["10.0.0.1:2"]


def test_unordered_registrations_always_apply(registry: Registry) -> None:
    registry.register(proxy("a", 1))
    assert registry.register(proxy("a", 2)) is RegisterOutcome.CHANGED
    assert registry.register(proxy("a", 2, load=(3, 3))) is RegisterOutcome.HEARTBEAT


def test_unregister_and_late_heartbeat_cannot_resurrect(registry: Registry, clock: FakeClock) -> None:
    registry.register(proxy("a", 1, instance_id="i1", sequence=3))
    assert registry.unregister("a", "i1", sequence=4)
    assert ids(registry) == []
    # A heartbeat sent before the leave arrives after it: ignored.
    assert registry.register(proxy("a", 1, instance_id="i1", sequence=3)) is RegisterOutcome.STALE
    assert ids(registry) == []
    # A new instance of the same proxy id is welcome at once.
    assert registry.register(proxy("a", 1, instance_id="i2", sequence=1)) is RegisterOutcome.NEW
    assert ids(registry) == ["a"]


def test_tombstone_expires(registry: Registry, clock: FakeClock) -> None:
    registry.register(proxy("a", 1, instance_id="i1", sequence=1))
    registry.unregister("a", "i1", sequence=2)
    clock.advance(EXPIRY_S)
    registry.expire()
    assert registry.register(proxy("a", 1, instance_id="i1", sequence=1)) is RegisterOutcome.NEW


def test_unregister_of_another_instance_is_ignored(registry: Registry) -> None:
    registry.register(proxy("a", 1, instance_id="new", sequence=1))
    assert not registry.unregister("a", "old", sequence=9)
    assert ids(registry) == ["a"]
    assert not registry.unregister("unknown")
    assert registry.unregister("a")  # no instance given: removes whatever is held
    assert ids(registry) == []


def test_max_proxies_refuses_one_more_but_expired_make_room(clock: FakeClock) -> None:
    registry = Registry(proxy_expiry_s=EXPIRY_S, max_proxies=2, clock=clock)
    registry.register(proxy("a", 1))
    registry.register(proxy("b", 2))
    with pytest.raises(TooManyRequests):
        registry.register(proxy("c", 3))
    assert registry.register(proxy("b", 2, load=(1, 1))) is RegisterOutcome.HEARTBEAT  # known ones still beat
    clock.advance(EXPIRY_S)
    assert registry.register(proxy("c", 3)) is RegisterOutcome.NEW


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        proxy(""),
        proxy("has space"),
        proxy("x" * 128),
        proxy("p", networks={}),
        proxy("p", networks={"": "10.0.0.1:1"}),
        proxy("p", networks={"default": "no-port"}),
        proxy("p", networks={"default": "10.0.0.1:0"}),
        proxy("p", networks={"default": "10.0.0.1:70000"}),
        proxy("p", networks={"default": "a;b:1"}),
        proxy("p", networks={"default": "::1:8081"}),
        proxy("p", networks={"default": "[::1:8081"}),
        proxy("p", networks={"default": "host name:1"}),
        proxy("p", networks={"default": "0.0.0.0:8081"}),  # a wildcard: every client would dial itself
        proxy("p", networks={"default": "[::]:8081"}),
        proxy("p", networks={f"n{i}": f"10.0.0.1:{i + 1}" for i in range(17)}),
        proxy("p", zone="bad zone"),
        proxy("p", namespaces=frozenset({""})),
        proxy("p", namespaces=frozenset({"ns%x"})),
        proxy("p", load=(-1, 0)),
        proxy("p", load=(0, 10**10)),
        proxy("p", sequence=-1),
    ],
)
def test_bad_registration_is_refused_and_changes_nothing(registry: Registry, bad: ProxyRegistration) -> None:
    with pytest.raises(BadRequest):
        registry.register(bad)
    assert registry.proxies() == []


@pytest.mark.parametrize(
    "query",
    [
        EndpointQuery(namespace="bad ns"),
        EndpointQuery(network=""),
        EndpointQuery(network="a;b"),
        EndpointQuery(zone="a b"),
        EndpointQuery(limit=-1),
        EndpointQuery(limit=10**6),
    ],
)
def test_bad_query_is_refused(registry: Registry, query: EndpointQuery) -> None:
    with pytest.raises(BadRequest):
        registry.select(query)


def test_good_endpoints_parse() -> None:
    assert split_endpoint("10.0.0.1:8081") == ("10.0.0.1", 8081)
    assert split_endpoint("[::1]:8081") == ("[::1]", 8081)
    assert split_endpoint("proxy-0.sluice.svc.cluster.local:8081") == ("proxy-0.sluice.svc.cluster.local", 8081)


@pytest.mark.parametrize(
    ("ranked", "expected"),
    [
        ([], []),
        (["10.0.0.2:1", "10.0.0.1:1"], ["10.0.0.2:1", "10.0.0.1:1"]),
        # The official Python client takes the first address's kind for all and refuses several
        # DNS names: a DNS or IPv6 endpoint first stands alone, and only IPv4 ones follow IPv4.
        (["10.0.0.2:1", "proxy-a:1", "10.0.0.1:1", "[::1]:1"], ["10.0.0.2:1", "10.0.0.1:1"]),
        (["proxy-a:1", "proxy-b:1", "10.0.0.1:1"], ["proxy-a:1"]),
        (["[::1]:1", "10.0.0.1:1"], ["[::1]:1"]),
    ],
)
def test_access_points_are_what_the_official_client_accepts(ranked: list[str], expected: list[str]) -> None:
    assert access_points(ranked) == expected


def test_registry_refuses_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        Registry(proxy_expiry_s=0)
    with pytest.raises(ValueError):
        Registry(proxy_expiry_s=1, max_proxies=0)


def test_parse_addresses() -> None:
    assert parse_addresses(" a:1 ; b:2;a:1; ") == ["a:1", "b:2"]
    for bad in ("", ";", "a:1,b:2", "a", "a:99999"):
        with pytest.raises(ConfigError):
            parse_addresses(bad)


def test_config_checks_values_and_nested_http_limits() -> None:
    data = {"navigation": {"http_limits": {"max_headers": 8}}}
    config = load_config(NavigationConfig, section="navigation", data=data)
    assert config.http_limits.max_headers == 8
    for bad in ({"port": 70000}, {"proxy_expiry_s": 0}, {"port": 1, "http_port": 1}, {"http_limits": {"nope": 1}}):
        with pytest.raises(ConfigError):
            load_config(NavigationConfig, section="navigation", data={"navigation": bad})


# -- protobuf round trip ------------------------------------------------------------------------


def test_registration_and_answer_survive_protobuf() -> None:
    reg = proxy(
        "p1",
        networks={"default": "10.0.0.1:1", "public": "[2001:db8::1]:443"},
        zone="z",
        load=(3, 4),
        namespaces=frozenset({"b", "a"}),
        draining=True,
        instance_id="i",
        sequence=7,
    )
    assert convert.registration_from_pb(convert.registration_to_pb(reg)) == reg
    registry = Registry(proxy_expiry_s=EXPIRY_S)
    registry.register(proxy("p1", 1))
    answer = registry.select(EndpointQuery())
    msg = convert.answer_to_pb(answer)
    assert list(msg.endpoints) == ["10.0.0.1:1"]
    assert convert.answer_from_pb(msg) == answer
    # On the wire an empty network means the default one (proto3 has no "unset" for strings).
    assert convert.query_from_pb(convert.query_to_pb(EndpointQuery(network=""))).network == "default"
    query = EndpointQuery(namespace="ns", network="public", zone="z", limit=3)
    assert convert.query_from_pb(convert.query_to_pb(query)) == query


# -- HTTP handlers, called directly -------------------------------------------------------------


def get(registry: Registry, path: str, ready: bool = True, **query: str) -> Response:
    handler = NavigationHttp(registry, ready=lambda: ready).routes()[("GET", path)]

    async def call() -> Response:
        try:
            return cast(Response, await handler(make_mocked_request("GET", str(URL(path).with_query(query)))))
        except HttpError as exc:  # the server turns these into JSON errors; here the status is enough
            return Response(status=exc.status, body=exc.message.encode())

    return asyncio.run(call())


def test_http_endpoints_json_text_and_no_proxy(registry: Registry) -> None:
    registry.register(proxy("b", 2, zone="z1", load=(1, 0)))
    registry.register(proxy("a", 1, zone="z2"))
    doc = json.loads(get(registry, "/v1/endpoints", zone="z1").body)
    assert doc["endpoints"] == ["10.0.0.1:2", "10.0.0.1:1"]
    assert doc["access_points"] == "10.0.0.1:2;10.0.0.1:1"
    assert doc["proxies"][0] == {
        "id": "b",
        "zone": "z1",
        "endpoint": "10.0.0.1:2",
        "load": 1,
        "in_flight_requests": 1,
        "connected_clients": 0,
    }
    text = get(registry, "/v1/endpoints", format="text")
    assert (text.status, text.body) == (200, b"10.0.0.1:1;10.0.0.1:2")
    assert text.headers["Content-Type"] == "text/plain; charset=utf-8"
    none_text = get(registry, "/v1/endpoints", network="public", format="text")
    assert none_text.status == 503 and b"no proxy available" in none_text.body
    none_json = get(registry, "/v1/endpoints", network="public")
    assert none_json.status == 200 and json.loads(none_json.body)["endpoints"] == []
    # A DNS-named proxy ranked best: the text answer is that one endpoint alone.
    registry.register(proxy("0-dns", networks={"default": "proxy-0.sluice.svc:8081"}))  # ties on load, wins on id
    assert get(registry, "/v1/endpoints", format="text").body == b"proxy-0.sluice.svc:8081"
    assert json.loads(get(registry, "/v1/endpoints").body)["endpoints"][0] == "proxy-0.sluice.svc:8081"


@pytest.mark.parametrize(
    "query",
    [
        {"bogus": "1"},
        {"format": "xml"},
        {"limit": "x"},
        {"limit": "-1"},
        {"limit": "99999999999"},
        {"namespace": "bad ns"},
        {"zone": "a b"},
        {"network": "a;b"},
    ],
)
def test_http_bad_parameters_are_400(registry: Registry, query: dict[str, str]) -> None:
    assert get(registry, "/v1/endpoints", True, **query).status == 400


def test_http_proxies_health_and_readiness(registry: Registry) -> None:
    registry.register(proxy("a", 1, draining=True, namespaces=frozenset({"ns"})))
    [doc] = json.loads(get(registry, "/v1/proxies").body)["proxies"]
    assert (doc["id"], doc["draining"], doc["namespaces"], doc["endpoints"]) == (
        "a",
        True,
        ["ns"],
        {"default": "10.0.0.1:1"},
    )
    assert get(registry, "/v1/proxies", x="1").status == 400
    assert get(registry, "/healthz", ready=False).status == 200
    assert get(registry, "/readyz", ready=True).status == 200
    assert get(registry, "/readyz", ready=False).status == 503
