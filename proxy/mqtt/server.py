"""`Gateway`: the MQTT server of a proxy (docs/mqtt.md): its listeners (TCP, TLS where the proxy
has a certificate, WebSocket), its connections, and the background work every proxy does for MQTT:
keep alive and CONNECT timeouts, lease renewal of deliveries, takeovers from other proxies, the
janitor of sessions, `$SYS` topics, and filters whose first level is a wildcard meeting new bind
topics. `run` serves until `stop`, then ends every connection with DISCONNECT 0x8B (server shutting
down) and waits for their sessions to be detached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, cast

from broker.client.api import ConnectedClient
from common import metrics
from common.errors import SluiceError, Unavailable
from common.logs import kv
from common.security import SecurityDoc
from proxy.config import MqttConfig, TlsConfig
from proxy.directory import BrokerDirectory
from proxy.mqtt import codes as C
from proxy.mqtt.binds import BindTopics
from proxy.mqtt.connection import Connection, Transport
from proxy.mqtt.inbound import Inbound
from proxy.mqtt.janitor import Janitor
from proxy.mqtt.services import Authorize, Send, Services
from proxy.mqtt.sessions import SessionManager
from proxy.mqtt.statestore import StateStore
from proxy.mqtt.subscribing import SubscribeHandler
from proxy.mqtt.sys import SysTopics
from proxy.mqtt.topics import TopicMap

log = logging.getLogger("sluice.proxy.mqtt")

MQTT_CLIENT_TYPE = "MQTT"
SWEEP_S = 1.0  # keep alive and CONNECT timeouts are checked this often
KEEP_ALIVE_GRACE = 1.5  # a client silent for this many keep alive intervals is disconnected
SHUTDOWN_GRACE_S = 3.0  # at stop, how long the sessions' ends (releases, records) are waited for


class _Tcp(asyncio.Protocol):
    """A TCP (or TLS) connection's bytes to its `Connection`."""

    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway
        self._conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._conn = self._gw.accept(cast(asyncio.Transport, transport), address, websocket=False)  # uvloop's too

    def data_received(self, data: bytes) -> None:
        if self._conn is not None:
            self._conn.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._conn.lost()


