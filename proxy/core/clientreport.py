"""Reporting this proxy's connected clients to the brokers (`sluice admin client list`).

Every `interval_s` the proxy sends its whole session list to every broker it knows, and at once
when a session ends (`wake`: a client's NotifyClientTermination, or expiry); a broker keeps the
last report of each proxy for three intervals (broker/clients.py). The admin tool and the web
console ask the brokers, so the list is the same whether proxies run in the broker's process
(merged), as their own processes, or as several workers sharing a port (each reports itself).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from broker.client.api import ConnectedClient, ReportsApi
from common.logs import kv
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proxy.core.sessions import ClientSession, SessionRegistry
from proxy.directory import BrokerDirectory

log = logging.getLogger("sluice.proxy")

REPORT_TTL_INTERVALS = 3


def _client_type(value: int) -> str:
    try:
        return pb.ClientType.Name(value).removeprefix("CLIENT_TYPE_") if value else ""
    except ValueError:
        return str(value)


def _address(peer: str) -> str:
    """`ipv4:127.0.0.1:5000` / `ipv6:[::1]:5000` as gRPC gives it, without the scheme."""
    return peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer


def connected_clients(sessions: SessionRegistry, proxy: str) -> list[ConnectedClient]:
    """The sessions as the brokers keep them: last activity as epoch ms."""
    now_wall, now_mono = time.time(), time.monotonic()

    def client(s: ClientSession) -> ConnectedClient:
        seen_ms = int((now_wall - (now_mono - s.last_seen)) * 1000)
        return ConnectedClient(s.client_id, s.language, s.version, _client_type(s.client_type), _address(s.address),
                               proxy, s.group, tuple(sorted(s.topics)), seen_ms)  # fmt: skip

    return [client(s) for s in list(sessions.sessions.values())]


class ClientReporter:
    def __init__(self, directory: BrokerDirectory, sessions: SessionRegistry, proxy: str, interval_s: float) -> None:
        self._dir = directory
        self._sessions = sessions
        self._proxy = proxy
        self._key = f"{proxy}/{os.getpid()}"  # workers share the address: each reports its own sessions
        self._interval_s = interval_s
        self._failing: set[str] = set()
        self._wake = asyncio.Event()
        self._sources: list[Callable[[str], list[ConnectedClient]]] = []  # other protocols' connections

    def add_source(self, source: Callable[[str], list[ConnectedClient]]) -> None:
        """Report what `source(proxy)` lists too (the AMQP gateway's connections)."""
        self._sources.append(source)

    def wake(self) -> None:
        """Report now (a session ended), not at the next interval."""
        self._wake.set()

    async def report_once(self) -> None:
        clients = connected_clients(self._sessions, self._proxy)
        for source in self._sources:
            clients += source(self._proxy)
        ttl_ms = int(self._interval_s * REPORT_TTL_INTERVALS * 1000)
        for name in self._dir.broker_names():
            try:
                api: ReportsApi = self._dir.broker(name)
                await api.report_clients(self._key, clients, ttl_ms)
            except Exception as exc:  # a broker down: the others still know the clients
                if name not in self._failing:
                    log.warning("could not report clients to a broker", extra=kv(broker=name, error=str(exc)))
                self._failing.add(name)
            else:
                self._failing.discard(name)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            await self.report_once()
            stopping = asyncio.ensure_future(stop.wait())
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((stopping, woken), timeout=self._interval_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                woken.cancel()
