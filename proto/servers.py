"""Clients of a set of independent servers of one kind: the NameServers, the navigation servers.

Such servers hold independent copies of the same picture (every process registers with each), so:
- `ServerSet.first_answer` asks one server and fails over to the next when it is unreachable, failed
  internally or does not know the thing asked for yet; the one that answered is asked first next time;
- `ServerSet.on_all` asks every server concurrently and returns the outcome per server;
- a `ServerSetClient` (base of `NameServerClient`, `NavigationClient`) owns a `ServerSet`;
- a `HeartbeatSender` keeps one process registered with every server, stamping each registration
  with the sender's `instance_id` and an increasing sequence, so a server never lets an older
  in-flight heartbeat overwrite newer state.

A `ServerKind` holds what differs between kinds: their names in messages and logs, and how an
address is checked. Errors are `SluiceError`s: a coded answer becomes the same class here (through
`proto.rpc.error_from_rpc`); unreachable servers become `Unavailable`. Every call has a deadline.
Callers use one `ServerSet` from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

import grpc

from common.config import ConfigError
from common.errors import InternalError, NotThisServer, SluiceError, Unavailable
from common.logs import kv
from proto import token
from proto.rpc import error_from_rpc

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ADDRESS_SEPARATOR = ";"
# A client call's deadline unless the caller gives one.
DEFAULT_RPC_TIMEOUT_S = 3.0
# gRPC waits between attempts to reconnect to a server that is down; capped so a restarted server
# gets the next heartbeat within a few seconds (gRPC's own cap is two minutes).
DEFAULT_RECONNECT_BACKOFF_MAX_S = 5.0
_RECONNECT_BACKOFF_INITIAL_S = 1.0

Outcome = SluiceError | None  # of one server: None if it accepted
Outcomes = dict[str, Outcome]  # per server address
Failures = list[tuple[str, SluiceError]]  # (server address, its error), in the order asked

R = TypeVar("R", bound="DataclassInstance")


@dataclasses.dataclass(frozen=True)
class ServerKind:
    """How messages and logs name one kind of server, and how its addresses are checked."""

    name: str  # in messages, e.g. "no NameServer answered", "no navigation server address in ..."
    prefix: str  # before "addresses" and "client" in configuration errors, e.g. "navigation addresses ..."
    example_port: int  # in the hint for addresses separated wrongly
    split_address: Callable[[str], tuple[str, int]]  # `host:port` as (host, port); ValueError if malformed
    log: logging.Logger  # of the client module; lines name the server `name.lower()`
    log_key: str  # the structured log field holding a server's address
    max_message_bytes: int  # a client's default bound on a request or answer (the server's own)

    def parse_addresses(self, text: str) -> list[str]:
        """`host:port;host:port` as a list (order kept, duplicates dropped); ConfigError if malformed or empty."""
        addresses: list[str] = []
        for part in text.split(ADDRESS_SEPARATOR):
            address = part.strip()
            if not address:
                continue
            if "," in address or " " in address:
                port = self.example_port
                raise ConfigError(f"{self.prefix} addresses {text!r}: separate them with ';', e.g. a:{port};b:{port}")
            try:
                self.split_address(address)
            except ValueError as exc:
                raise ConfigError(f"{self.name} {exc}") from None
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise ConfigError(f"no {self.name} address in {text!r}; give host:port[;host:port...]")
        return addresses

    def no_answer(self, failures: Failures, unknown_here: tuple[type[SluiceError], ...] = ()) -> SluiceError:
        """The error for a read that every server failed: an `unknown_here` answer if any, else unavailable."""
        details = "; ".join(f"{address}: {exc}" for address, exc in failures)
        for cls in unknown_here:
            unknown = [exc for _, exc in failures if isinstance(exc, cls)]
            if unknown:
                return cls(f"{unknown[0]} (asked {details})" if len(failures) > 1 else str(unknown[0]))
        if all(isinstance(exc, NotThisServer) for _, exc in failures):
            return NotThisServer("; ".join(str(exc) for _, exc in failures))  # each names its address
        if all(exc.retriable for _, exc in failures):
            return Unavailable(f"no {self.name} answered: {details}")
        return InternalError(f"no {self.name} answered correctly: {details}")

    def accepted_or_raise(self, outcomes: Outcomes, what: str) -> int:
        """How many servers accepted; if none did, raises the first final error, else Unavailable."""
        accepted = sum(1 for exc in outcomes.values() if exc is None)
        if accepted:
            return accepted
        for address, exc in outcomes.items():
            if exc is not None and not exc.retriable:
                raise type(exc)(f"{what} refused by {address}: {exc}")
        details = "; ".join(f"{address}: {exc}" for address, exc in outcomes.items())
        raise Unavailable(f"{what} reached no {self.name}: {details}")


class ServerSet:
    """Channels to a set of independent servers of one kind, asked one after another or all at once.

    A channel and its stub (`stub(channel)`) are created on the first call to a server.
    """

    def __init__(
        self,
        kind: ServerKind,
        addresses: Sequence[str] | str,
        stub: Callable[[grpc.aio.Channel], Any],
        *,
        timeout_s: float,
        reconnect_backoff_max_s: float,
        max_message_bytes: int,
    ) -> None:
        text = addresses if isinstance(addresses, str) else ADDRESS_SEPARATOR.join(addresses)
        self._kind = kind
        self._addresses = tuple(kind.parse_addresses(text))
        if timeout_s <= 0 or reconnect_backoff_max_s <= 0:
            raise ConfigError(f"{kind.prefix} client timeout_s and reconnect_backoff_max_s must be positive")
        self._new_stub = stub
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

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        await asyncio.gather(*(c.close() for c in channels))

    async def call(self, address: str, method: str, request: Any) -> Any:
        """`method` of the server at `address`, with the deadline; its error as a SluiceError."""
        rpc = getattr(self._stub(address), method)
        try:
            return await rpc(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotThisServer(
                    f"{address} answers but is not a {self._kind.name}: it has none of a {self._kind.name}'s calls "
                    "(another server's port, such as a proxy's client port or a broker's?)"
                ) from None
            raise error_from_rpc(exc, address) from None

    async def first_answer(
        self,
        method: str,
        request: Any,
        *,
        unknown_here: tuple[type[SluiceError], ...] = (),
        accept: Callable[[str, Any], bool] | None = None,
    ) -> Any:
        """The answer of the first server that gives one, starting with the one that answered last.

        Asks the next server when one is unreachable or overloaded (a retriable error), failed
        internally, or answers one of `unknown_here` (it may have restarted a moment ago); any other
        error (bad input) is final and raised. When every server failed, raises `kind.no_answer`.
        With `accept(address, response)`, an answer it rejects also moves on to the next server; if
        servers answered but none was accepted, returns None.
        """
        failures: Failures = []
        count = len(self._addresses)
        for step in range(count):
            index = (self._preferred + step) % count
            address = self._addresses[index]
            try:
                response = await self.call(address, method, request)
            except SluiceError as exc:
                if not (exc.retriable or isinstance(exc, (InternalError, *unknown_here))):
                    raise
                self._kind.log.debug(
                    f"{self._kind.name.lower()} did not answer, trying the next",
                    extra=kv(**{self._kind.log_key: address, "error": exc}),
                )
                failures.append((address, exc))
                continue
            if accept is None or accept(address, response):
                self._preferred = index
                return response
        if len(failures) == count:
            raise self._kind.no_answer(failures, unknown_here)
        return None

    async def on_all(self, method: str, request: Any) -> Outcomes:
        """`method` on every server concurrently; the outcome per server, in address order. Never raises."""
        results = await asyncio.gather(*(self.on_one(a, method, request) for a in self._addresses))
        return dict(zip(self._addresses, results, strict=True))

    async def on_one(self, address: str, method: str, request: Any) -> Outcome:
        """`method` on one server; its error (or None). Never raises a SluiceError."""
        try:
            await self.call(address, method, request)
        except SluiceError as exc:
            return exc
        return None

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = token.channel(address, self._channel_options)
            self._channels[address] = channel
            stub = self._stubs[address] = self._new_stub(channel)
        return stub


class ServerSetClient:
    """Base of a client of one kind of server: owns its `ServerSet` (`_servers`) and closes it.

    A subclass names its `KIND` and its gRPC `STUB`; every client of a set is built alike."""

    KIND: ClassVar[ServerKind]
    STUB: ClassVar[Callable[[grpc.aio.Channel], Any]]

    def __init__(
        self,
        addresses: Sequence[str] | str,
        *,
        timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        max_message_bytes: int | None = None,
    ) -> None:
        """`max_message_bytes`: None takes the kind's (its servers' own bound)."""
        kind = self.KIND
        self._servers = ServerSet(
            kind, addresses, type(self).STUB, timeout_s=timeout_s, reconnect_backoff_max_s=reconnect_backoff_max_s,
            max_message_bytes=kind.max_message_bytes if max_message_bytes is None else max_message_bytes,
        )  # fmt: skip

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._servers.addresses

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._servers.close()


class HeartbeatSender(Generic[R]):
    """Base of what keeps one process registered with every server of a set (registrars, announcers).

    `registration()` is called for every send, so what is sent is always the process's current
    state; `_stamped()` stamps it with this sender's `instance_id` and the next sequence. Failures
    are logged once per change of a server's error, and its recovery once. Call from one event loop.
    """

    def __init__(
        self,
        kind: ServerKind,
        registration: Callable[[], R],
        *,
        heartbeat_interval_s: float,
        unregister_on_stop: bool,
    ) -> None:
        if heartbeat_interval_s <= 0:
            raise ConfigError(f"heartbeat_interval_s must be positive, got {heartbeat_interval_s}")
        self._kind = kind
        self._registration = registration
        self._interval_s = heartbeat_interval_s
        self._unregister_on_stop = unregister_on_stop
        self._instance_id = uuid.uuid4().hex
        self._sequence = 0
        self._failing: dict[str, str] = {}  # server address -> last error, while failing

    @property
    def instance_id(self) -> str:
        return self._instance_id

    async def _every_interval(self, stop: asyncio.Event, beat: Callable[[], Awaitable[object]]) -> None:
        """`beat()` now and then `heartbeat_interval_s` after each return, until `stop`."""
        while not stop.is_set():
            await beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)

    def _stamped(self) -> R:
        # No await between taking the sequence and reading the state: a higher sequence is always
        # a later snapshot.
        sequence = self._next_sequence()
        return dataclasses.replace(self._registration(), instance_id=self._instance_id, sequence=sequence)

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def _note_all(self, outcomes: Outcomes, **context: str) -> None:
        for address, exc in outcomes.items():
            self._note(address, exc, **context)

    def _note(self, address: str, exc: Outcome, **context: str) -> None:
        """Log a server's failure when its error changes, and its recovery; `context` names the sender."""
        name, key = self._kind.name.lower(), self._kind.log_key
        if exc is None:
            if self._failing.pop(address, None) is not None:
                self._kind.log.info(f"{name} accepts registrations again", extra=kv(**{key: address}))
            return
        if self._failing.get(address) != str(exc):
            self._failing[address] = str(exc)
            self._kind.log.warning(
                f"registration with {name} failed; retrying at the next heartbeat",
                extra=kv(**{key: address, **context, "error": exc}),
            )
