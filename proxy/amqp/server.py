"""`Gateway`: the AMQP 0-9-1 server of a proxy (docs/amqp.md), over the proxy's brokers.

It owns the metadata cache (proxy/amqp/metastore.py), the queue store (proxy/amqp/queues.py)
and the connections; `serve` listens until `stop`, then closes every connection (their unacked
deliveries go back to their queues).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable

from broker.client.amqpmeta import AmqpMetaApi
from broker.client.api import (
    BrokerApi,
    CallContext,
    ConnectedClient,
    PopRequest,
    SendResult,
    StoredMessage,
)
from common import metrics
from common.errors import Forbidden, NotFound, SluiceError, Unavailable, Unsupported
from common.logs import kv
from common.security import Action, ResourceKind, SecurityDoc
from proxy.amqp import topology
from proxy.amqp.access import Authorize
from proxy.amqp.bridge import PopAnywhere, Routes, Send, TopicBridge
from proxy.amqp.codes import AmqpError
from proxy.amqp.connection import Connection
from proxy.amqp.deadletter import DeadLetters
from proxy.amqp.expiry import QueueExpiry
from proxy.amqp.janitor import Janitor
from proxy.amqp.meta import AMQP_CLIENT_TYPE, QueueMeta
from proxy.amqp.metastore import MetaStore
from proxy.amqp.queues import Publish, QueueStore
from proxy.config import AmqpConfig, ClientSettingsConfig
from proxy.directory import BrokerRoute

log = logging.getLogger("sluice.proxy.amqp")


def _refuse(user: str, namespace: str, kind: ResourceKind, name: str, action: Action) -> None:
    raise Forbidden(f"no access rules are known to this gateway ({user}, {kind.value} {name})")


async def _no_send(ctx: CallContext, items: list[tuple[str, bytes]]) -> list[SendResult | SluiceError]:
    return [Unsupported("this gateway has no producer for RocketMQ topics")] * len(items)


async def _no_routes(topic: str) -> list[BrokerRoute]:
    raise NotFound(f"this gateway cannot look up topic {topic}")


async def _no_pops(brokers: list[str], request: PopRequest, ctx: CallContext) -> list[StoredMessage]:
    return []


class Gateway:
    def __init__(
        self,
        config: AmqpConfig,
        *,
        broker: Callable[[str], BrokerApi],
        broker_names: Callable[[], list[str]],
        security: Callable[[], SecurityDoc | None],
        auth_required: bool = False,
        send: Send | None = None,
        routes: Routes | None = None,
        pop_anywhere: PopAnywhere | None = None,
        authorize: Authorize | None = None,
        client_report_s: float = 5.0,
        max_topic_body_bytes: int = ClientSettingsConfig.max_body_bytes,
        max_lite_chars: int = ClientSettingsConfig.max_lite_topic_chars,
    ) -> None:
        """`send`, `routes` and `pop_anywhere`: the proxy's producer, routes and receive across
        brokers, for exchanges mapped to RocketMQ topics (proxy/amqp/bridge.py);
        `max_topic_body_bytes` the largest body those topics take (what RocketMQ clients receive),
        `max_lite_chars` the longest lite topic name."""
        self.config = config
        self._broker = broker
        self._broker_names = broker_names
        self.security = security
        self.auth_required = auth_required  # only the security document's users, no guest; their rules apply
        self.authorize: Authorize = authorize or _refuse
        self._home_api: AmqpMetaApi | None = None  # the last home broker `_home` checked
        self.meta = MetaStore(self._home, refresh_ms=config.meta_refresh_ms)
        self.store = QueueStore(broker, lease_ms=config.delivery_lease_ms, call_timeout_s=config.call_timeout_s,
                                exists=self._queue_exists)  # fmt: skip
        self.dead = DeadLetters(self.meta, self.store, topic_copy=self._store_in_topic)
        self.expiry = QueueExpiry(self.meta, self.consumer_count, self._queue_removed)
        self.bridge = TopicBridge(self.meta, self.store, self.dead, send=send or _no_send, routes=routes or _no_routes,
                                  broker=broker, pop_anywhere=pop_anywhere or _no_pops,
                                  call_timeout_s=config.call_timeout_s,
                                  max_body_bytes=max_topic_body_bytes, max_lite_chars=max_lite_chars)  # fmt: skip
        self.connections: dict[str, Connection] = {}
        self.janitor = Janitor(self.meta, broker=broker, broker_names=broker_names, local=self.connections.__contains__,
                               delete_queue=self.delete_queue, interval_s=2 * client_report_s)  # fmt: skip
        self._consumers: Counter[tuple[str, int]] = Counter()  # (vhost, queue number) -> consumers here
        self._ids = itertools.count(1)
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.address = ""
        self._prefix = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}-"  # unique across proxies

    async def _store_in_topic(self, vhost: str, topic: str, publishes: list[Publish], host: str) -> list[bool]:
        """Dead letters' copies for a mapped exchange's topic go through the topic bridge (which is
        built after the dead letters it screens with)."""
        return [err is None for err in await self.bridge.publish(vhost, topic, publishes, host)]

    def _home(self) -> tuple[str, AmqpMetaApi]:
        """The metadata home broker (the first by name). Asked before every publish batch: the
        isinstance test against the runtime-checkable protocol is made once per broker object."""
        names = self._broker_names()
        if not names:
            raise Unavailable("no broker is known yet to hold the AMQP metadata")
        name = min(names)
        api = self._broker(name)
        cached = self._home_api
        if cached is not None and api is cached:
            return name, cached
        if not isinstance(api, AmqpMetaApi):
            raise Unsupported(f"broker {name} keeps no AMQP metadata")
        self._home_api = api
        return name, api

    # -- consumers and queues ------------------------------------------------------------------------

    async def _queue_exists(self, queue: QueueMeta) -> bool:
        """The newest metadata has a queue of this number (in any vhost)."""
        await self.meta.refresh()
        return any(q.id == queue.id for v in self.meta.doc.vhosts.values() for q in v.queues.values())

    def consumer_count(self, vhost: str, queue: QueueMeta) -> int:
        return self._consumers[(vhost, queue.id)]

    def consumer_added(self, vhost: str, queue: QueueMeta) -> None:
        self._consumers[(vhost, queue.id)] += 1

    def consumer_removed(self, vhost: str, queue: QueueMeta) -> None:
        key = (vhost, queue.id)
        self._consumers[key] -= 1
        if self._consumers[key] <= 0:
            del self._consumers[key]

    async def consumer_gone(self, vhost: str, queue: QueueMeta, owner: str) -> None:
        """A consumer cancelled or closed: an auto-delete queue goes with its last consumer."""
        self.consumer_removed(vhost, queue)
        if queue.auto_delete and not self.consumer_count(vhost, queue):
            try:
                await self.delete_queue(vhost, queue, queue.exclusive_owner or owner)
            except (SluiceError, AmqpError) as exc:
                log.warning("could not delete an auto-delete queue after its last consumer",
                            extra=kv(vhost=vhost, queue=queue.name, error=str(exc)))  # fmt: skip

    async def delete_queue(self, vhost: str, queue: QueueMeta, owner: str) -> None:
        removed = await self.meta.change(lambda doc: topology.delete_queue(doc, vhost, queue.name, owner))
        if removed is None or removed.id != queue.id:
            return
        await self._queue_removed(vhost, removed)

    async def _queue_removed(self, vhost: str, queue: QueueMeta) -> None:
        """After its metadata entry: drop the queue's group and topic, tell its consumers."""
        await self.store.delete(queue)
        for conn in list(self.connections.values()):
            conn.queue_deleted(vhost, queue.name)
        log.info("AMQP queue deleted", extra=kv(vhost=vhost, queue=queue.name))

    def metric_samples(self) -> list[metrics.Sample]:
        """The `sluice_amqp_queue_*` samples of every queue in the metadata."""
        return self.store.metrics.samples(self.meta.doc, self.consumer_count, self.store.depth)

    def connected_clients(self, proxy: str) -> list[ConnectedClient]:
        """The open connections as `client list` and `sluice admin amqp connections|channels` show
        them (reported to the brokers with the RocketMQ clients, proxy/core/clientreport.py)."""
        now_ms = int(time.time() * 1000)
        return [
            ConnectedClient(c.id, c.client[0], c.client[1], AMQP_CLIENT_TYPE, c.peer, proxy, "", (), now_ms,
                            json.dumps({"vhost": c.vhost, "user": c.user, "opened_ms": c.opened_ms,
                                        "channels": [ch.describe() for ch in list(c.channels.values())]}))
            for c in list(self.connections.values()) if c.user
        ]  # fmt: skip

    def connection_gone(self, conn: Connection) -> None:
        self.connections.pop(conn.id, None)

    # -- serving ----------------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer, f"{self._prefix}{next(self._ids)}")
        self.connections[conn.id] = conn
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await conn.serve()
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def start(self, host: str, *, reuse_port: bool = False) -> str:
        """Listen; the address. Unavailable when the port cannot be had."""
        try:
            self._server = await asyncio.start_server(self._client, host, self.config.port,
                                                      reuse_port=reuse_port or None)  # fmt: skip
        except OSError as exc:
            raise Unavailable(f"AMQP cannot listen on {host}:{self.config.port}: {exc.strerror or exc} "
                              "(is the port in use? --amqp-port -1 turns AMQP off)") from None  # fmt: skip
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{host}:{port}"
        log.info("AMQP listening", extra=kv(address=self.address))
        return self.address

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop`; then close every connection (each requeues its unacked deliveries)."""
        assert self._server is not None, "start() first"
        meta_stop = asyncio.Event()
        refresher = asyncio.create_task(self.meta.run(meta_stop), name="amqp-metadata")
        sweeper = asyncio.create_task(self.expiry.run(meta_stop), name="amqp-queue-expiry")
        bridge = asyncio.create_task(self.bridge.run(meta_stop), name="amqp-topic-bridge")
        janitor = asyncio.create_task(self.janitor.run(meta_stop), name="amqp-janitor")
        unregister = metrics.register_source(self.metric_samples)
        try:
            await stop.wait()
        finally:
            self._server.close()
            for conn in list(self.connections.values()):
                try:
                    conn.shut_down()
                except Exception:  # one connection's trouble must not keep the others open
                    log.exception("closing an AMQP connection at shutdown failed")
            if self._handlers:
                await asyncio.wait(list(self._handlers), timeout=2 * self.config.call_timeout_s)
            unregister()
            await self.store.metrics.close()
            meta_stop.set()
            await refresher
            await sweeper
            await bridge
            await janitor
            log.info("AMQP stopped", extra=kv(address=self.address))
