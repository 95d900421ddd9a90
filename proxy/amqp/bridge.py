"""`TopicBridge`: the RocketMQ side of exchanges mapped to topics (`x-sluice-topic`, docs/amqp.md).

- An AMQP publish to a mapped exchange is stored in the exchange's queues and once in its topic
  (`publish`, as a RocketMQ message: proxy/amqp/crossmap.py), before its confirm. In a LITE topic
  (an MQTT bind topic) it is a message of the lite topic its routing key names
  (proxy/litenames.py), which that lite topic's RocketMQ lite consumers and MQTT subscribers get.
- A RocketMQ send to the topic reaches the exchange's queues: every proxy reads the topic with
  the exchange's bridge group (`AMQP_X<hash>`, in the vhost's namespace, created when the
  exchange is declared, reading what is stored from then on: a broker the topic's route gains
  later gets the group with the same start), with a filter that skips what AMQP published
  (its queues got it at publish time), routes each message through the exchange's bindings,
  stores it in the queues it reaches and then acknowledges it. A message is so carried at least
  once: a proxy that dies between the store and the ack leaves it to be carried again. A LITE
  topic is read the way an MQTT session reads it: the bridge group holds the filter subscription
  `#` on every broker of the topic (its lite client `BRIDGE_CLIENT`), so every lite topic written
  from then on is read, and its pops ask for lite topics' runs (`lite_window`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

from broker.client import receipt
from broker.client.api import (
    BrokerApi,
    CallContext,
    ConsumeFrom,
    FilterKind,
    FilterSpec,
    GroupSpec,
    LiteAction,
    LiteSync,
    PopRequest,
    SendResult,
    StoredMessage,
)
from common.errors import IllegalLiteTopic, MessageBodyTooLarge, NotFound, SluiceError, Unavailable
from common.logs import kv
from common.model import MessageType, validate_lite_topic_name
from proxy import names
from proxy.amqp import crossmap, overflow
from proxy.amqp.codes import NOT_FOUND, AmqpError
from proxy.amqp.deadletter import DeadLetters, expires_at_ms
from proxy.amqp.meta import ExchangeMeta, QueueMeta, bridge_group, namespace_of
from proxy.amqp.metastore import MetaStore
from proxy.amqp.queues import PROP_EXCHANGE, Publish, QueueGone, QueueStore, to_outgoing
from proxy.amqp.routing import decode_headers, route
from proxy.directory import BrokerRoute
from proxy.litenames import lite_of_routing_key

log = logging.getLogger("sluice.proxy.amqp")

Send = Callable[[CallContext, list[tuple[str, bytes]]], Awaitable[list[SendResult | SluiceError]]]
Routes = Callable[[str], Awaitable[list[BrokerRoute]]]
PopAnywhere = Callable[[list[str], PopRequest, CallContext], Awaitable[list[StoredMessage]]]

_NOT_FROM_AMQP = FilterSpec(FilterKind.SQL, f"{PROP_EXCHANGE} IS NULL")
_POP_MAX = 32
_INVISIBLE_MS = 30_000  # a carried message not acknowledged (the proxy died) is carried again after this
_LONG_POLL_MS = 1_000
_RETRY_S = 1.0  # after a failed round (the topic missing, a broker down)
_SUPERVISE_S = 0.5  # how often the mapped exchanges are compared with the running carriers
_LITE = frozenset({MessageType.LITE})
BRIDGE_CLIENT = "amqp-bridge"  # the lite client of bridge groups reading a LITE topic (one for every proxy)
_EVERY_LITE_TOPIC = "#"


def _error(outcome: SendResult | SluiceError) -> SluiceError | None:
    return outcome if isinstance(outcome, SluiceError) else None


def _lite(routes: list[BrokerRoute]) -> bool:
    """Whether a route is a LITE topic's (an MQTT bind topic, docs/lite-topics.md)."""
    return bool(routes) and all(r.message_types == _LITE for r in routes)


def cluster_topic(vhost: str, topic: str) -> str:
    return names.wrap(namespace_of(vhost), topic)


def cluster_group(vhost: str, exchange: str) -> str:
    return names.wrap(namespace_of(vhost), bridge_group(vhost, exchange))


