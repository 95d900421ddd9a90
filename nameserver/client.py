"""Clients of the NameServer: `NameServerClient` for proxies and tools, `BrokerRegistrar` for brokers.

NameServers are independent copies of the same picture (brokers register with every one), so:
- reads (`get_route`, `list_brokers`, `list_topics`) ask one NameServer and fail over to the next
  when it is unreachable or does not know the topic (it may have restarted a moment ago); the one
  that answered is asked first next time;
- writes (`register`, `unregister`) go to all NameServers concurrently and succeed when at least
  one accepted.

Errors are `SluiceError`s: a coded answer of a NameServer becomes the same class here (through
`proto.rpc.error_from_rpc`); unreachable NameServers become `Unavailable`. Every call has a deadline
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
from common.errors import InternalError, SluiceError, TopicNotFound, Unavailable
from common.logs import kv
from nameserver import convert
from nameserver.config import DEFAULT_MAX_MESSAGE_BYTES
from nameserver.model import BrokerRegistration, BrokerStatus, TopicRoute, TopicSummary, split_address
from proto.rpc import error_from_rpc
from proto.sluice.internal.v1 import nameserver_pb2 as pb
from proto.sluice.internal.v1 import nameserver_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.nameserver.client")

ADDRESS_SEPARATOR = ";"
DEFAULT_RPC_TIMEOUT_S = 3.0
DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
# gRPC waits between attempts to reconnect to a NameServer that is down; capped so a restarted
# NameServer gets the next heartbeat within a few seconds (gRPC's own cap is two minutes).
DEFAULT_RECONNECT_BACKOFF_MAX_S = 5.0
_RECONNECT_BACKOFF_INITIAL_S = 1.0

Outcomes = dict[str, SluiceError | None]  # per NameServer address: None if it accepted


def parse_addresses(text: str) -> list[str]:
    """`host:port;host:port` as a list (order kept, duplicates dropped); ConfigError if malformed."""
    addresses: list[str] = []
    for part in text.split(ADDRESS_SEPARATOR):
        address = part.strip()
        if not address:
            continue
        if "," in address or " " in address:
            raise ConfigError(f"NameServer addresses {text!r}: separate them with ';', e.g. a:9876;b:9876")
        try:
            split_address(address)
        except ValueError as exc:
            raise ConfigError(f"NameServer {exc}") from None
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ConfigError(f"no NameServer address in {text!r}; give host:port[;host:port...]")
    return addresses


class NameServerClient:
    """Reads routes from, and registers brokers with, a set of independent NameServers."""

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
            raise ConfigError("NameServer client timeout_s and reconnect_backoff_max_s must be positive")
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
        self._preferred = 0  # index of the NameServer that answered last

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._addresses

    async def __aenter__(self) -> NameServerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        await asyncio.gather(*(c.close() for c in channels))

    # -- reads: one NameServer, failing over -----------------------------------------------------

    async def get_route(self, topic: str) -> TopicRoute:
        """The route of `topic`. TopicNotFound if no reachable NameServer knows it; Unavailable if none answered."""
        response = await self._first_answer("GetRoute", pb.GetRouteRequest(topic=topic))
        return convert.route_from_pb(response.route)

    async def list_brokers(self, cluster_name: str = "") -> list[BrokerStatus]:
        response = await self._first_answer("ListBrokers", pb.ListBrokersRequest(cluster_name=cluster_name))
        return [convert.broker_status_from_pb(b) for b in response.brokers]

    async def list_topics(self) -> list[TopicSummary]:
        response = await self._first_answer("ListTopics", pb.ListTopicsRequest())
        return [convert.topic_summary_from_pb(t) for t in response.topics]

    # -- writes: every NameServer at once --------------------------------------------------------

    async def register(self, registration: BrokerRegistration) -> int:
        """Register with every NameServer; returns how many accepted. Raises only if none did."""
        outcomes = await self.register_each(registration)
        return _accepted_or_raise(outcomes, f"registration of broker {registration.broker_name}")

    async def register_each(self, registration: BrokerRegistration) -> Outcomes:
        """Register with every NameServer concurrently; the outcome per NameServer, never raises."""
        request = pb.RegisterBrokerRequest(registration=convert.registration_to_pb(registration))
        return await self._on_all("RegisterBroker", request)

    async def unregister(self, broker_name: str, *, instance_id: str = "") -> int:
        """Remove a broker from every NameServer; returns how many answered. Raises only if none did."""
        request = pb.UnregisterBrokerRequest(broker_name=broker_name, instance_id=instance_id)
        outcomes = await self._on_all("UnregisterBroker", request)
        return _accepted_or_raise(outcomes, f"unregistration of broker {broker_name}")

    # -- internals ------------------------------------------------------------------------------

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=self._channel_options)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.NameServerStub(channel)
        return stub

    async def _call(self, address: str, method: str, request: Any) -> Any:
        rpc = getattr(self._stub(address), method)
        try:
            return await rpc(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, address) from None

    async def _first_answer(self, method: str, request: Any) -> Any:
        failures: list[tuple[str, SluiceError]] = []
        count = len(self._addresses)
        for step in range(count):
            index = (self._preferred + step) % count
            address = self._addresses[index]
            try:
                response = await self._call(address, method, request)
            except SluiceError as exc:
                if not _another_may_answer(exc):
                    raise
                log.debug("nameserver did not answer, trying the next", extra=kv(nameserver=address, error=exc))
                failures.append((address, exc))
                continue
            self._preferred = index
            return response
        raise _read_failure(failures)

    async def _on_all(self, method: str, request: Any) -> Outcomes:
        async def outcome(address: str) -> SluiceError | None:
            try:
                await self._call(address, method, request)
            except SluiceError as exc:
                return exc
            return None

        results = await asyncio.gather(*(outcome(a) for a in self._addresses))
        return dict(zip(self._addresses, results, strict=True))


def _another_may_answer(exc: SluiceError) -> bool:
    # Another NameServer can answer differently when this one is unreachable or overloaded, failed
    # internally, or lacks the topic (restarted and not yet re-registered). Bad input is final.
    return exc.retriable or isinstance(exc, InternalError | TopicNotFound)


def _read_failure(failures: list[tuple[str, SluiceError]]) -> SluiceError:
    details = "; ".join(f"{address}: {exc}" for address, exc in failures)
    not_found = [exc for _, exc in failures if isinstance(exc, TopicNotFound)]
    if not_found:
        return TopicNotFound(f"{not_found[0]} (asked {details})" if len(failures) > 1 else str(not_found[0]))
    if all(exc.retriable for _, exc in failures):
        return Unavailable(f"no NameServer answered: {details}")
    return InternalError(f"no NameServer answered correctly: {details}")


def _accepted_or_raise(outcomes: Outcomes, what: str) -> int:
    accepted = sum(1 for exc in outcomes.values() if exc is None)
    if accepted:
        return accepted
    for address, exc in outcomes.items():
        if exc is not None and not exc.retriable:
            raise type(exc)(f"{what} refused by {address}: {exc}")
    details = "; ".join(f"{address}: {exc}" for address, exc in outcomes.items())
    raise Unavailable(f"{what} reached no NameServer: {details}")


class BrokerRegistrar:
    """Keeps one broker registered with every NameServer; owned by the broker.

    `registration()` is called for every send, so what is sent is always the broker's current
    state. Each send is stamped with this registrar's `instance_id` and an increasing sequence, so a
    NameServer never lets an older in-flight heartbeat overwrite a newer topic list.
    """

    def __init__(
        self,
        client: NameServerClient,
        registration: Callable[[], BrokerRegistration],
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
        self._failing: dict[str, str] = {}  # NameServer address -> last error, while failing

    @property
    def instance_id(self) -> str:
        return self._instance_id

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every `heartbeat_interval_s` until `stop`, then unregister (if configured).

        NameServers that are down are logged (once per change) and retried at the next heartbeat;
        this never raises for them. An exception from `registration()` propagates (a broker bug).
        """
        while not stop.is_set():
            await self._send()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
        if self._unregister_on_stop:
            await self._leave()

    async def report_now(self) -> int:
        """Push the current registration to every NameServer now; returns how many accepted.

        Returns when every NameServer answered or timed out, so all reachable ones hold the new
        state. Raises Unavailable (or the NameServers' coded error) if none accepted; the next
        heartbeat retries either way.
        """
        outcomes = await self._send()
        return _accepted_or_raise(outcomes, "broker registration")

    async def _send(self) -> Outcomes:
        self._sequence += 1
        registration = dataclasses.replace(self._registration(), instance_id=self._instance_id, sequence=self._sequence)
        outcomes = await self._client.register_each(registration)
        self._note(outcomes, registration.broker_name)
        return outcomes

    def _note(self, outcomes: Outcomes, broker_name: str) -> None:
        for address, exc in outcomes.items():
            if exc is None:
                if self._failing.pop(address, None) is not None:
                    log.info("nameserver accepts registrations again", extra=kv(nameserver=address))
                continue
            if self._failing.get(address) != str(exc):
                self._failing[address] = str(exc)
                log.warning(
                    "registration with nameserver failed; retrying at the next heartbeat",
                    extra=kv(nameserver=address, broker=broker_name, error=exc),
                )

    async def _leave(self) -> None:
        broker_name = self._registration().broker_name
        try:
            count = await self._client.unregister(broker_name, instance_id=self._instance_id)
        except SluiceError as exc:
            log.warning("could not unregister from any nameserver", extra=kv(broker=broker_name, error=exc))
            return
        log.info("unregistered from nameservers", extra=kv(broker=broker_name, nameservers=count))
