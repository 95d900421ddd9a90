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
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from common.config import ConfigError
from common.errors import InternalError, SluiceError, Unavailable
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
from proto.rpc import error_from_rpc
from proto.sluice.internal.v1 import navigation_pb2 as pb
from proto.sluice.internal.v1 import navigation_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.navigation.client")

ADDRESS_SEPARATOR = ";"
DEFAULT_RPC_TIMEOUT_S = 3.0
# A fifth of the default proxy expiry (15 s): four heartbeats may be lost before a proxy drops out,
# and load figures are at most this old.
DEFAULT_HEARTBEAT_INTERVAL_S = 3.0
# gRPC waits between attempts to reconnect to a server that is down; capped so a restarted
# navigation server gets the next heartbeat within seconds (gRPC's own cap is two minutes).
DEFAULT_RECONNECT_BACKOFF_MAX_S = 5.0
_RECONNECT_BACKOFF_INITIAL_S = 1.0

Outcome = SluiceError | None  # per navigation server: None if it accepted
Outcomes = dict[str, Outcome]


def parse_addresses(text: str) -> list[str]:
    """`host:port;host:port` of navigation servers as a list (order kept, duplicates dropped).

    ConfigError if malformed or empty.
    """
    addresses: list[str] = []
    for part in text.split(ADDRESS_SEPARATOR):
        address = part.strip()
        if not address:
            continue
        if "," in address or " " in address:
            raise ConfigError(f"navigation addresses {text!r}: separate them with ';', e.g. a:9877;b:9877")
        try:
            split_endpoint(address)
        except ValueError as exc:
            raise ConfigError(f"navigation server {exc}") from None
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ConfigError(f"no navigation server address in {text!r}; give host:port[;host:port...]")
    return addresses


class NavigationClient:
    """Looks up proxy endpoints from, and registers proxies with, a set of independent navigation servers."""

    def __init__(
        self,
        addresses: Sequence[str] | str,
        *,
        timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        text = addresses if isinstance(addresses, str) else ADDRESS_SEPARATOR.join(addresses)
        self._addresses = tuple(parse_addresses(text))
        if timeout_s <= 0 or reconnect_backoff_max_s <= 0:
            raise ConfigError("navigation client timeout_s and reconnect_backoff_max_s must be positive")
        self._timeout_s = timeout_s
        backoff_max_ms = int(reconnect_backoff_max_s * 1000)
        self._channel_options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", min(int(_RECONNECT_BACKOFF_INITIAL_S * 1000), backoff_max_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_max_ms),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._preferred = 0  # index of the server that answered last

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._addresses

    async def __aenter__(self) -> NavigationClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        await asyncio.gather(*(c.close() for c in channels))

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
        failures: list[tuple[str, SluiceError]] = []
        count = len(self._addresses)
        for step in range(count):
            index = (self._preferred + step) % count
            address = self._addresses[index]
            try:
                response = await self._call(address, "GetEndpoints", request)
            except SluiceError as exc:
                if not _another_may_answer(exc):
                    raise
                log.debug("navigation server did not answer, trying the next", extra=kv(server=address, error=exc))
                failures.append((address, exc))
                continue
            if response.proxies:
                self._preferred = index
                return convert.answer_from_pb(response)
            log.debug("navigation server knows no matching proxy, trying the next", extra=kv(server=address))
        if len(failures) == count:
            raise _read_failure(failures)
        return []  # at least one server answered, and none knows a matching proxy

    async def list_proxies(self) -> list[ProxyStatus]:
        """Every live proxy as one server sees it (draining ones included), sorted by proxy id."""
        failures: list[tuple[str, SluiceError]] = []
        count = len(self._addresses)
        for step in range(count):
            index = (self._preferred + step) % count
            address = self._addresses[index]
            try:
                response = await self._call(address, "ListProxies", pb.ListProxiesRequest())
            except SluiceError as exc:
                if not _another_may_answer(exc):
                    raise
                failures.append((address, exc))
                continue
            self._preferred = index
            return [convert.status_from_pb(s) for s in response.proxies]
        raise _read_failure(failures)

    # -- writes: every server at once -----------------------------------------------------------

    async def register(self, registration: ProxyRegistration) -> int:
        """Register with every server; returns how many accepted. Raises only if none did."""
        outcomes = await self.register_each(registration)
        return _accepted_or_raise(outcomes, f"registration of proxy {registration.proxy_id}")

    async def register_each(self, registration: ProxyRegistration) -> Outcomes:
        """Register with every server concurrently; the outcome per server, never raises."""
        results = await asyncio.gather(*(self.register_at(a, registration) for a in self._addresses))
        return dict(zip(self._addresses, results, strict=True))

    async def register_at(self, address: str, registration: ProxyRegistration) -> Outcome:
        """Register with one of this client's servers; its error (or None). ValueError for a foreign address."""
        if address not in self._addresses:
            raise ValueError(f"{address} is not one of this client's navigation servers")
        request = pb.RegisterProxyRequest(registration=convert.registration_to_pb(registration))
        try:
            await self._call(address, "RegisterProxy", request)
        except SluiceError as exc:
            return exc
        return None

    async def unregister(self, proxy_id: str, *, instance_id: str = "", sequence: int = 0) -> int:
        """Remove a proxy from every server; returns how many answered. Raises only if none did."""
        request = pb.UnregisterProxyRequest(proxy_id=proxy_id, instance_id=instance_id, sequence=sequence)

        async def outcome(address: str) -> Outcome:
            try:
                await self._call(address, "UnregisterProxy", request)
            except SluiceError as exc:
                return exc
            return None

        results = await asyncio.gather(*(outcome(a) for a in self._addresses))
        return _accepted_or_raise(dict(zip(self._addresses, results, strict=True)), f"unregistration of {proxy_id}")

    # -- internals ------------------------------------------------------------------------------

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=self._channel_options)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.NavigationStub(channel)
        return stub

    async def _call(self, address: str, method: str, request: Any) -> Any:
        rpc = getattr(self._stub(address), method)
        try:
            return await rpc(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, address) from None