class Gateway:
    def __init__(
        self, config: MqttConfig, *, directory: BrokerDirectory, broker_names: Callable[[], list[str]], send: Send,
        security: Callable[[], SecurityDoc | None], auth_required: bool, authorize: Authorize | None,
        advertised: str, tls: TlsConfig, max_lite_chars: int,
    ) -> None:  # fmt: skip
        proxy_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.svc = Services(
            config=config, directory=directory,
            state=StateStore(directory, config.call_timeout_s, broker_names),
            topics=TopicMap(config.bind_topics, max_lite_chars),
            binds=BindTopics(directory, broker_names, queues=1, create=config.create_bind_topics), send=send,
            proxy_id=proxy_id, host=advertised,
            security=security, auth_required=auth_required, authorize=authorize if auth_required else None,
        )  # fmt: skip
        self._tls = tls
        self.inbound = Inbound(self.svc)
        self.subscriptions = SubscribeHandler(self)
        self.sessions = SessionManager(self)
        self.janitor = Janitor(self.sessions, config.janitor_interval_s)
        self.sys = SysTopics(self)
        self.connections: dict[int, Connection] = {}
        self._ids = 0
        self._closing: dict[int, asyncio.Task[None]] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._ws_runner: Any = None
        self._known_binds: dict[str, set[str]] = {}
        self.address = ""
        self.ws_address = ""

    # -- connections -----------------------------------------------------------------------------

    def accept(self, transport: Transport, peer: str, *, websocket: bool) -> Connection:
        self._ids += 1
        conn = Connection(self, transport, peer, self._ids, websocket=websocket)
        self.connections[conn.id] = conn
        return conn

    def connection_lost(self, conn: Connection, *, will: bool) -> None:
        self.connections.pop(conn.id, None)
        if conn.session is None:
            return
        task = self.svc.spawn(self.sessions.closed(conn, will=will, kicked=conn.kicked))
        self._closing[conn.id] = task
        task.add_done_callback(lambda _t: self._closing.pop(conn.id, None))

    async def wait_detached(self, conn: Connection) -> None:
        task = self._closing.get(conn.id)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def connected_clients(self, proxy: str) -> list[ConnectedClient]:
        """The open MQTT sessions as `client list` and `sluice admin mqtt clients` show them
        (reported to the brokers with the RocketMQ clients, proxy/core/clientreport.py)."""
        now_ms = int(time.time() * 1000)
        out = []
        for (namespace, client_id), conn in list(self.sessions.connections.items()):
            session = conn.session
            if session is None:
                continue
            detail = {"namespace": namespace, "user": conn.username, "proxy_id": self.svc.proxy_id,
                      "keep_alive_s": conn.keep_alive, "session_expiry_s": session.record.expiry_s,
                      "inflight": len(session.inflight), "subscriptions": sorted(session.subs.by_text),
                      "websocket": conn.websocket, "tls": self._tls.enabled}  # fmt: skip
            version = "5.0" if conn.version == 5 else "3.1.1"
            last = now_ms - int((time.monotonic() - conn.last_rx) * 1000)
            out.append(ConnectedClient(client_id, "MQTT", version, MQTT_CLIENT_TYPE, conn.peer, proxy,
                                       session.subs.group, (), last, json.dumps(detail)))  # fmt: skip
        return out

    def metric_samples(self) -> list[metrics.Sample]:
        stats = self.svc.stats
        counts: dict[tuple[str, str], int] = {}
        subs = inflight = 0
        for conn in list(self.connections.values()):
            if not conn.connected:
                continue
            key = ("5.0" if conn.version == 5 else "3.1.1", "websocket" if conn.websocket else "tcp")
            counts[key] = counts.get(key, 0) + 1
            if conn.session is not None:
                subs += len(conn.session.subs)
                inflight += len(conn.session.inflight)
        out: list[metrics.Sample] = [(metrics.MQTT_CONNECTIONS, key, float(n)) for key, n in counts.items()]
        out += [
            (metrics.MQTT_SUBSCRIPTIONS, (), float(subs)), (metrics.MQTT_INFLIGHT, (), float(inflight)),
            (metrics.MQTT_MESSAGES, ("in",), float(stats.messages_received)),
            (metrics.MQTT_MESSAGES, ("out",), float(stats.messages_sent)),
            (metrics.MQTT_BYTES, ("in",), float(stats.bytes_received)),
            (metrics.MQTT_BYTES, ("out",), float(stats.bytes_sent)),
            (metrics.MQTT_CONNECTS, (), float(stats.connects)),
        ]  # fmt: skip
        out += [(metrics.MQTT_REFUSED, (reason,), float(n)) for reason, n in stats.refused.items()]
        return out

    # -- listening -------------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext | None:
        if not self._tls.enabled:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._tls.cert_file, self._tls.key_file)
        return context

    async def start(self, host: str, *, reuse_port: bool = False) -> None:
        """Listen on the MQTT port and the WebSocket port (each -1: not); Unavailable when taken."""
        cfg = self.svc.config
        context = self._ssl()
        shared = reuse_port or cfg.shared_port or None
        loop = asyncio.get_running_loop()
        if cfg.port >= 0:
            try:
                server = await loop.create_server(lambda: _Tcp(self), host, cfg.port, ssl=context, reuse_port=shared)
            except OSError as exc:
                raise Unavailable(f"MQTT cannot listen on {host}:{cfg.port}: {exc.strerror or exc} (is the port in "
                                  "use? --mqtt-port -1 turns MQTT off)") from None  # fmt: skip
            self._servers.append(server)
            self.address = f"{host}:{server.sockets[0].getsockname()[1]}"
            log.info("MQTT listening", extra=kv(address=self.address, tls=context is not None))
        if cfg.ws_port >= 0:
            from proxy.mqtt.websocket import serve_websocket

            self._ws_runner, port = await serve_websocket(self, host, cfg.ws_port, context, bool(shared))
            self.ws_address = f"{host}:{port}"
            log.info("MQTT over WebSocket listening", extra=kv(address=self.ws_address, tls=context is not None))

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop`; then close every connection and wait for their sessions."""
        try:  # before the first round: sessions may connect through this proxy from now on
            await self.janitor.heartbeat()
        except SluiceError as exc:
            log.warning("MQTT heartbeat not written", extra=kv(error=exc.message))
        inner = asyncio.Event()
        loops = [
            self.svc.spawn(self._every(SWEEP_S, self._sweep, inner)),
            self.svc.spawn(self._every(self.svc.config.delivery_lease_ms / 3000.0, self._renew, inner)),
            self.svc.spawn(self._every(self.svc.config.kick_poll_ms / 1000.0, self.sessions.poll_kicks, inner)),
            self.svc.spawn(self._every(self.svc.config.janitor_interval_s, self.janitor.round, inner)),
            self.svc.spawn(self._every(self.svc.config.bind_topics_refresh_ms / 1000.0, self._wild_binds, inner)),
            self.svc.spawn(self.sys.run(inner)),
        ]
        unregister = metrics.register_source(self.metric_samples)
        try:
            await stop.wait()
        finally:
            inner.set()
            for server in self._servers:
                server.close()
            for conn in list(self.connections.values()):
                conn.server_disconnect(C.SERVER_SHUTTING_DOWN, "the server is shutting down")
            if self._closing:
                await asyncio.wait(list(self._closing.values()), timeout=SHUTDOWN_GRACE_S)
            for task in loops:
                task.cancel()
            for task in list(self.svc.tasks):
                task.cancel()
            if self._ws_runner is not None:
                await self._ws_runner.cleanup()
            unregister()
            log.info("MQTT stopped", extra=kv(address=self.address))

    async def _every(self, interval_s: float, work: Callable[[], Any], stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            if stop.is_set():
                return
            try:
                result = work()
                if asyncio.iscoroutine(result):
                    await result
            except SluiceError as exc:
                log.debug("MQTT background work failed", extra=kv(error=exc.message))
            except Exception:
                log.exception("MQTT background work failed")

    def _sweep(self) -> None:
        now = time.monotonic()
        timeout = self.svc.config.connect_timeout_s
        for conn in list(self.connections.values()):
            if not conn.connected:
                if not conn.connect_seen and now - conn.opened > timeout and not conn.closed:
                    log.info("MQTT connection closed: no CONNECT", extra=kv(peer=conn.peer))
                    conn.close(will=False)
            elif conn.keep_alive and now - conn.last_rx > KEEP_ALIVE_GRACE * conn.keep_alive:
                conn.server_disconnect(C.KEEP_ALIVE_TIMEOUT, f"nothing received for {KEEP_ALIVE_GRACE} times the "
                                       f"keep alive of {conn.keep_alive} s")  # fmt: skip

    async def _renew(self) -> None:
        third = self.svc.config.delivery_lease_ms / 3000.0
        for conn in list(self.sessions.connections.values()):
            if conn.session is not None and conn.session.inflight:
                await conn.session.renew(third)

    async def _wild_binds(self) -> None:
        """Bind topics new to a namespace whose connected sessions have wildcard-first filters."""
        wanting: dict[str, list[Connection]] = {}
        for conn in list(self.sessions.connections.values()):
            session = conn.session
            if session is not None and any(s.filter.wild_first and not s.local for s in session.subs):
                wanting.setdefault(conn.namespace, []).append(conn)
        for namespace, conns in wanting.items():
            binds = set(await self.svc.binds.all_binds(namespace, 0))
            known = self._known_binds.setdefault(namespace, set())
            new = binds - known  # at first all (sessions have loops in most: starting those is a no-op)
            if new:
                for conn in conns:
                    if conn.session is not None:
                        for bind in sorted(new):
                            await conn.session.add_wild_bind(bind)
            known |= binds
