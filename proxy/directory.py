"""Where the proxy finds brokers: the one in-process broker (merged topology) or the brokers a
NameServer reports (separated topology), each behind the same `BrokerApi`.

`route(topic)` answers which brokers hold the topic's queues; `broker(name)` gives the BrokerApi to
call. The cluster directory serves routes from its cache and refreshes them in the background
(stale-while-revalidate): a slow, hung or unreachable NameServer never delays a request whose
topic it has routed before. A route from a NameServer that has just started (`young`) does not
drop brokers the cached route has: they may not have re-registered with it yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from broker.client.api import BrokerApi, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import TopicNotFound, Unavailable
from common.logs import kv
from common.model import MessageType, Permission
from proxy import firstuse
from proxy.config import BrokerClientConfig, CacheConfig

if TYPE_CHECKING:
    from nameserver.client import NameServerClient

log = logging.getLogger("sluice.proxy.directory")
Silent = Callable[[str, str], None]  # (broker, why)

# How long a route the NameServer suddenly does not know stays usable (several broker heartbeats).
UNKNOWN_TOPIC_GRACE_S = 30.0
# How long a request waits for a broker listing triggered by an unknown broker name (then: unknown).
LOOKUP_WAIT_S = 0.5


@dataclass(frozen=True, slots=True)
class BrokerRoute:
    """One broker's share of a topic: queues [0, queue_count)."""

    broker: str
    queue_count: int
    permission: Permission
    message_types: frozenset[MessageType]
    # Where clients reach this broker's queues: the client endpoint of the merged node that owns
    # the broker (docs/shards.md); "" for the proxy's usual endpoints (fleet or itself).
    endpoint: str = ""


class BrokerDirectory(Protocol):
    async def route(self, topic: str) -> list[BrokerRoute]: ...
    async def decide(self, topic: str, first: MessageType) -> list[BrokerRoute]:
        """The route of `topic` once a message of type `first` decided what it accepts, for a topic
        created on first use whose route says it accepts every type (`UNDECIDED_TYPES`): decided
        once for every broker holding a copy (proxy/firstuse.py). Where the topic has one copy, its
        broker decides with the send itself and the route is returned as it is."""

    def forget(self, topic: str) -> None:
        """Drop what is cached of `topic`'s route: a broker it named answered TOPIC_NOT_FOUND (the
        topic was deleted since), so the next lookup asks again (and, with auto-create, creates the
        topic anew on first use) instead of serving the stale route for a while."""

    def broker(self, name: str) -> BrokerApi: ...
    def on_silent(self, callback: Silent) -> None:
        """`callback(broker, why)` when a broker reached over the network answered no keepalive
        PING in time (cut off or hung): proxy/core/health.py avoids it until it answers."""

    async def lookup(self, name: str) -> BrokerApi | None:
        """The broker of that name, asking the cluster once if it is not known yet; None if none is."""

    async def moved(self, name: str) -> BrokerApi | None:
        """The broker of that name if the cluster now gives it another address (a broker group's
        failover: docs/replication.md), else None."""

    def broker_names(self) -> list[str]: ...
    async def close(self) -> None: ...


class InProcessBroker(BrokerApi, Protocol):
    """The broker of the merged topology (the `sluice` command hands in a `broker.local.LocalBroker`)."""

    async def ensure_topic(self, name: str) -> TopicSpec:
        """The topic's spec, creating it first where the broker auto-creates topics."""
        ...

    def held_topic(self, name: str) -> TopicSpec | None:
        """The broker's copy of the topic; None when it holds none (nothing is created)."""
        ...


