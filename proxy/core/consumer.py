"""Receive, ack, invisible-duration changes and dead-lettering, routed to the right broker.

A receive names a broker (from the route or assignment the client uses); the proxy pops from any
queue of that broker (the client's queue id is only a hint: producers spread over all queues
while Node consumers read queue 0 only), and when that broker has nothing for the group, from
another broker of the topic that has (proxy/core/gather.py). Acks and friends go to the broker named in the receipt
handle, so any proxy can serve them.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from broker.client import receipt
from broker.client.api import AckResult, CallContext, FilterSpec, MessagingApi, PopRequest, StoredMessage
from common import metrics
from common.errors import Forbidden, InternalError, InvalidReceiptHandle, SluiceError
from common.model import MessageType
from proxy import firstuse
from proxy.config import ReceiveConfig
from proxy.context import RequestContext
from proxy.core.failover import FAILOVER_MARGIN_S, call_through_failover
from proxy.core.gather import EmptyBrokers, pop_anywhere, pop_in_group
from proxy.core.lite import LiteRouter
from proxy.core.renewer import AutoRenewer
from proxy.core.routing import real_broker
from proxy.directory import BrokerDirectory, BrokerRoute

# A position no broker answered for (none is left so: every handle is routed or refused first).
_UNANSWERED = AckResult("", InternalError("no broker answered for this receipt handle"))

# A bind topic accepts LITE messages only; an auto-created topic not yet typed by its first message
# advertises every type, LITE included, and is read as a normal topic.
_LITE_ONLY = frozenset({MessageType.LITE})

T = TypeVar("T")


async def _pop(
    directory: BrokerDirectory, request: PopRequest, ctx: CallContext, api: MessagingApi
) -> list[StoredMessage]:
    """A pop whose long poll ends before the call's deadline (less what a retry keeps): a pop
    retried on a group's new primary long-polls only for what is left. A broker lacking the group
    gets the cluster's definition of it first (gather.pop_in_group)."""
    remaining = ctx.remaining_s()
    if remaining is not None:
        left_ms = max(0, int((remaining - FAILOVER_MARGIN_S) * 1000))
        if left_ms < request.long_poll_ms:
            request = replace(request, long_poll_ms=left_ms)
    return await pop_in_group(directory, api, request, ctx)


@dataclass(frozen=True, slots=True)
class ReceiveSpec:
    group: str
    topic: str
    broker_hint: str
    filter: FilterSpec
    batch_size: int
    invisible_ms: int | None  # None: auto renew (push consumers)
    long_poll_ms: int