def _another_may_answer(exc: SluiceError) -> bool:
    # Another server can answer when this one is unreachable, overloaded or failed internally;
    # bad input is final.
    return exc.retriable or isinstance(exc, InternalError)


def _read_failure(failures: list[tuple[str, SluiceError]]) -> SluiceError:
    details = "; ".join(f"{address}: {exc}" for address, exc in failures)
    if all(exc.retriable for _, exc in failures):
        return Unavailable(f"no navigation server answered: {details}")
    return InternalError(f"no navigation server answered correctly: {details}")


def _accepted_or_raise(outcomes: Outcomes, what: str) -> int:
    accepted = sum(1 for exc in outcomes.values() if exc is None)
    if accepted:
        return accepted
    for address, exc in outcomes.items():
        if exc is not None and not exc.retriable:
            raise type(exc)(f"{what} refused by {address}: {exc}")
    details = "; ".join(f"{address}: {exc}" for address, exc in outcomes.items())
    raise Unavailable(f"{what} reached no navigation server: {details}")


class ProxyAnnouncer:
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
        if heartbeat_interval_s <= 0:
            raise ConfigError(f"heartbeat_interval_s must be positive, got {heartbeat_interval_s}")
        self._client = client
        self._registration = registration
        self._interval_s = heartbeat_interval_s
        self._unregister_on_stop = unregister_on_stop
        self._instance_id = uuid.uuid4().hex
        self._sequence = 0
        self._left = False
        self._failing: dict[str, str] = {}  # server address -> last error, while failing

    @property
    def instance_id(self) -> str:
        return self._instance_id

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every server every `heartbeat_interval_s` until `stop`, then unregister (if configured).

        Servers that are down are logged (once per change) and retried at their next heartbeat;
        this never raises for them. An exception from `registration()` propagates (a proxy bug).
        """
        async with asyncio.TaskGroup() as tasks:
            for address in self._client.addresses:
                tasks.create_task(self._heartbeat(address, stop))
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
        for address, exc in outcomes.items():
            self._note(address, exc, registration.proxy_id)
        return _accepted_or_raise(outcomes, f"announcement of proxy {registration.proxy_id}")

    async def _heartbeat(self, address: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            registration = self._stamped()
            self._note(address, await self._client.register_at(address, registration), registration.proxy_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)

    def _stamped(self) -> ProxyRegistration:
        # No await between taking the sequence and reading the state: a higher sequence is always
        # a later snapshot.
        self._sequence += 1
        return dataclasses.replace(self._registration(), instance_id=self._instance_id, sequence=self._sequence)

    def _note(self, address: str, exc: Outcome, proxy_id: str) -> None:
        if exc is None:
            if self._failing.pop(address, None) is not None:
                log.info("navigation server accepts registrations again", extra=kv(server=address))
            return
        if self._failing.get(address) != str(exc):
            self._failing[address] = str(exc)
            log.warning(
                "registration with navigation server failed; retrying at the next heartbeat",
                extra=kv(server=address, proxy=proxy_id, error=exc),
            )

    async def _leave(self) -> None:
        self._left = True
        proxy_id = self._registration().proxy_id
        # The sequence of the leave is above every registration sent, so a registration still in
        # flight cannot bring the proxy back after it.
        self._sequence += 1
        try:
            count = await self._client.unregister(proxy_id, instance_id=self._instance_id, sequence=self._sequence)
        except SluiceError as exc:
            log.warning("could not unregister from any navigation server", extra=kv(proxy=proxy_id, error=exc))
            return
        log.info("unregistered from navigation servers", extra=kv(proxy=proxy_id, servers=count))