class LocalDirectory:
    """The merged topology: one broker, called in-process."""

    def __init__(self, broker: InProcessBroker, *, topics_max: int = CacheConfig.topics_max) -> None:
        self._broker = broker
        self._routes: dict[str, tuple[TopicSpec, list[BrokerRoute]]] = {}  # topic -> (spec, its route)
        self._topics_max = topics_max

    async def route(self, topic: str) -> list[BrokerRoute]:
        spec = await self._broker.ensure_topic(topic)  # auto-creates when the broker does
        cached = self._routes.get(topic)
        if cached is not None and cached[0] is spec:  # the same list while the topic is unchanged
            return cached[1]
        routes = [BrokerRoute(self._broker.name, spec.queue_count, spec.permission, spec.message_types)]
        if len(self._routes) >= self._topics_max:
            self._routes.clear()  # bounded: a full cache starts over
        self._routes[topic] = (spec, routes)
        return routes

    async def decide(self, topic: str, first: MessageType) -> list[BrokerRoute]:
        return await self.route(topic)  # one copy: the broker decides it with the send

    def forget(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def on_silent(self, callback: Silent) -> None:
        """The broker is in this process: never silent."""

    def broker(self, name: str) -> BrokerApi:
        return self._broker

    async def lookup(self, name: str) -> BrokerApi | None:
        return self._broker if name == self._broker.name else None

    async def moved(self, name: str) -> BrokerApi | None:
        return None

    def broker_names(self) -> list[str]:
        return [self._broker.name]

    async def close(self) -> None:
        return None


class ClusterDirectory:
    """The separated topology: routes from the NameServer, brokers over gRPC.

    Stale-while-revalidate: a request for a topic whose route is cached always gets the cached
    route at once, however old; `_refresh_loop` (a task this directory owns: `start`, cancelled by
    `close`) renews every cached route each `refresh_s`. Only a topic this proxy has never routed
    waits for the NameServer, and concurrent requests for it share that one lookup. So a slow or
    hung NameServer costs requests nothing once their routes are known. Broker names from receipt
    handles and transaction ids (which anyone can forge) are looked up at most once per
    `refresh_s`, and a request waits at most `LOOKUP_WAIT_S` for that.
    """

    def __init__(
        self,
        namesrv: NameServerClient,
        *,
        refresh_s: float,
        brokers: BrokerClientConfig | None = None,
        topics_max: int = CacheConfig.topics_max,
        auto_create: bool = False,
        remote: Callable[..., RemoteBroker] = RemoteBroker,
    ) -> None:
        self._ns = namesrv
        self._remote = remote  # how a broker's client is made (merged nodes count forwarded calls)
        self._client_endpoints: dict[str, str] = {}  # broker -> its merged node's client endpoint
        self._auto_create = auto_create
        self._refresh_s = refresh_s
        self._client = brokers or BrokerClientConfig()
        self._topics_max = topics_max
        self._routes: dict[str, tuple[float, list[BrokerRoute]]] = {}
        self._addresses: dict[str, str] = {}
        self._brokers: dict[str, RemoteBroker] = {}
        self._task: asyncio.Task[None] | None = None
        # Clients of brokers that moved, closing; `close` waits for them.
        self._closing: set[asyncio.Task[None]] = set()
        self._first_fetches: dict[str, asyncio.Task[list[BrokerRoute]]] = {}
        self._listing: asyncio.Task[None] | None = None
        self._listed_at = -refresh_s  # when brokers were last listed (or tried)
        self._on_silent: Silent | None = None  # told when a broker answered no keepalive PING

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_loop(), name="route-refresh")

    async def route(self, topic: str) -> list[BrokerRoute]:
        cached = self._routes.get(topic)
        if cached is not None:
            return cached[1]  # however old: the refresh loop renews it, requests never wait for it
        task = self._first_fetches.get(topic)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(topic), name=f"route-{topic[:64]}")
            self._first_fetches[topic] = task
            task.add_done_callback(lambda done: self._first_fetch_done(topic, done))
        return await asyncio.shield(task)  # a caller that gives up does not cancel the others' lookup

    def _first_fetch_done(self, topic: str, task: asyncio.Task[list[BrokerRoute]]) -> None:
        self._first_fetches.pop(topic, None)
        if not task.cancelled():
            task.exception()  # retrieved: the callers that waited got it; the others had given up

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
            if not self._auto_create:
                raise
            return self._cache(topic, await self._create(topic))
        routes = []
        for b in route.brokers:
            self._learn(b.broker_name, b.address)
            if b.client_endpoint and self._client_endpoints.get(b.broker_name) != b.client_endpoint:
                # A node the last listing did not show yet: known from the route at once (a new dict:
                # routes built from the old one are rebuilt).
                self._client_endpoints = {**self._client_endpoints, b.broker_name: b.client_endpoint}
            routes.append(BrokerRoute(b.broker_name, b.queue_count, b.permission, b.message_types))
        if route.young:
            routes = self._keep_missing(topic, routes)
        return self._cache(topic, routes)

    def _keep_missing(self, topic: str, routes: list[BrokerRoute]) -> list[BrokerRoute]:
        """A young NameServer's route plus the brokers of the cached route it lacks: they may just
        not have re-registered yet. A broker leaves a route only on the word of a NameServer that
        has been up long enough to have heard from every live broker."""
        cached = self._routes.get(topic)
        if cached is None:
            return routes
        named = {r.broker for r in routes}
        kept = [r for r in cached[1] if r.broker not in named]
        if not kept:
            return routes
        log.info("young NameServer's route lacks brokers; keeping them",
                 extra=kv(topic=topic, brokers=",".join(r.broker for r in kept)))  # fmt: skip
        return sorted(routes + kept, key=lambda r: r.broker)

    def _cache(self, topic: str, routes: list[BrokerRoute]) -> list[BrokerRoute]:
        if len(self._routes) >= self._topics_max and topic not in self._routes:
            self._routes.clear()  # bounded: the next refresh round asks only for topics still in use
        self._routes[topic] = (time.monotonic(), routes)
        return routes

    async def _create(self, topic: str) -> list[BrokerRoute]:
        """A topic no NameServer knows: the copies brokers hold (a NameServer that restarted moments
        ago may not list them yet), else created on the first broker by name that creates topics
        on first use, which decides its definition (proxy/firstuse.py; the NameServers learn of it
        from that broker, the refresh loop then takes their route)."""
        firstuse.refuse_system(topic)
        if not self._brokers:
            with contextlib.suppress(Unavailable):
                await self.refresh_brokers()
        found, _ = await firstuse.held(topic, self._brokers)
        if not found:
            name, spec = await firstuse.create(topic, self._brokers)
            found = {name: spec}
        return [BrokerRoute(n, s.queue_count, s.permission, s.message_types) for n, s in sorted(found.items())]

    async def decide(self, topic: str, first: MessageType) -> list[BrokerRoute]:
        return await self.route(topic)  # created on first use on one broker: it decides with the send

    def forget(self, topic: str) -> None:
        # Not kept through UNKNOWN_TOPIC_GRACE_S either: that grace covers a NameServer that does
        # not know a topic yet, while here a broker of the route said it holds none.
        self._routes.pop(topic, None)

    async def refetch(self, topic: str) -> None:
        """Take the NameServer's route of `topic` now (a broker changed it and reported already);
        the cached one stays when the NameServer does not answer."""
        with contextlib.suppress(TopicNotFound, Unavailable):
            await self._fetch(topic)

    def _learn(self, name: str, address: str) -> None:
        if self._addresses.get(name) == address:
            return
        old = self._brokers.pop(name, None)
        if old is not None:  # calls in flight on it end as they are; owned until they have
            task = asyncio.get_running_loop().create_task(old.close(), name=f"close-{name}")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._addresses[name] = address
        c = self._client
        self._brokers[name] = self._remote(name, address, timeout_s=c.timeout_s,
                                           reconnect_backoff_max_s=c.reconnect_backoff_max_s,
                                           max_pending_sends=c.max_pending_sends, keepalive_s=c.keepalive_s,
                                           keepalive_timeout_s=c.keepalive_timeout_s,
                                           on_silent=self._silent)  # fmt: skip
        log.info("broker endpoint learned", extra=kv(broker=name, address=address))

    def on_silent(self, callback: Silent) -> None:
        self._on_silent = callback

    def _silent(self, name: str, why: str) -> None:
        if self._on_silent is not None:
            self._on_silent(name, why)

    def broker(self, name: str) -> BrokerApi:
        remote = self._brokers.get(name)
        if remote is None:
            raise Unavailable(f"broker {name} is not known to this proxy (no route mentions it)")
        return remote

    async def lookup(self, name: str) -> BrokerApi | None:
        known = self._brokers.get(name)
        if known is not None or time.monotonic() - self._listed_at < self._refresh_s:
            return known  # listed recently: a name not known now is not in the cluster
        if self._listing is None or self._listing.done():
            self._listed_at = time.monotonic()
            self._listing = asyncio.get_running_loop().create_task(self._list_quietly(), name="broker-lookup")
        await asyncio.wait({self._listing}, timeout=LOOKUP_WAIT_S)
        return self._brokers.get(name)

    async def _list_quietly(self) -> None:
        with contextlib.suppress(Unavailable):
            await self.refresh_brokers()

    async def moved(self, name: str) -> BrokerApi | None:
        before = self._addresses.get(name)
        # One listing at a time, shared: every send a failover refused asks at once.
        if self._listing is None or self._listing.done():
            self._listed_at = time.monotonic()
            self._listing = asyncio.get_running_loop().create_task(self._list_quietly(), name="broker-lookup")
        await asyncio.shield(self._listing)
        after = self._addresses.get(name)
        return self._brokers[name] if after is not None and after != before else None

    def broker_names(self) -> list[str]:
        return sorted(self._brokers)

    async def refresh_brokers(self) -> None:
        statuses = await self._ns.list_brokers()
        self._listed_at = time.monotonic()
        for status in statuses:
            self._learn(status.broker_name, status.address)
        self._client_endpoints = {s.broker_name: s.client_endpoint for s in statuses if s.client_endpoint}

    def client_endpoints(self) -> dict[str, str]:
        """Broker name -> client endpoint of the merged node that runs it, as last listed."""
        return self._client_endpoints

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self._refresh_all()
            except Exception as exc:  # never let the loop die: requests would be served stale routes forever
                log.warning("route refresh failed; serving cached routes", extra=kv(error=repr(exc)))

    async def _refresh_all(self) -> None:
        with contextlib.suppress(Unavailable):
            await self.refresh_brokers()
        for topic in list(self._routes):
            try:
                await self._fetch(topic)
            except TopicNotFound:
                pass
            except Unavailable as exc:
                log.warning("NameServer unreachable; serving cached routes", extra=kv(error=exc.message))
                return

    async def close(self) -> None:
        tasks = [t for t in (self._task, self._listing, *self._first_fetches.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for remote in self._brokers.values():
            await remote.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self._ns.close()
