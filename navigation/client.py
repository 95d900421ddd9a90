"""Clients of navigation: `NavigationClient` for look-ups, `ProxyAnnouncer` for proxies.

Navigation servers are independent copies of the same picture (proxies register with every one), so:
- look-ups (`get_endpoints`, `select_proxies`, `list_proxies`) ask one server and fail over to
  the next when it is unreachable, or when it knows no matching proxy (it may have restarted a
  moment ago and not yet heard every heartbeat); the one that answered is asked first next time;
- writes (`register`, `unregister`) go to every server concurrently and succeed when at least one
  accepted.

Errors are `SluiceError`s: a coded answer of a server becomes the same class here (through
`proto.rpc.error_from_rpc`); unreachable servers become `Unavailable`. Every call has a deadline
(`timeout_s`). Callers use one client from one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from common.errors import SluiceError
from common.logs import kv
from navigation import convert
from navigation.config import DEFAULT_MAX_MESSAGE_BYTES
from navigation.model import (
    DEFAULT_NETWORK,
    EndpointQuery,
    ProxyEndpoint,
    ProxyRegistration,
    ProxyStatus,
    distinct_endpoints,
    split_endpoint,
)
from proto.servers import ADDRESS_SEPARATOR as ADDRESS_SEPARATOR  # re-exported: this module's API
from proto.servers import HeartbeatSender, Outcome, Outcomes, ServerKind, ServerSetClient
from proto.sluice.internal.v1 import navigation_pb2 as pb
from proto.sluice.internal.v1 import navigation_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.navigation.client")

# A fifth of the default proxy expiry (15 s): four heartbeats may be lost before a proxy drops out,
# and load figures are at most this old.
DEFAULT_HEARTBEAT_INTERVAL_S = 3.0

_KIND = ServerKind(
    name="navigation server",
    prefix="navigation",
    example_port=9877,
    split_address=split_endpoint,
    log=log,
    log_key="server",
    max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
)


def parse_addresses(text: str) -> list[str]:
    """`host:port;host:port` of navigation servers as a list (order kept, duplicates dropped).

    ConfigError if malformed or empty.
    """
    return _KIND.parse_addresses(text)


class NavigationClient(ServerSetClient):
    """Looks up proxy endpoints from, and registers proxies with, a set of independent navigation servers."""

    KIND = _KIND
    STUB = pb_grpc.NavigationStub

    # -- look-ups: one server, failing over -----------------------------------------------------

    async def get_endpoints(
        self, namespace: str = "", network: str = DEFAULT_NETWORK, zone: str = "", *, limit: int = 0
    ) -> list[str]:
        """Distinct proxy endpoints, best first (see `Registry.select`); [] if no server knows a proxy.

        Raises Unavailable if no server answered, BadRequest for malformed arguments.
        """
        return distinct_endpoints(await self.select_proxies(namespace, network, zone, limit=limit))

    async def select_proxies(
        self, namespace: str = "", network: str = DEFAULT_NETWORK, zone: str = "", *, limit: int = 0
    ) -> list[ProxyEndpoint]:
        """The ranked proxies behind `get_endpoints` (proxy ids, zones, loads)."""
        request = convert.query_to_pb(EndpointQuery(namespace=namespace, network=network, zone=zone, limit=limit))
        response = await self._servers.first_answer("GetEndpoints", request, accept=_knows_a_proxy)
        if response is None:
            return []  # at least one server answered, and none knows a matching proxy
        return convert.answer_from_pb(response)

    async def list_proxies(self) -> list[ProxyStatus]:
        """Every live proxy as one server sees it (draining ones included), sorted by proxy id."""
        response = await self._servers.first_answer("ListProxies", pb.ListProxiesRequest())
        return [convert.status_from_pb(s) for s in response.proxies]

    # -- writes: every server at once -----------------------------------------------------------

    async def register(self, registration: ProxyRegistration) -> int:
        """Register with every server; returns how many accepted. Raises only if none did."""
        outcomes = await self.register_each(registration)
        return _KIND.accepted_or_raise(outcomes, f"registration of proxy {registration.proxy_id}")

    async def register_each(self, registration: ProxyRegistration) -> Outcomes:
        """Register with every server concurrently; the outcome per server, never raises."""
        request = pb.RegisterProxyRequest(registration=convert.registration_to_pb(registration))
        return await self._servers.on_all("RegisterProxy", request)

    async def register_at(self, address: str, registration: ProxyRegistration) -> Outcome:
        """Register with one of this client's servers; its error (or None). ValueError for a foreign address."""
        if address not in self.addresses:
            raise ValueError(f"{address} is not one of this client's navigation servers")
        request = pb.RegisterProxyRequest(registration=convert.registration_to_pb(registration))
        return await self._servers.on_one(address, "RegisterProxy", request)

    async def unregister(self, proxy_id: str, *, instance_id: str = "", sequence: int = 0) -> int:
        """Remove a proxy from every server; returns how many answered. Raises only if none did."""
        request = pb.UnregisterProxyRequest(proxy_id=proxy_id, instance_id=instance_id, sequence=sequence)
        outcomes = await self._servers.on_all("UnregisterProxy", request)
        return _KIND.accepted_or_raise(outcomes, f"unregistration of {proxy_id}")


