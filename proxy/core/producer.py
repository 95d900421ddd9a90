"""Produce: place each message on a (broker, queue) and store it through that broker.

Messages of one request that land on the same queue are stored in one call (one group-committed
append). Results come back in request order; a failure affects only the messages of its queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from broker.client import txid
from broker.client.api import (
    CallContext,
    MessagingApi,
    SendResult,
    TransactionResolution,
    TransactionSource,
)
from broker.client.recall import broker_of_recall_handle
from common import metrics, record
from common.errors import (
    BadRequest,
    InvalidTransactionId,
    ProxyTimeout,
    SluiceError,
    TopicNotFound,
)
from common.model import MESSAGE_TYPES, UNDECIDED_TYPES, MessageType
from common.record import SYSPROP_LITE_TOPIC
from proxy.config import SendHealthConfig
from proxy.core.failover import call_through_failover
from proxy.core.health import BrokerHealth
from proxy.core.routing import QueueSelector, lite_broker
from proxy.directory import BrokerDirectory, BrokerRoute

SendOutcome = SendResult | SluiceError
_CANCELLED = ProxyTimeout("the send was cancelled before the broker answered")
_TOPIC, _RECORD = itemgetter(0), itemgetter(1)
_TYPE_AT = record.OFFSETS["message_type"]


def _body_bytes(records: list[bytes]) -> int:
    return sum(map(record.peek_body_size, records))


class ProducerService:
    def __init__(
        self, directory: BrokerDirectory, *, topics_max: int, home: str | None = None,
        health: BrokerHealth | None = None,
    ) -> None:  # fmt: skip
        self._dir = directory
        self._selectors: dict[str, QueueSelector] = {}
        self._topics_max = topics_max
        self._home = home  # this node's own broker, where messages without a group stay (docs/shards.md)
        self._health = health or BrokerHealth(SendHealthConfig())
        self._usable = self._health.usable

    def _selector(self, topic: str) -> QueueSelector:
        selector = self._selectors.get(topic)
        if selector is None:
            if len(self._selectors) >= self._topics_max:
                self._selectors.clear()
            selector = self._selectors[topic] = QueueSelector(self._home)
        return selector

    async def send(
        self, ctx: CallContext, items: list[tuple[str, bytes]], lite_topics: Sequence[str | None] | None = None
    ) -> list[SendOutcome]:
        """Store messages given as (cluster-wide topic, record by `common.record.outgoing`);
        outcomes in request order. `lite_topics`: each record's lite topic, when the caller knows
        them (the MQTT edge), so the records need not be decoded to be placed."""
        records = list(map(_RECORD, items))
        topic = items[0][0]
        groups = list(map(record.peek_group, records))
        lite = any(r[_TYPE_AT] == MessageType.LITE for r in records)
        if not lite and not any(groups) and list(map(_TOPIC, items)).count(topic) == len(items):
            return await self._send_one_queue(ctx, topic, records)
        placed: dict[tuple[str, str, int], list[int]] = {}
        outcomes: list[SendOutcome | None] = [None] * len(items)
        batch_queue: dict[str, tuple[str, int]] = {}
        routes: dict[str, list[BrokerRoute] | SluiceError] = {}
        for i, (topic, data) in enumerate(items):
            route = routes.get(topic)
            if route is None:  # once per topic and request
                try:
                    route = routes[topic] = await self._route(topic, data[_TYPE_AT])
                except SluiceError as exc:
                    route = routes[topic] = exc
            if isinstance(route, SluiceError):
                outcomes[i] = route
                continue
            try:
                selector = self._selector(topic)
                if lite_topics is not None:
                    lite_topic = lite_topics[i]
                else:
                    lite_topic = (
                        record.decode(data).system_properties.get(SYSPROP_LITE_TOPIC)
                        if data[_TYPE_AT] == MessageType.LITE else None
                    )  # fmt: skip
                group = groups[i]
                if lite_topic is not None:  # a lite topic lives on one broker (docs/lite-topics.md)
                    broker, qid = lite_broker(topic, route, lite_topic), 0
                elif group:
                    broker, qid = selector.pick(topic, route, group)
                else:  # messages of one request without a group share one queue: one append
                    if topic not in batch_queue:
                        batch_queue[topic] = selector.pick(topic, route, None, self._usable)
                    broker, qid = batch_queue[topic]
                placed.setdefault((topic, broker, qid), []).append(i)
            except SluiceError as exc:
                outcomes[i] = exc
        for (topic, broker, qid), indexes in placed.items():
            try:
                batch = [items[i][1] for i in indexes]
                results = await self._send_to(ctx, broker, topic, qid, batch)
                for i, r in zip(indexes, results, strict=True):
                    outcomes[i] = r
                metrics.count_in(topic, len(batch), _body_bytes(batch))
            except SluiceError as exc:
                for i in indexes:
                    outcomes[i] = exc
        return [o if o is not None else SluiceError("message was not placed") for o in outcomes]

    async def _send_one_queue(self, ctx: CallContext, topic: str, messages: list[bytes]) -> list[SendOutcome]:
        """`send` of messages of one topic without a message group (the usual batch): they take
        one queue and one append, so there is nothing to place message by message."""
        try:
            route = await self._route(topic, messages[0][_TYPE_AT])
            broker, qid = self._selector(topic).pick(topic, route, None, self._usable)
            results = await self._send_to(ctx, broker, topic, qid, messages)
        except SluiceError as exc:
            return [exc] * len(messages)
        metrics.count_in(topic, len(messages), _body_bytes(messages))
        return list(results)

    async def _route(self, topic: str, first: int) -> list[BrokerRoute]:
        """The topic's route. A topic created on first use that no message decided yet accepts
        every type: the type of this request's first message for it (`first`, a record's type
        byte) decides what it accepts, once for every broker holding it (BrokerDirectory.decide)."""
        route = await self._dir.route(topic)
        for r in route:
            if r.message_types == UNDECIDED_TYPES:
                kind = MESSAGE_TYPES.get(first)
                return route if kind is None else await self._dir.decide(topic, kind)  # None: the broker refuses it
        return route

    async def _send_to(
        self, ctx: CallContext, broker: str, topic: str, queue_id: int, messages: list[bytes]
    ) -> list[SendResult]:
        """Send through `broker`. When a group member that is not the primary (`NotPrimary`: a
        replica, a fenced or deposed primary) refused it, or the broker cannot be reached and is the
        topic's only writable one (a killed primary: the client's retry could only come back to
        it), look its address up again and send there while the client's deadline allows
        (proxy/core/failover.py); so is a topic's only broker group whose primary has too few
        members in sync (`TooFewInSync`). Another retriable refusal is retried once if the broker has
        moved meanwhile, else raised for the client to retry (on another queue, another broker).

        Its latency and outcome feed the queue selection (proxy/core/health.py); a send cancelled
        before the broker answered (the client gave up waiting) counts as timed out."""
        token = self._health.started(broker)
        outcome: SluiceError | None = _CANCELLED
        try:
            results = await call_through_failover(
                self._dir, broker, lambda api: api.send(topic, queue_id, messages, ctx=ctx), ctx,
                wait_unreachable=lambda: self._only_broker(topic), wait_in_sync=lambda: self._only_broker(topic),
            )  # fmt: skip
            outcome = None
        except SluiceError as exc:
            outcome = exc
            if isinstance(exc, TopicNotFound):  # deleted since this proxy routed it: route it afresh next time
                self._dir.forget(topic)
            raise
        finally:
            self._health.finished(broker, token, outcome)
        metrics.count_broker_sends(topic, broker, len(messages))
        return results

    async def _only_broker(self, topic: str) -> bool:
        """Whether `topic` has one writable broker (or broker group)."""
        try:
            route = await self._dir.route(topic)
        except SluiceError:
            return False
        return sum(1 for r in route if r.permission.writable) == 1

    async def end_transaction(
        self, ctx: CallContext, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource,
    ) -> None:  # fmt: skip
        """Commit or roll back on the broker named by the transaction id (any proxy can route it)."""
        name = txid.broker_of(transaction_id)
        broker: MessagingApi | None = await self._dir.lookup(name)
        if broker is None:
            raise InvalidTransactionId(f"transaction {transaction_id} names broker {name}, which this cluster "
                                       "does not know")  # fmt: skip
        await broker.end_transaction(topic, message_id, transaction_id, resolution, source, ctx=ctx)

    async def recall(self, ctx: CallContext, topic: str, recall_handle: str) -> str:
        """Cancel a pending DELAY message on the broker its recall handle names; its message id."""
        name = broker_of_recall_handle(recall_handle)
        api: MessagingApi | None = await self._dir.lookup(name)
        if api is None:
            raise BadRequest(f"recall handle names broker {name}, which is not part of this cluster")
        return await api.recall(topic, recall_handle, ctx=ctx)
