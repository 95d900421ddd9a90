"""`Cluster`: what one `sluice admin` run talks to — the NameServers and the brokers they list.

Brokers are found through the NameServers (`brokers()`, `route()`) and called through one
`RemoteBroker` each, opened on first use and closed with the Cluster. `on_each` calls several
brokers concurrently and raises the first failure with the broker's name in front (same error
class, so the exit line still carries the right code). `wait_for_route` polls the routes until
they show what the command did, bounded by `route_wait_s`: brokers report topic changes at once,
so this normally returns on the first poll.

Every call is bounded by `timeout_s`. An unreachable NameServer is an `Unavailable` whose message
says so plainly.

`nameserver_cache_s` (default 0: off) keeps the NameServer's answers (brokers, topic list, routes)
that long, and other answers that change slowly through `reuse` (the proxies' client reports, sent
every few seconds): the console sets it so that one page describing 50 topics or groups asks for
the broker list and the connected clients once, not 50 times. Inside a `view()` (a console page, a
round of the console's sampler) only answers asked since the view began are reused: a page never
shows what another page or the sampler read before it was asked for. `wait_for_route` always asks
afresh and drops the cache, so a change made through this Cluster shows at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from broker.client.remote import RemoteBroker
from common.errors import NotThisServer, SluiceError, TopicNotFound, Unavailable
from nameserver.client import NameServerClient
from nameserver.model import BrokerStatus, TopicRoute, TopicSummary

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_ROUTE_WAIT_S = 10.0
_ROUTE_POLL_INTERVAL_S = 0.1
_CACHE_ENTRIES_MAX = 10_000
# When the current view began (`view`); outside one, every cached answer within its time counts.
_VIEW_BEGAN: ContextVar[float] = ContextVar("admin_view_began", default=-math.inf)


@contextlib.contextmanager
def view() -> Iterator[None]:
    """One consistent look at the cluster (a console page, a sampling round): within it, cached
    answers are reused only if asked since it began. Without it, a page could show a client
    report another page or the sampler had read up to `nameserver_cache_s` before: the console's
    AMQP page showed 0 consumers right after `sluice admin amqp queues` (which asks afresh) showed
    the report that had arrived in between."""
    token = _VIEW_BEGAN.set(time.monotonic())
    try:
        yield
    finally:
        _VIEW_BEGAN.reset(token)


class Cluster:
    def __init__(
        self, namesrv: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, route_wait_s: float = DEFAULT_ROUTE_WAIT_S,
        nameserver_cache_s: float = 0.0,
    ) -> None:  # fmt: skip
        self._nameserver = NameServerClient(namesrv, timeout_s=timeout_s)
        self._timeout_s = timeout_s
        self._route_wait_s = route_wait_s
        self._brokers: dict[str, RemoteBroker] = {}
        self._cache_s = nameserver_cache_s
        # "brokers" | "topics" | "route:NAME" | "reuse:KEY" -> (expiry, when asked, answer)
        self._cache: dict[str, tuple[float, float, Any]] = {}

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        brokers = list(self._brokers.values())
        self._brokers.clear()
        await asyncio.gather(self._nameserver.close(), *(b.close() for b in brokers))

    # -- NameServer -----------------------------------------------------------------------------

    async def brokers(self) -> list[BrokerStatus]:
        """Every live registered broker, sorted by name; Unavailable if none is registered."""
        brokers = await self._cached("brokers", self._nameserver.list_brokers)
        if not brokers:
            raise Unavailable(f"no broker is registered with the NameServer at {self._addresses()}; start one")
        return sorted(brokers, key=lambda b: b.broker_name)

    async def route(self, topic: str) -> TopicRoute:
        return await self._cached(f"route:{topic}", lambda: self._nameserver.get_route(topic))

    async def topics(self) -> list[TopicSummary]:
        return await self._cached("topics", self._nameserver.list_topics)

    async def wait_for_route(self, topic: str, done: Callable[[TopicRoute | None], bool], what: str) -> None:
        """Poll the route of `topic` (None: no broker holds it) until `done(route)`; Unavailable after the bound."""
        deadline = time.monotonic() + self._route_wait_s
        while True:
            self._cache.clear()
            try:
                route: TopicRoute | None = await self.route(topic)
            except TopicNotFound:
                route = None
            if done(route):
                return
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"{what}, but the NameServer route of {topic} does not show it after {self._route_wait_s:g} s; "
                    "check that the brokers can reach the NameServers"
                )
            await asyncio.sleep(_ROUTE_POLL_INTERVAL_S)

    async def reuse(self, key: str, ask: Callable[[], Awaitable[T]]) -> T:
        """`ask()`, or its answer of less than `nameserver_cache_s` ago under `key` (always asks when 0)."""
        return await self._cached(f"reuse:{key}", ask, nameserver=False)

    # -- brokers --------------------------------------------------------------------------------

    def broker(self, name: str, address: str) -> RemoteBroker:
        remote = self._brokers.get(name)
        if remote is None or remote.address != address:
            remote = self._brokers[name] = RemoteBroker(name, address, timeout_s=self._timeout_s)
        return remote

    async def on_each(
        self, targets: Sequence[tuple[str, str]], call: Callable[[RemoteBroker], Awaitable[T]]
    ) -> list[T]:
        """`call` on each (name, address) concurrently; results in order, or the first failure, named."""
        outcomes = await asyncio.gather(
            *(call(self.broker(name, address)) for name, address in targets), return_exceptions=True
        )
        results: list[T] = []
        for (name, _), outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, SluiceError):
                raise type(outcome)(f"broker {name}: {outcome}") from None
            if isinstance(outcome, BaseException):
                raise outcome
            results.append(outcome)
        return results

    # -- internals ------------------------------------------------------------------------------

    async def _cached(self, key: str, ask: Callable[[], Awaitable[T]], *, nameserver: bool = True) -> T:
        """`ask()` (a NameServer call unless `nameserver` is false: its Unavailable is worded so),
        or its answer of less than `nameserver_cache_s` ago, asked since the current `view` began."""

        async def fresh() -> T:
            return await (self._ask_nameserver(ask()) if nameserver else ask())

        if self._cache_s <= 0:
            return await fresh()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now and hit[1] >= _VIEW_BEGAN.get():
            answer: T = hit[2]
            return answer
        answer = await fresh()
        if len(self._cache) >= _CACHE_ENTRIES_MAX:
            self._cache.clear()
        self._cache[key] = (now + self._cache_s, now, answer)
        return answer

    def _addresses(self) -> str:
        return ";".join(self._nameserver.addresses)

    async def _ask_nameserver(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except NotThisServer as exc:
            raise NotThisServer(f"{exc}; give --namesrv a NameServer's address (port 9876 by default)") from None
        except Unavailable:
            raise Unavailable(
                f"cannot reach any NameServer at {self._addresses()} (is it running? is --namesrv right?)"
            ) from None
