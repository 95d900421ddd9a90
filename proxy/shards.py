"""A merged node among several (`sluice up --shards N`, `sluice node`; docs/shards.md).

The node's proxy holds its own broker in-process and reaches the other nodes' brokers over their
internal gRPC service, found through the NameServer as a separate proxy finds brokers. Every
broker of a node registers the node's client endpoint, so a route names, for each broker's
queues, the endpoint of the node that owns them: the official clients send each send, receive and
ack to the endpoints of the queue concerned, so those calls land where the data is. A call that
reaches a node that does not own its queue (an old route, a FIFO group the client hashed to
another node, a lite subscription, an ack after a restart) is passed on to the owner over the
internal service (`ForwardedBroker`) and counted (`sluice_proxy_forwarded_calls_total`). A receive
that finds nothing for its group on the node's own broker is served by another node's broker that
has messages (proxy/core/gather.py): those pops are a hop by design and counted as `pop_elsewhere`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from broker.client.api import (
    NO_CONTEXT,
    AckResult,
    CallContext,
    PopRequest,
    SendResult,
    StoredMessage,
    TopicSpec,
    TransactionResolution,
    TransactionSource,
)
from broker.client.remote import RemoteBroker
from common import metrics
from common.errors import SluiceError, TopicNotFound, Unavailable
from proxy.config import CacheConfig
from proxy.core import gather
from proxy.directory import BrokerApi, BrokerRoute, ClusterDirectory, InProcessBroker


class ForwardedBroker(RemoteBroker):
    """Another node's broker: its data-plane calls are forwarded calls, and counted as such."""

    async def send(
        self, topic: str, queue_id: int, records: Sequence[bytes], *, ctx: CallContext = NO_CONTEXT
    ) -> list[SendResult]:
        metrics.count_forwarded("send")
        return await super().send(topic, queue_id, records, ctx=ctx)

    async def pop(self, request: PopRequest, *, ctx: CallContext = NO_CONTEXT) -> list[StoredMessage]:
        # A pop the receive's gathering made of this broker although the client named another one
        # (proxy/core/gather.py) is balancing, counted apart from calls that reached the wrong node.
        metrics.count_forwarded("pop_elsewhere" if gather.ELSEWHERE.get() else "pop")
        return await super().pop(request, ctx=ctx)

    async def ack(
        self, group: str, topic: str, receipt_handles: list[str], *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        metrics.count_forwarded("ack")
        return await super().ack(group, topic, receipt_handles, ctx=ctx)

    async def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> str:
        metrics.count_forwarded("change_invisible_duration")
        return await super().change_invisible_duration(group, topic, receipt_handle, invisible_ms, ctx=ctx)

    async def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        metrics.count_forwarded("forward_to_dead_letter")
        await super().forward_to_dead_letter(group, topic, receipt_handle, ctx=ctx)

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource, *, ctx: CallContext = NO_CONTEXT,
    ) -> None:  # fmt: skip
        metrics.count_forwarded("end_transaction")
        await super().end_transaction(topic, message_id, transaction_id, resolution, source, ctx=ctx)

    async def recall(self, topic: str, recall_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        metrics.count_forwarded("recall")
        return await super().recall(topic, recall_handle, ctx=ctx)


# A node that did not answer a topic creation is not asked again for this long (per node).
CREATE_RETRY_S = 5.0
_NONE_CREATED: dict[str, BrokerRoute] = {}  # never changed: `_create_on` copies before adding
_NO_ROUTES: list[BrokerRoute] = []  # never changed: the same object while no NameServer knows a topic


def _route(name: str, spec: TopicSpec, endpoint: str) -> BrokerRoute:
    return BrokerRoute(name, spec.queue_count, spec.permission, spec.message_types, endpoint)


class ShardDirectory:
    """Own broker in-process, the other nodes' brokers through `cluster` (a ClusterDirectory made
    with `remote=ForwardedBroker`, started by the caller). Routes give every broker's queues its
    node's client endpoint; a broker of the cluster that runs without a proxy of its own gets ""
    (this node's endpoints, and its calls are forwarded).

    With `auto_create`, a topic routed here for the first time is created on this node's broker
    and on every other node's (a get_topic with auto_create), so a topic created on first use
    exists on every shard; until the NameServer's route lists those copies, the created ones are
    kept here. A node that does not answer is left out of the route until it does.
    """

    def __init__(
        self,
        local: InProcessBroker,
        endpoint: str,
        cluster: ClusterDirectory,
        *,
        auto_create: bool,
        topics_max: int = CacheConfig.topics_max,
    ) -> None:
        self._local = local
        self._endpoint = endpoint
        self._cluster = cluster
        self._auto_create = auto_create
        self._topics_max = topics_max
        self._created: dict[str, dict[str, BrokerRoute]] = {}  # topic -> peer -> route created there
        self._unanswered: dict[str, float] = {}  # peer -> when it last failed a creation
        # topic -> (what it was built from, the route): the same list object while nothing changed,
        # so queue selectors rebuild their queue lists only on a change.
        self._routes: dict[str, tuple[tuple[object, ...], list[BrokerRoute]]] = {}

    @property
    def home(self) -> str:
        return self._local.name

    async def route(self, topic: str) -> list[BrokerRoute]:
        try:
            spec: TopicSpec | None = await self._local.ensure_topic(topic)
        except TopicNotFound:
            spec = None  # not here (created without auto-create elsewhere): the other nodes may hold it
        try:
            remote: list[BrokerRoute] = await self._cluster.route(topic)
        except (TopicNotFound, Unavailable):
            remote = _NO_ROUTES  # unknown to the NameServer, or it is unreachable: this node's copy serves
        endpoints = self._cluster.client_endpoints()
        listed = {r.broker for r in remote}
        created = self._created.get(topic, _NONE_CREATED)
        if self._auto_create and spec is not None:
            for peer in endpoints:
                if peer != self.home and peer not in listed and peer not in created:
                    created = await self._create_on(topic, peer)
        key = (spec, remote, endpoints, created)
        cached = self._routes.get(topic)
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1]
        routes = [] if spec is None else [_route(self.home, spec, self._endpoint)]
        for r in remote:
            if r.broker != self.home:
                routes.append(BrokerRoute(r.broker, r.queue_count, r.permission, r.message_types,
                                          endpoints.get(r.broker, "")))  # fmt: skip
        routes += [r for peer, r in created.items() if peer not in listed and peer in endpoints]  # gone: left out
        if not routes:
            raise TopicNotFound(f"topic {topic} does not exist")
        if len(self._routes) >= self._topics_max:
            self._routes.clear()
            self._created.clear()
        self._routes[topic] = (key, routes)
        return routes

    async def _create_on(self, topic: str, peer: str) -> dict[str, BrokerRoute]:
        """The topic's routes created on other nodes, with `peer` added if it answers (a node that
        does not is asked again after CREATE_RETRY_S: sends meanwhile go to the nodes that do)."""
        created = self._created.get(topic, _NONE_CREATED)
        failed_at = self._unanswered.get(peer)
        if failed_at is not None and time.monotonic() - failed_at < CREATE_RETRY_S:
            return created
        try:
            spec = await self._cluster.broker(peer).get_topic(topic, auto_create=True)
        except SluiceError:
            self._unanswered[peer] = time.monotonic()
            return created
        self._unanswered.pop(peer, None)
        created = self._created[topic] = {
            **created,
            peer: _route(peer, spec, self._cluster.client_endpoints().get(peer, "")),
        }
        return created

    def broker(self, name: str) -> BrokerApi:
        return self._local if name == self.home else self._cluster.broker(name)

    async def lookup(self, name: str) -> BrokerApi | None:
        return self._local if name == self.home else await self._cluster.lookup(name)

    async def moved(self, name: str) -> BrokerApi | None:
        return None if name == self.home else await self._cluster.moved(name)

    def broker_names(self) -> list[str]:
        return sorted({self.home, *self._cluster.broker_names()})

    async def close(self) -> None:
        await self._cluster.close()
