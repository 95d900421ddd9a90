"""This proxy's place in the fleet: what it announces to navigation, which proxy endpoints it
advertises in routes, and draining.

With navigation configured, the proxy announces its endpoints per network, zone, the namespaces
it serves, whether it is draining and its load (in-flight requests, connected clients), and it
advertises in routes the endpoints navigation ranks best for the client's namespace and network,
so a client connected to one proxy spreads its traffic over the fleet. A proxy with a zone lists
only the proxies of its zone while navigation knows one there (`zoned`): a client stays in the zone
of the proxy it reached (navigation sends it to one of its own zone first), and other zones' proxies
carry its traffic only when its zone has none left.
Answers are cached for `endpoints_cache_s`; when navigation is unreachable the last answer (or
this proxy alone) is used, so losing navigation never stops traffic.

A draining proxy tells navigation at once, stops advertising itself, and answers long polls
quickly, while it keeps serving clients that still hold routes to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence

from common.errors import SluiceError
from common.logs import kv
from navigation.client import NavigationClient, ProxyAnnouncer
from navigation.model import DEFAULT_NETWORK, ProxyEndpoint, ProxyLoad, ProxyRegistration, distinct_endpoints
from proxy.config import ProxyConfig

log = logging.getLogger("sluice.proxy.fleet")


class Fleet:
    def __init__(self, config: ProxyConfig, load: Callable[[], ProxyLoad]) -> None:
        self._cfg = config
        self._load = load
        self.draining = False
        self.proxy_id = config.proxy_id or f"{config.advertised_address}-{os.getpid()}"
        self._client = NavigationClient(config.navigation) if config.navigation else None
        self._announcer = (
            ProxyAnnouncer(self._client, self.registration, heartbeat_interval_s=config.navigation_heartbeat_s)
            if self._client is not None
            else None
        )
        self._cache: dict[tuple[str, str], tuple[float, list[ProxyEndpoint]]] = {}

    def networks(self) -> dict[str, str]:
        return dict(self._cfg.networks) or {DEFAULT_NETWORK: self._cfg.advertised_address}

    def network_of(self, access_point: list[str]) -> str:
        """The network a client reached us through: the one whose endpoint it was given."""
        for network, endpoint in self.networks().items():
            if endpoint in access_point:
                return network
        return DEFAULT_NETWORK

    def own_endpoint(self, network: str) -> str:
        nets = self.networks()
        return nets.get(network) or nets.get(DEFAULT_NETWORK) or self._cfg.advertised_address

    def registration(self) -> ProxyRegistration:
        return ProxyRegistration(
            proxy_id=self.proxy_id, endpoints=self.networks(), zone=self._cfg.zone,
            namespaces=frozenset(self._cfg.namespaces), draining=self.draining, load=self._load(),
        )  # fmt: skip

    async def endpoints(self, namespace: str, network: str, access_point: Sequence[str] = ()) -> list[str]:
        """Proxy endpoints to put in routes for a client, best first (never empty). `access_point`:
        the endpoints the client was configured with, in its order; with navigation, the zone of the
        first one navigation knows (its best for the client's zone) is the client's zone (`client_zone`)."""
        own = self.own_endpoint(network)
        if self._client is None:
            peers = [p for p in self._cfg.peers if p != own]
            chosen = peers if self.draining else [own, *peers]
            return chosen[: self._cfg.max_route_endpoints] or [own]
        key = (namespace, network)
        cached = self._cache.get(key)
        if cached is None or time.monotonic() - cached[0] > self._cfg.endpoints_cache_s:
            try:
                ranked = await self._client.select_proxies(namespace, network, self._cfg.zone)
                cached = (time.monotonic(), ranked)
                if len(self._cache) >= self._cfg.caches.endpoints_max and key not in self._cache:
                    self._cache.clear()  # bounded: namespaces come from clients
                self._cache[key] = cached
            except SluiceError as exc:
                log.debug("navigation unavailable; using the last known endpoints", extra=kv(error=exc.message))
        ranked = list(cached[1]) if cached is not None else []
        zone = client_zone(ranked, access_point, self._cfg.zone)
        found = zoned(ranked, zone)[: self._cfg.max_route_endpoints]
        if self.draining:
            found = [e for e in found if e != own]
        elif own not in found and len(found) < self._cfg.max_route_endpoints and zone == self._cfg.zone:
            found.append(own)  # navigation may not know us yet (not added to another zone's list)
        return found or [own]

    async def run(self, stop: asyncio.Event) -> None:
        if self._announcer is not None:
            await self._announcer.run(stop)

    async def drain(self) -> None:
        """Stop being handed out: tell navigation now (not at the next heartbeat)."""
        self.draining = True
        self._cache.clear()
        log.info("proxy draining", extra=kv(proxy_id=self.proxy_id, drain_s=self._cfg.drain_s))
        if self._announcer is not None:
            try:
                await self._announcer.announce_now()
            except SluiceError as exc:
                log.warning("could not tell navigation that this proxy drains", extra=kv(error=exc.message))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


def zoned(ranked: list[ProxyEndpoint], zone: str) -> list[str]:
    """The endpoints routes list, best first: with a `zone`, those of the proxies in it when there is
    one, else every one (a route alternates queues over its endpoints: a proxy of another zone in it
    would carry half of the client's calls across zones)."""
    mine = [p for p in ranked if zone and p.zone == zone]
    return distinct_endpoints(mine or ranked)


def client_zone(ranked: list[ProxyEndpoint], access_point: Sequence[str], own_zone: str) -> str:
    """The zone of the first proxy the client lists that navigation still knows (a client configured
    from navigation's answer for its zone lists its zone's proxies first), else this proxy's: a
    client whose zone's first proxy is down, and whose route query reached another zone (the Python
    client dials its access points in address order), stays in its zone."""
    zones = {p.endpoint: p.zone for p in ranked if p.zone}
    return next((zones[e] for e in access_point if e in zones), own_zone)