class ConsumerService:
    def __init__(self, directory: BrokerDirectory, renewer: AutoRenewer, config: ReceiveConfig) -> None:
        self._dir = directory
        self._renewer = renewer
        self._cfg = config
        self._rotation = itertools.count()
        self.lite: LiteRouter | None = None
        # Brokers the send health finds hung or failing (proxy/core/health.py): not asked first.
        self.usable: Callable[[str], bool] | None = None
        self._empty = EmptyBrokers()  # brokers that had nothing lately: asked after the others

    def _brokers_in_turn(self, routes: list[BrokerRoute], hint: str, topic: str) -> list[str]:
        """The readable brokers of a route, the one the client named first (else the next in
        rotation), then the others in route order from there."""
        readable = sorted({r.broker for r in routes if r.permission.readable})
        if not readable:
            raise Forbidden(f"topic {topic} has no readable queue")
        hint = real_broker(hint)
        start = readable.index(hint) if hint in readable else next(self._rotation) % len(readable)
        return readable[start:] + readable[:start]

    async def receive(self, ctx: RequestContext, spec: ReceiveSpec) -> list[StoredMessage]:
        routes = await self._dir.route(spec.topic)
        auto_renew = spec.invisible_ms is None
        invisible_ms = self._cfg.auto_renew_invisible_ms if spec.invisible_ms is None else spec.invisible_ms
        batch = max(1, min(spec.batch_size or self._cfg.max_batch_messages, self._cfg.max_batch_messages))
        if self.lite is not None and any(r.message_types == _LITE_ONLY for r in routes):
            # A lite consumer reads one queue of the route; its lite topics live on every broker.
            request = PopRequest(spec.group, spec.topic, None, batch, invisible_ms, spec.filter, spec.long_poll_ms,
                                 lite_client=ctx.client_id)  # fmt: skip
            messages = await self.lite.receive(request, ctx=ctx)
        else:
            # Served by whichever broker has messages, the named one first (proxy/core/gather.py).
            brokers = self._brokers_in_turn(routes, spec.broker_hint, spec.topic)
            request = PopRequest(spec.group, spec.topic, None, batch, invisible_ms, spec.filter, spec.long_poll_ms)
            if len(brokers) == 1:  # the topic's only broker (group): wait out its failover
                messages = await call_through_failover(self._dir, brokers[0], partial(_pop, self._dir, request, ctx),
                                                       ctx)  # fmt: skip
            else:
                messages = await pop_anywhere(
                    self._dir, brokers, request, ctx=ctx, usable=self.usable, empty=self._empty
                )
        if messages:
            metrics.count_out(spec.topic, spec.group, len(messages), sum(len(m.body) for m in messages))
        if auto_renew:
            for m in messages:
                delivered_by = receipt.broker_of(m.receipt_handle)
                self._renewer.add(ctx.client_id, delivered_by, spec.group, spec.topic, m.receipt_handle,
                                  m.invisible_until_ms)  # fmt: skip
        return messages

    async def _handle_broker(self, handle: str) -> str:
        """The broker a receipt handle belongs to; a handle naming no broker of this cluster is invalid."""
        name = receipt.broker_of(handle)
        if await self._dir.lookup(name) is None:
            raise InvalidReceiptHandle(f"receipt handle names broker {name}, which is not part of this cluster")
        return name

    async def _on_handle_broker(self, handle: str, call: Callable[[MessagingApi], Awaitable[T]], ctx: CallContext) -> T:
        """`call` on the broker a handle names, waiting out its group's failover: only that broker
        (group) can take it. A new primary accepts a handle of its predecessor's term while the
        replicated delivery it names is still the live one; else (the delivery was not replicated,
        or the message was delivered again since) it refuses with InvalidReceiptHandle, and the
        message comes back after its invisible duration."""
        return await call_through_failover(self._dir, await self._handle_broker(handle), call, ctx)

    async def ack(self, ctx: CallContext, group: str, topic: str, handles: list[str]) -> list[AckResult]:
        # Results are placed by position, not by handle: a handle given twice gets two answers
        # (the broker acks the first and refuses the second).
        by_broker: dict[str, list[int]] = {}
        out: list[AckResult] = [_UNANSWERED] * len(handles)
        unrouted = False
        for i, h in enumerate(handles):
            try:
                by_broker.setdefault(receipt.broker_of(h), []).append(i)
            except SluiceError as exc:
                out[i] = AckResult(h, exc)
                unrouted = True
        if len(by_broker) == 1 and not unrouted:
            out = await self._ack_on(ctx, group, topic, handles)  # the usual request: one broker, in order
        else:
            for positions in by_broker.values():
                answers = await self._ack_on(ctx, group, topic, [handles[i] for i in positions])
                for i, r in zip(positions, answers, strict=True):
                    out[i] = r
        if self._renewer.leases:
            for h in handles:
                self._renewer.remove(h)
        metrics.count_acked(topic, group, sum(1 for r in out if r.ok))
        return out

    async def _ack_on(self, ctx: CallContext, group: str, topic: str, handles: list[str]) -> list[AckResult]:
        """Acks of handles of one broker, in their order; a broker that fails fails each of them."""
        try:
            return await self._on_handle_broker(handles[0], lambda api: api.ack(group, topic, handles, ctx=ctx), ctx)
        except SluiceError as exc:
            return [AckResult(h, exc) for h in handles]

    async def change_invisible_duration(
        self, ctx: CallContext, group: str, topic: str, handle: str, invisible_ms: int
    ) -> str:
        new = await self._on_handle_broker(
            handle, lambda api: api.change_invisible_duration(group, topic, handle, invisible_ms, ctx=ctx), ctx
        )
        self._renewer.remove(handle)
        return new

    async def forward_to_dead_letter(self, ctx: CallContext, group: str, topic: str, handle: str) -> None:
        api: MessagingApi = self._dir.broker(await self._handle_broker(handle))
        await api.forward_to_dead_letter(group, topic, handle, ctx=ctx)
        self._renewer.remove(handle)

    async def touch_group(self, group: str) -> None:
        """First contact of a consumer group (heartbeat): create it where brokers auto-create, as
        the cluster defines it (proxy/firstuse.py)."""
        brokers: list[tuple[str, MessagingApi]] = [(n, self._dir.broker(n)) for n in self._dir.broker_names()]
        await firstuse.ensure_group(brokers, group, firstuse.GROUP_WAIT_S)
