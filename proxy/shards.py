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

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from broker.client.api import (
    NO_CONTEXT,
    AckResult,
    CallContext,
    MessagingApi,
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
from common.logs import kv
from common.model import UNDECIDED_TYPES, MessageType, auto_types
from proxy import firstuse
from proxy.config import CacheConfig
from proxy.core import gather
from proxy.directory import BrokerApi, BrokerRoute, ClusterDirectory, InProcessBroker, Silent


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


log = logging.getLogger("sluice.proxy.shards")

# A node that did not answer a topic creation is not asked again for this long (per node).
CREATE_RETRY_S = 5.0
_NONE_CREATED: dict[str, BrokerRoute] = {}  # never changed: `_create_on` copies before adding
_NO_ROUTES: list[BrokerRoute] = []  # never changed: the same object while no NameServer knows a topic


def _route(name: str, spec: TopicSpec, endpoint: str) -> BrokerRoute:
    return BrokerRoute(name, spec.queue_count, spec.permission, spec.message_types, endpoint)


def _same_definition(copy: TopicSpec, definition: TopicSpec) -> bool:
    """Whether a node's copy is the first-use `definition` (whose types a first message may have
    decided since, on that copy or through `decide`)."""
    return replace(copy, message_types=definition.message_types) == definition and (
        copy.message_types == definition.message_types or definition.message_types == UNDECIDED_TYPES
    )


class ShardDirectory:
    """Own broker in-process, the other nodes' brokers through `cluster` (a ClusterDirectory made
    with `remote=ForwardedBroker`, started by the caller). Routes give every broker's queues its
    node's client endpoint; a broker of the cluster that runs without a proxy of its own gets ""
    (this node's endpoints, and its calls are forwarded).

    A topic's definition is the cluster's (proxy/firstuse.py): a topic this node's broker or the
    NameServer knows is routed as it is, never created anywhere. With `auto_create`, a topic no
    node holds is created on every node: the first node by name that creates topics on first use
    decides its definition and the others copy it; until the NameServer's route lists those
    copies, they are kept here, and a node that did not answer is asked again (after
    CREATE_RETRY_S) while this directory remembers the definition. The types its first message
    decides are decided once the same way (`decide`).
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
        # topic -> node -> its copy, created or found on first use, until the NameServer lists it
        self._unlisted: dict[str, dict[str, BrokerRoute]] = {}
        # topic -> the definition this directory created on first use, while a node lacks its copy
        self._defined: dict[str, TopicSpec] = {}
        self._unanswered: dict[str, float] = {}  # peer -> when it last failed a creation or decision
        # topic -> (what it was built from, the route): the same list object while nothing changed,
        # so queue selectors rebuild their queue lists only on a change.
        self._routes: dict[str, tuple[tuple[object, ...], list[BrokerRoute]]] = {}

    @property
    def home(self) -> str:
        return self._local.name

    def on_silent(self, callback: Silent) -> None:
        self._cluster.on_silent(callback)

    async def route(self, topic: str) -> list[BrokerRoute]:
        spec = self._local.held_topic(topic)
        answered = True  # whether the NameServer said what it knows of the topic
        try:
            remote: list[BrokerRoute] = await self._cluster.route(topic)
        except TopicNotFound:
            remote = _NO_ROUTES
        except Unavailable:
            remote, answered = _NO_ROUTES, False  # this node's copy (if any) serves
        endpoints = self._cluster.client_endpoints()
        unlisted = self._unlisted.get(topic, _NONE_CREATED)
        if spec is None and not remote and not unlisted:
            spec, unlisted = await self._first_use(topic, answered)
        listed = {r.broker for r in remote}
        if unlisted and listed.issuperset(unlisted):  # the NameServer lists every copy now
            del self._unlisted[topic]
            unlisted = _NONE_CREATED
        definition = self._defined.get(topic)
        if definition is not None:
            missing = [p for p in endpoints if p != self.home and p not in listed and p not in unlisted]
            for peer in missing:
                unlisted = await self._create_on(topic, peer, definition)
            if not missing:
                del self._defined[topic]  # every node has its copy
        key = (spec, remote, endpoints, unlisted)
        cached = self._routes.get(topic)
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1]
        routes = [] if spec is None else [_route(self.home, spec, self._endpoint)]
        for r in remote:
            if r.broker != self.home:
                routes.append(BrokerRoute(r.broker, r.queue_count, r.permission, r.message_types,
                                          endpoints.get(r.broker, "")))  # fmt: skip
        routes += [r for peer, r in unlisted.items() if peer not in listed and peer in endpoints]  # gone: left out
        if not routes:
            raise TopicNotFound(f"topic {topic} does not exist")
        if len(self._routes) >= self._topics_max:
            self._routes.clear()
            self._unlisted.clear()
            self._defined.clear()
        self._routes[topic] = (key, routes)
        return routes

    async def _first_use(self, topic: str, answered: bool) -> tuple[TopicSpec | None, dict[str, BrokerRoute]]:
        """A topic neither this node nor the NameServer knows: the copies other nodes hold (the
        NameServer may not list them yet), else, with auto-create, the topic created on every node
        as the first one by name that creates topics on first use defines it. This node's copy and
        the others' routes; TopicNotFound when it exists nowhere and is not created."""
        if not self._auto_create:
            raise TopicNotFound(f"topic {topic} does not exist")
        firstuse.refuse_system(topic)
        endpoints = self._cluster.client_endpoints()
        peers = {p: self._cluster.broker(p) for p in sorted(endpoints) if p != self.home}
        found, unanswered = await firstuse.held(topic, peers)
        if found:
            unlisted = self._unlisted[topic] = {p: _route(p, s, endpoints.get(p, "")) for p, s in found.items()}
            return None, unlisted
        if unanswered and not answered:
            raise Unavailable(f"topic {topic} is not created on first use now: the NameServer is unreachable "
                              f"and node(s) {', '.join(unanswered)} did not answer (one may hold it)")  # fmt: skip
        nodes: dict[str, MessagingApi] = {self.home: self._local, **{p: peers[p] for p in peers if p not in unanswered}}
        decider, definition = await firstuse.create(topic, nodes)
        if definition.message_types != UNDECIDED_TYPES:
            # Not a copy first use just made (that accepts every type until its first message): the
            # topic was created meanwhile, with `sluice admin` or by another node's first use whose
            # first message decided it. Routed as held there, never spread: its creator spreads it.
            if decider == self.home:
                return definition, _NONE_CREATED
            unlisted = self._unlisted[topic] = {decider: _route(decider, definition, endpoints.get(decider, ""))}
            return None, unlisted
        self._defined[topic] = definition
        spec: TopicSpec | None = None
        unlisted = _NONE_CREATED
        if decider == self.home:
            spec = definition
        else:
            unlisted = self._unlisted[topic] = {decider: _route(decider, definition, endpoints.get(decider, ""))}
            with contextlib.suppress(SluiceError):  # this node does not create topics on first use
                spec = await self._local.get_topic(topic, auto_create=True, like=definition)
        for peer in peers:
            if peer != decider:
                unlisted = await self._create_on(topic, peer, definition)
        return spec, unlisted

    async def _create_on(self, topic: str, peer: str, definition: TopicSpec) -> dict[str, BrokerRoute]:
        """The topic's copies on other nodes, with `peer`'s added if it answers (a node that does
        not is asked again after CREATE_RETRY_S: sends meanwhile go to the nodes that do)."""
        unlisted = self._unlisted.get(topic, _NONE_CREATED)
        if not self._answering(peer):
            return unlisted
        try:
            spec = await self._cluster.broker(peer).get_topic(topic, auto_create=True, like=definition)
        except SluiceError:
            self._unanswered[peer] = time.monotonic()
            return unlisted
        if not _same_definition(spec, definition):  # `sluice admin topic create` there meanwhile
            log.warning("a node holds another definition of a topic created on first use",
                        extra=kv(topic=topic, node=peer, queues=spec.queue_count,
                                 first_use_queues=definition.queue_count))  # fmt: skip
        unlisted = self._unlisted[topic] = {
            **unlisted,
            peer: _route(peer, spec, self._cluster.client_endpoints().get(peer, "")),
        }
        return unlisted

    def _answering(self, peer: str) -> bool:
        """False while `peer` failed a creation or decision less than CREATE_RETRY_S ago."""
        failed_at = self._unanswered.get(peer)
        if failed_at is None:
            return True
        if time.monotonic() - failed_at < CREATE_RETRY_S:
            return False
        del self._unanswered[peer]
        return True

    async def decide(self, topic: str, first: MessageType) -> list[BrokerRoute]:
        """The first node by name holding the topic decides what it accepts (its copy takes the
        type of `first` if nothing decided it yet), then every other undecided copy takes that
        decision; the route is read again (the brokers reported to the NameServer already).

        No copy ever decides by itself: when the deciding node does not answer, the send is
        refused with the retriable UNAVAILABLE (a copy deciding by its own first message could
        take another kind than the decider's later one: two definitions). A copy that did not take
        the decision is left out of the route this send is placed on; it takes it at a later send."""
        routes = await self.route(topic)
        undecided = [r.broker for r in routes if r.message_types == UNDECIDED_TYPES]
        if not undecided:
            return routes
        decider = min(routes, key=lambda r: r.broker)
        like = TopicSpec(topic, decider.queue_count, auto_types(first))
        try:
            decided = await self.broker(decider.broker).get_topic(topic, like=like)
        except TopicNotFound:
            self.forget(topic)  # deleted since: routed afresh at the next send
            raise
        except SluiceError as exc:
            raise Unavailable(f"topic {topic} was created on first use and no message decided its type yet; "
                              f"{decider.broker}, which decides it, did not answer ({exc.message}): "
                              "send again") from exc  # fmt: skip
        copies = {decider.broker: decided}
        missed: set[str] = set()
        for name in undecided:
            if name in copies:
                continue
            if self._answering(name):
                try:
                    copies[name] = await self.broker(name).get_topic(topic, like=decided)
                    continue
                except SluiceError:
                    self._unanswered[name] = time.monotonic()
            missed.add(name)
        unlisted = self._unlisted.get(topic)
        if unlisted:
            self._unlisted[topic] = {p: _route(p, copies[p], r.endpoint) if p in copies else r
                                     for p, r in unlisted.items()}  # fmt: skip
        await self._cluster.refetch(topic)
        routes = await self.route(topic)
        return [r for r in routes if r.broker not in missed] if missed else routes

    def forget(self, topic: str) -> None:
        for cache in (self._routes, self._unlisted, self._defined):
            cache.pop(topic, None)
        self._cluster.forget(topic)

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