def _group_spec(group: str, start_ms: int) -> GroupSpec:
    """A bridge group reading what was stored from `start_ms` on (the exchange's declare)."""
    return GroupSpec(group, consume_from=ConsumeFrom.TIMESTAMP, consume_from_timestamp_ms=start_ms)


class TopicBridge:
    def __init__(
        self, meta: MetaStore, store: QueueStore, dead: DeadLetters, *, send: Send, routes: Routes,
        broker: Callable[[str], BrokerApi], pop_anywhere: PopAnywhere, call_timeout_s: float, max_body_bytes: int,
        max_lite_chars: int,
    ) -> None:  # fmt: skip
        """`max_body_bytes`, `max_lite_chars`: the largest body and lite topic name the RocketMQ
        clients are told ([proxy.settings])."""
        self._meta = meta
        self._store = store
        self._dead = dead
        self._send = send
        self._routes = routes
        self._broker = broker
        self._pop_anywhere = pop_anywhere
        self._timeout_s = call_timeout_s
        self._max_body = max_body_bytes
        self._max_lite_chars = max_lite_chars
        self._carriers: dict[tuple[str, str, str], asyncio.Task[None]] = {}  # (vhost, exchange, topic) -> task
        self._grouped: set[tuple[str, str]] = set()  # (broker, bridge group) known to exist
        self._filtered: set[tuple[str, str, str]] = set()  # (broker, group, LITE topic) whose `#` filter is held
        self.host = "amqp-bridge"

    def _ctx(self) -> CallContext:
        return CallContext(deadline=time.monotonic() + self._timeout_s)

    # -- declare and delete ------------------------------------------------------------------------

    async def prepare(self, vhost: str, exchange: str, topic: str) -> None:
        """Before a mapped exchange is stored: its topic must exist (404 otherwise); its bridge
        group is created on the topic's brokers (reading from the latest message) unless it is there."""
        full = cluster_topic(vhost, topic)
        try:
            routes = await self._routes(full)
        except NotFound:
            routes = []
        if not routes:
            raise AmqpError(NOT_FOUND, f"no RocketMQ topic '{topic}' in the namespace of vhost '{vhost}' for "
                            f"exchange '{exchange}' (create it first: sluice admin topic create)")  # fmt: skip
        spec = _group_spec(cluster_group(vhost, exchange), int(time.time() * 1000))
        brokers = sorted({r.broker for r in routes})
        for name in brokers:
            await self._ensure_group(name, spec)
        if _lite(routes):  # read from the declare on, as other topics are
            await self._every_lite_topic(brokers, spec.name, full)

    async def _ensure_group(self, broker: str, spec: GroupSpec) -> None:
        """The bridge group on `broker`: the one there, else `spec` created there."""
        api = self._broker(broker)
        try:
            await api.get_group(spec.name)
        except NotFound:
            await api.create_group(spec)
        self._grouped.add((broker, spec.name))

    async def _group_on(self, brokers: list[str], group: str) -> None:
        """The bridge group on every broker of the topic's route: a broker the route did not name
        when the exchange was declared gets the same start time as the others (so it skips nothing
        sent since the declare), or now when no broker has it."""
        missing = [b for b in brokers if (b, group) not in self._grouped]
        if not missing:
            return
        start_ms = int(time.time() * 1000)
        for b in brokers:
            with contextlib.suppress(NotFound):
                info = await self._broker(b).get_group(group)
                start_ms = min(start_ms, info.spec.consume_from_timestamp_ms or info.created_ms)
        for b in missing:
            await self._ensure_group(b, _group_spec(group, start_ms))

    async def forget(self, vhost: str, exchange: ExchangeMeta) -> None:
        """After a mapped exchange was deleted: its bridge group goes (a new exchange of that name
        starts from the latest message again). Best effort: a failure is logged."""
        if exchange.topic is None:
            return
        group = cluster_group(vhost, exchange.name)
        try:
            topic = cluster_topic(vhost, exchange.topic)
            routes = await self._routes(topic)
            lite = _lite(routes)
            for name in sorted({r.broker for r in routes}):
                self._grouped.discard((name, group))
                with contextlib.suppress(NotFound):
                    if lite:
                        self._filtered.discard((name, group, topic))
                        await self._broker(name).sync_lite_subscription(
                            LiteSync(group, topic, BRIDGE_CLIENT, LiteAction.COMPLETE_REMOVE, (), filters=True)
                        )
                    await self._broker(name).delete_group(group)
        except SluiceError as exc:
            log.warning("could not delete the bridge group of a deleted AMQP exchange",
                        extra=kv(vhost=vhost, exchange=exchange.name, group=group, error=exc.message))  # fmt: skip

    # -- AMQP -> RocketMQ --------------------------------------------------------------------------

    async def publish(self, vhost: str, topic: str, publishes: list[Publish], host: str) -> list[SluiceError | None]:
        """Store each publish in the mapped topic; None for each stored, else why not. A body
        larger than the RocketMQ clients' limit is refused without a send: the topic's consumers
        could not receive it."""
        full = cluster_topic(vhost, topic)
        out = [self.refusal(topic, p) for p in publishes]
        lite = await self._is_lite(full)
        if lite:
            out = [err or self._lite_refusal(topic, p) for p, err in zip(publishes, out, strict=True)]
        sendable = [p for p, err in zip(publishes, out, strict=True) if err is None]
        if sendable:
            records = [(full, crossmap.to_topic_message(p, host, lite_of_routing_key(p.routing_key) if lite else None))
                       for p in sendable]  # fmt: skip
            sent = iter(await self._send(self._ctx(), records))
            out = [err if err is not None else _error(next(sent)) for err in out]
        failed = [o for o in out if o is not None]
        if failed:
            log.warning("AMQP publishes not stored in their mapped topic",
                        extra=kv(topic=full, count=len(failed), error=failed[0].message))  # fmt: skip
        return out

    def refusal(self, topic: str, p: Publish) -> SluiceError | None:
        """Why `p` cannot be stored in the mapped topic `topic`, if it cannot: a body larger than
        the RocketMQ clients are told they may receive."""
        if len(p.body) <= self._max_body:
            return None
        return MessageBodyTooLarge(f"message size {len(p.body)} is larger than {self._max_body}, the largest "
                                   f"body RocketMQ clients of topic '{topic}' (exchange '{p.exchange}') "
                                   "receive")  # fmt: skip

    async def _is_lite(self, topic: str) -> bool:
        try:
            return _lite(await self._routes(topic))
        except NotFound:
            return False

    def _lite_refusal(self, topic: str, p: Publish) -> SluiceError | None:
        """Why `p` names no lite topic of the LITE topic `topic`, if it does not."""
        try:
            validate_lite_topic_name(lite_of_routing_key(p.routing_key), self._max_lite_chars)
        except IllegalLiteTopic as exc:
            return IllegalLiteTopic(f"exchange '{p.exchange}' is mapped to the LITE topic '{topic}', whose messages "
                                    f"need a lite topic: routing key {p.routing_key[:64]!r} names none "
                                    f"({exc.message})")  # fmt: skip
        return None

    # -- RocketMQ -> AMQP --------------------------------------------------------------------------

    def _mapped(self) -> set[tuple[str, str, str]]:
        return {(vhost, e.name, e.topic) for vhost, v in self._meta.doc.vhosts.items() for e in v.exchanges.values()
                if e.topic is not None}  # fmt: skip

    async def run(self, stop: asyncio.Event) -> None:
        """Keep one carrier per mapped exchange of the metadata, until `stop`."""
        try:
            while not stop.is_set():
                wanted = self._mapped()
                for key in [k for k in self._carriers if k not in wanted]:
                    self._carriers.pop(key).cancel()
                for key in wanted - self._carriers.keys():
                    task = asyncio.create_task(self._carry(*key), name=f"amqp-bridge-{key[1][:40]}")
                    self._carriers[key] = task
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _SUPERVISE_S)
        finally:
            tasks = list(self._carriers.values())
            self._carriers.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _carry(self, vhost: str, exchange: str, topic: str) -> None:
        full, group = cluster_topic(vhost, topic), cluster_group(vhost, exchange)
        failing = False
        while True:
            try:
                await self._round(vhost, exchange, full, group)
                failing = False
            except (SluiceError, AmqpError) as exc:
                if not failing:
                    log.warning("carrying a mapped topic to its AMQP exchange failed; retrying",
                                extra=kv(topic=full, exchange=exchange, error=str(exc)))  # fmt: skip
                failing = True
                await asyncio.sleep(_RETRY_S)
            except Exception:  # a bug: logged, the carrier goes on after a pause
                log.exception("AMQP topic bridge failed", extra=kv(topic=full, exchange=exchange))
                await asyncio.sleep(_RETRY_S)

    async def _round(self, vhost: str, exchange: str, topic: str, group: str) -> None:
        routes = await self._routes(topic)
        brokers = sorted({r.broker for r in routes if r.permission.readable})
        if not brokers:
            await asyncio.sleep(_RETRY_S)
            return
        await self._group_on(brokers, group)
        lite = _lite(routes)
        if lite:
            await self._every_lite_topic(brokers, group, topic)
        client, window = (BRIDGE_CLIENT, _POP_MAX) if lite else ("", 1)
        request = PopRequest(group, topic, None, _POP_MAX, _INVISIBLE_MS, _NOT_FROM_AMQP, _LONG_POLL_MS,
                             lite_client=client, lite_window=window)  # fmt: skip
        ctx = CallContext(deadline=time.monotonic() + _LONG_POLL_MS / 1000 + self._timeout_s)
        got = await self._pop_anywhere(brokers, request, ctx)
        if not got:
            return
        await self.carry(vhost, exchange, [m for m in got if not crossmap.from_amqp(m)])
        by_broker: dict[str, list[str]] = {}
        for m in got:
            by_broker.setdefault(receipt.broker_of(m.receipt_handle), []).append(m.receipt_handle)
        for name, handles in by_broker.items():
            await self._broker(name).ack(group, topic, handles, ctx=self._ctx())

    async def _every_lite_topic(self, brokers: list[str], group: str, topic: str) -> None:
        """The bridge group's filter subscription `#` on each broker of a LITE topic: every lite
        topic written from then on is read by the group (as an MQTT subscription of `#` is)."""
        for b in brokers:
            if (b, group, topic) in self._filtered:
                continue
            sync = LiteSync(group, topic, BRIDGE_CLIENT, LiteAction.PARTIAL_ADD, (_EVERY_LITE_TOPIC,), filters=True)
            await self._broker(b).sync_lite_subscription(sync)
            self._filtered.add((b, group, topic))

    async def carry(self, vhost: str, exchange: str, messages: list[StoredMessage]) -> None:
        """Store RocketMQ messages in the queues they route to from `exchange` (raises when a
        queue's broker failed: the caller then does not acknowledge them). Routed with the newest
        metadata, as AMQP publishes are: a binding made through another proxy before the send counts."""
        try:
            await self._meta.refresh()
        except SluiceError as exc:
            log.debug("AMQP metadata not refreshed before carrying", extra=kv(error=exc.message))
        v = self._meta.doc.vhosts.get(vhost)
        if v is None or exchange not in v.exchanges:
            return
        per_queue: dict[int, tuple[QueueMeta, list[Publish]]] = {}
        per_topic: dict[str, list[Publish]] = {}  # other mapped exchanges reached through exchange bindings
        source = v.exchanges[exchange].topic
        for m in messages:
            p = crossmap.to_publish(m, exchange)
            queues, topics = route(v, exchange, p.routing_key, partial(decode_headers, p.properties))
            for q in queues:
                per_queue.setdefault(q.id, (q, []))[1].append(p)
            for topic in topics:
                if topic != source:
                    per_topic.setdefault(topic, []).append(p)
        for topic, publishes in per_topic.items():
            if not all(await self.publish(vhost, topic, publishes, self.host)):
                raise Unavailable(f"carried messages were not stored in RocketMQ topic {topic}")
        now_ms = int(time.time() * 1000)
        for q, publishes in per_queue.values():
            accepted = await overflow.admit(self._store, q, publishes) if overflow.rejects(q) else publishes
            if not accepted:
                continue
            try:
                await self._store.send(q, [
                    to_outgoing(p, self.host, expires_at_ms(q, p.properties, now_ms), q.max_priority) for p in accepted
                ])  # fmt: skip
            except QueueGone:  # deleted since the routing: not routed there
                continue
            await overflow.trim(self._store, self._dead, vhost, q)
