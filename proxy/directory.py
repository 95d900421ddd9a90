"""Where the proxy finds brokers: the one in-process broker (merged topology) or the brokers a
NameServer reports (separated topology), each behind the same `BrokerApi`.

`route(topic)` answers which brokers hold the topic's queues; `broker(name)` gives the BrokerApi to
call. The cluster directory caches routes and refreshes them in the background; while the
NameServer is unreachable it keeps serving from the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from broker.client.api import BrokerApi, TopicSpec
from common.errors import TopicNotFound, Unavailable
from common.logs import kv
from common.model import MessageType, Permission

if TYPE_CHECKING:
    from broker.client.remote import RemoteBroker
    from broker.local import LocalBroker
    from nameserver.client import NameServerClient

log = logging.getLogger("sluice.proxy.directory")

# How long a route the NameServer suddenly does not know stays usable (several broker heartbeats).
UNKNOWN_TOPIC_GRACE_S = 30.0
_ROUTE_CACHE_MAX = 100_000  # topics whose merged route list LocalDirectory keeps; beyond it starts over


@dataclass(frozen=True, slots=True)
class BrokerRoute:
    """One broker's share of a topic: queues [0, queue_count)."""

    broker: str
    queue_count: int
    permission: Permission
    message_types: frozenset[MessageType]


class BrokerDirectory(Protocol):
    async def route(self, topic: str) -> list[BrokerRoute]: ...
    def broker(self, name: str) -> BrokerApi: ...
    async def lookup(self, name: str) -> BrokerApi | None:
        """The broker of that name, asking the cluster once if it is not known yet; None if none is."""

    def broker_names(self) -> list[str]: ...
    async def close(self) -> None: ...


class LocalDirectory:
    """The merged topology: one broker, called in-process."""

    def __init__(self, broker: LocalBroker) -> None:
        self._broker = broker
        self._routes: dict[str, tuple[TopicSpec, list[BrokerRoute]]] = {}  # topic -> (spec, its route)

    async def route(self, topic: str) -> list[BrokerRoute]:
        spec = await self._broker.ensure_topic(topic)  # auto-creates when the broker does
        cached = self._routes.get(topic)
        if cached is not None and cached[0] is spec:  # the same list while the topic is unchanged
            return cached[1]
        routes = [BrokerRoute(self._broker.name, spec.queue_count, spec.permission, spec.message_types)]
        if len(self._routes) > _ROUTE_CACHE_MAX:
            self._routes.clear()
        self._routes[topic] = (spec, routes)
        return routes

    def broker(self, name: str) -> BrokerApi:
        return self._broker

    async def lookup(self, name: str) -> BrokerApi | None:
        return self._broker if name == self._broker.name else None

    def broker_names(self) -> list[str]:
        return [self._broker.name]

    async def close(self) -> None:
        return None


class ClusterDirectory:
    """The separated topology: routes from the NameServer, brokers over gRPC."""

    def __init__(self, namesrv: NameServerClient, *, refresh_s: float) -> None:
        self._ns = namesrv
        self._refresh_s = refresh_s
        self._routes: dict[str, tuple[float, list[BrokerRoute]]] = {}
        self._addresses: dict[str, str] = {}
        self._brokers: dict[str, RemoteBroker] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_loop(), name="route-refresh")

    async def route(self, topic: str) -> list[BrokerRoute]:
        cached = self._routes.get(topic)
        if cached is not None and time.monotonic() - cached[0] < self._refresh_s:
            return cached[1]
        try:
            return await self._fetch(topic)
        except Unavailable:
            if cached is not None:
                return cached[1]  # NameServer unreachable: keep serving from the cache
            raise

    async def _fetch(self, topic: str) -> list[BrokerRoute]:
        try:
            route = await self._ns.get_route(topic)
        except TopicNotFound:
            cached = self._routes.get(topic)
            if cached is not None and time.monotonic() - cached[0] < UNKNOWN_TOPIC_GRACE_S:
                # A restarted NameServer knows no topic until the brokers' next heartbeat: a route
                # that was good moments ago stays in use instead of failing clients meanwhile.
                return cached[1]
            self._routes.pop(topic, None)
            raise
        routes = []
        for b in route.brokers:
            self._learn(b.broker_name, b.address)
            routes.append(BrokerRoute(b.broker_name, b.queue_count, b.permission, b.message_types))
        self._routes[topic] = (time.monotonic(), routes)
        return routes

    def _learn(self, name: str, address: str) -> None:
        if self._addresses.get(name) == address:
            return
        from broker.client.remote import RemoteBroker

        old = self._brokers.pop(name, None)
        if old is not None:
            asyncio.get_running_loop().create_task(old.close())
        self._addresses[name] = address
        self._brokers[name] = RemoteBroker(name, address)
        log.info("broker endpoint learned", extra=kv(broker=name, address=address))

    def broker(self, name: str) -> BrokerApi:
        remote = self._brokers.get(name)
        if remote is None:
            raise Unavailable(f"broker {name} is not known to this proxy (no route mentions it)")
        return remote

    async def lookup(self, name: str) -> BrokerApi | None:
        if name not in self._brokers:
            with contextlib.suppress(Unavailable):
                await self.refresh_brokers()
        return self._brokers.get(name)

    def broker_names(self) -> list[str]:
        return sorted(self._brokers)

    async def refresh_brokers(self) -> None:
        for status in await self._ns.list_brokers():
            self._learn(status.broker_name, status.address)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            with contextlib.suppress(Unavailable):
                await self.refresh_brokers()
            for topic in list(self._routes):
                try:
                    await self._fetch(topic)
                except TopicNotFound:
                    pass
                except Unavailable as exc:
                    log.warning("NameServer unreachable; serving cached routes", extra=kv(error=exc.message))
                    break

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for remote in self._brokers.values():
            await remote.close()
        await self._ns.close()