def _knows_a_proxy(address: str, response: Any) -> bool:
    # A server that restarted a moment ago may not have heard every heartbeat yet: ask the next.
    if response.proxies:
        return True
    log.debug("navigation server knows no matching proxy, trying the next", extra=kv(server=address))
    return False


class ProxyAnnouncer(HeartbeatSender[ProxyRegistration]):
    """Keeps one proxy registered with every navigation server; owned by the proxy.

    `registration()` is called for every send, so what is sent is always the proxy's current state
    (endpoints, draining flag, load). Each send is stamped with this announcer's `instance_id` and
    an increasing sequence, so a server never lets an older in-flight heartbeat overwrite newer
    state. Each server is heartbeated by its own task, so one that is down or slow (calls wait up
    to the client's `timeout_s`) never delays the others. Call from one event loop only.
    """

    def __init__(
        self,
        client: NavigationClient,
        registration: Callable[[], ProxyRegistration],
        *,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        unregister_on_stop: bool = True,
    ) -> None:
        super().__init__(
            _KIND, registration, heartbeat_interval_s=heartbeat_interval_s, unregister_on_stop=unregister_on_stop
        )
        self._client = client
        self._left = False

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every server every `heartbeat_interval_s` until `stop`, then unregister (if configured).

        Servers that are down are logged (once per change) and retried at their next heartbeat;
        this never raises for them. An exception from `registration()` propagates (a proxy bug).
        """
        async with asyncio.TaskGroup() as tasks:
            for address in self._client.addresses:
                tasks.create_task(self._every_interval(stop, functools.partial(self._heartbeat, address)))
        if self._unregister_on_stop:
            await self._leave()

    async def announce_now(self) -> int:
        """Push the current registration to every server now; returns how many accepted.

        Use it when the state clients depend on changes (e.g. the proxy starts draining): it
        returns when every server answered or timed out, so all reachable ones exclude a draining
        proxy from then on. Raises Unavailable (or the servers' coded error) if none accepted; the
        next heartbeat retries either way. After the announcer left (stop), sends nothing and returns 0.
        """
        if self._left:
            return 0
        registration = self._stamped()
        outcomes = await self._client.register_each(registration)
        self._note_all(outcomes, proxy=registration.proxy_id)
        return _KIND.accepted_or_raise(outcomes, f"announcement of proxy {registration.proxy_id}")

    async def _heartbeat(self, address: str) -> None:
        registration = self._stamped()
        self._note(address, await self._client.register_at(address, registration), proxy=registration.proxy_id)

    async def _leave(self) -> None:
        self._left = True
        proxy_id = self._registration().proxy_id
        # The sequence of the leave is above every registration sent, so a registration still in
        # flight cannot bring the proxy back after it.
        sequence = self._next_sequence()
        try:
            count = await self._client.unregister(proxy_id, instance_id=self.instance_id, sequence=sequence)
        except SluiceError as exc:
            log.warning("could not unregister from any navigation server", extra=kv(proxy=proxy_id, error=exc))
            return
        log.info("unregistered from navigation servers", extra=kv(proxy=proxy_id, servers=count))
