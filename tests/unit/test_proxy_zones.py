"""Routes of a proxy with a zone list the proxies of its zone (proxy/fleet.py, issue 43 item 6): a
route alternates queues over its endpoints, so listing another zone's proxy sent half of a client's
calls across zones."""

from __future__ import annotations

import asyncio

from navigation.model import ProxyEndpoint, ProxyLoad
from proxy.config import ProxyConfig
from proxy.fleet import Fleet, client_zone, zoned

LOAD = ProxyLoad(in_flight_requests=0, connected_clients=0)


def proxy(pid: str, zone: str, endpoint: str) -> ProxyEndpoint:
    return ProxyEndpoint(proxy_id=pid, zone=zone, endpoint=endpoint, load=LOAD)


RANKED = [proxy("a1", "zone-a", "10.0.1.1:8081"), proxy("a2", "zone-a", "10.0.1.2:8081"),
          proxy("b1", "zone-b", "10.0.2.1:8081")]  # fmt: skip


def test_a_zone_with_proxies_keeps_its_routes_to_itself() -> None:
    assert zoned(RANKED, "zone-a") == ["10.0.1.1:8081", "10.0.1.2:8081"]
    assert zoned(RANKED, "zone-b") == ["10.0.2.1:8081"]


def test_without_a_zone_or_a_proxy_in_it_routes_list_every_proxy() -> None:
    everyone = ["10.0.1.1:8081", "10.0.1.2:8081", "10.0.2.1:8081"]
    assert zoned(RANKED, "") == everyone
    assert zoned(RANKED, "zone-c") == everyone


class Navigation:
    """Navigation's ranked answer (its own zone first), as `NavigationClient.select_proxies` gives it."""

    async def select_proxies(self, namespace: str, network: str, zone: str, *, limit: int = 0) -> list[ProxyEndpoint]:
        return sorted(RANKED, key=lambda p: p.zone != zone)[: limit or None]

    async def close(self) -> None:
        return None


def test_the_fleet_s_route_endpoints_are_its_zone_s() -> None:
    config = ProxyConfig(host="10.0.2.1", port=8081, navigation=["10.0.0.9:9877"], zone="zone-b")
    fleet = Fleet(config, lambda: LOAD)
    fleet._client = Navigation()  # type: ignore[assignment]
    assert asyncio.run(fleet.endpoints("", "default")) == ["10.0.2.1:8081"]


def test_a_client_is_kept_in_the_zone_of_the_proxy_it_lists_first() -> None:
    """A zone-a client whose route query reached zone-b's proxy (zone-a's first proxy down a moment)
    is routed to zone-a's proxies, not to zone-b's."""
    assert client_zone(RANKED, ["10.0.1.1:8081", "10.0.2.1:8081"], "zone-b") == "zone-a"
    assert client_zone(RANKED, ["192.0.2.9:8081"], "zone-b") == "zone-b"  # unknown to navigation: ours
    assert client_zone(RANKED, [], "zone-b") == "zone-b"
    # Its first proxy gone from navigation (killed, expired): the next one it lists decides.
    gone = RANKED[1:]
    assert client_zone(gone, ["10.0.1.1:8081", "10.0.1.2:8081", "10.0.2.1:8081"], "zone-b") == "zone-a"
    config = ProxyConfig(host="10.0.2.1", port=8081, navigation=["10.0.0.9:9877"], zone="zone-b")
    fleet = Fleet(config, lambda: LOAD)
    fleet._client = Navigation()  # type: ignore[assignment]
    assert asyncio.run(fleet.endpoints("", "default", ["10.0.1.1:8081", "10.0.2.1:8081"])) == [
        "10.0.1.1:8081", "10.0.1.2:8081"]  # fmt: skip
