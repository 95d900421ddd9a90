"""`QueueStore`: an AMQP queue's messages on its broker, through `BrokerApi` (both topologies).

A queue is the RocketMQ topic `AMQP_Q<n>` with one queue, consumed by the group `AMQP_G<n>`
(proxy/amqp/meta.py): a publish is stored in each queue it routes to; a delivery is a pop that
makes the message invisible for a lease (`delivery_lease_ms`, renewed while its channel is open:
proxy/amqp/connection.py) until the client acknowledges it (an ack), requeues it (visible again
at once, delivered again with the redelivered flag) or rejects it (an ack: dead-lettering is not
done yet). The depth is exact:
what a pop would hand out now (the broker's `GroupQueueStatus.ready`).
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from broker.client.api import (
    AdminApi,
    CallContext,
    ConsumeFrom,
    GroupSpec,
    MessagingApi,
    PopRequest,
    SendResult,
    StoredMessage,
    TopicSpec,
)
from common import record
from common.errors import NotFound, TopicNotFound
from common.model import MessageType
from common.record import SYSPROP_AMQP_PROPERTIES, SYSPROP_PRIORITY
from proxy.amqp.meta import QueueMeta, queue_counts
from proxy.amqp.queuemetrics import QueueMetrics
from proxy.amqp.routing import decode_properties

# User properties of a stored AMQP message (docs/amqp.md): where it was published. Its content
# header's property bytes as the client sent them are the system property SYSPROP_AMQP_PROPERTIES
# (base64; copies stored before 2026-11-29 have them as this user property), handed back unchanged.
PROP_EXCHANGE = "AMQP_EXCHANGE"
PROP_ROUTING_KEY = "AMQP_ROUTING_KEY"
PROP_HEADER = "AMQP_PROPERTIES"
PROP_EXPIRES_AT = "AMQP_EXPIRES_AT"  # epoch ms after which the copy is not delivered (proxy/amqp/deadletter.py)
_MAX_ATTEMPTS = 1000  # the most a group allows; requeued this often, a message goes to %DLQ%AMQP_G<n>
_POP_MAX = 32
_PRIORITY_ONLY = frozenset({MessageType.PRIORITY})
MAX_PRIORITY_LIMIT = 99  # the most priority levels a broker's PRIORITY topic has (docs/priority.md)
_CALL_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class Publish:
    exchange: str
    routing_key: str
    properties: bytes  # the content header's property flags and values, as sent
    body: bytes


@dataclass(frozen=True, slots=True)
class Delivery:
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    redelivered: bool
    handle: str
    attempt: int = 1  # deliveries so far, this one included
    expires_at_ms: int = 0  # 0: never


def to_outgoing(p: Publish, host: str, expires_at_ms: int = 0, max_priority: int | None = None) -> bytes:
    """The record (`common.record.outgoing`) a publish stores in an AMQP queue's topic: the AMQP
    edge's one conversion of a published message. In a priority queue (`max_priority` set) it is a
    PRIORITY message: its AMQP `priority` (0 when it has none) capped at the queue's x-max-priority
    and the broker's limit, as RabbitMQ caps it."""
    props = {PROP_EXCHANGE: p.exchange, PROP_ROUTING_KEY: p.routing_key}
    if expires_at_ms:
        props[PROP_EXPIRES_AT] = str(expires_at_ms)
    sysprops = {SYSPROP_AMQP_PROPERTIES: base64.b64encode(p.properties).decode()} if p.properties else {}
    mtype = MessageType.NORMAL
    if max_priority is not None:
        value = decode_properties(p.properties).priority if p.properties else None
        level = min(value if isinstance(value, int) else 0, max_priority, MAX_PRIORITY_LIMIT)
        mtype, sysprops[SYSPROP_PRIORITY] = MessageType.PRIORITY, str(level)
    return record.outgoing(p.body, uuid.uuid4().hex.upper(), mtype, properties=props, system_properties=sysprops,
                           born_timestamp_ms=int(time.time() * 1000), born_host=host)  # fmt: skip


def to_delivery(m: StoredMessage) -> Delivery:
    """The AMQP delivery of a popped message, read from its record (decoded once) and the pop's fields."""
    rec = m.record
    props = rec.properties
    raw = rec.system_properties.get(SYSPROP_AMQP_PROPERTIES) or props.get(PROP_HEADER, "")
    header = base64.b64decode(raw) if raw else b""
    exchange, key = props.get(PROP_EXCHANGE, ""), props.get(PROP_ROUTING_KEY, rec.topic)
    expires = props.get(PROP_EXPIRES_AT, "")
    attempt = m.delivery_attempt
    return Delivery(exchange, key, header, rec.body, attempt > 1, m.receipt_handle, attempt,
                    int(expires) if expires.isdigit() else 0)  # fmt: skip


def _ctx(timeout_s: float) -> CallContext:
    return CallContext(deadline=time.monotonic() + timeout_s)


class QueueBroker(MessagingApi, AdminApi, Protocol):
    """What an AMQP queue needs of its broker: messaging, and its topic and group kept (admin)."""


class QueueGone(NotFound):
    """The queue was deleted (the newest metadata has no queue of that number)."""


class QueueStore:
    def __init__(self, broker: Callable[[str], QueueBroker], *, lease_ms: int, call_timeout_s: float,
                 exists: Callable[[QueueMeta], Awaitable[bool]] | None = None) -> None:  # fmt: skip
        """`exists`: whether the newest metadata still has the queue, asked before its topic and
        group are created here (a proxy with a stale copy must not create a deleted queue's again)."""
        self._broker = broker
        self._exists = exists
        self._invisible_ms = lease_ms
        self._timeout_s = call_timeout_s
        self._ready: set[int] = set()  # queue numbers whose topic and group are known to exist
        self.metrics = QueueMetrics()

    async def ensure(self, q: QueueMeta) -> None:
        """Create the queue's topic and group on its broker (idempotent). A priority queue's topic
        is a PRIORITY topic (docs/priority.md): one level queue per priority, the highest read first."""
        if q.id in self._ready:
            return
        if self._exists is not None and not await self._exists(q):
            raise QueueGone(f"queue '{q.name}' was deleted")
        api = self._broker(q.broker)
        if q.max_priority is None:
            await api.create_topic(TopicSpec(q.topic, queue_count=1))
        else:
            await api.create_topic(TopicSpec(q.topic, queue_count=1, message_types=_PRIORITY_ONLY,
                                             max_priority=min(q.max_priority, MAX_PRIORITY_LIMIT)))  # fmt: skip
        await api.create_group(
            GroupSpec(q.group, max_delivery_attempts=_MAX_ATTEMPTS, consume_from=ConsumeFrom.EARLIEST)
        )
        if len(self._ready) > 100_000:
            self._ready.clear()
        self._ready.add(q.id)

    async def send(self, q: QueueMeta, records: list[bytes]) -> list[SendResult]:
        """Store records made by `to_outgoing` for `q`. A queue whose topic its broker no longer
        holds (deleted through another proxy since this one made it; a broker never makes it again
        from a send) is asked after again: QueueGone if the queue is gone, else made and sent to."""
        await self.ensure(q)
        try:
            results = await self._broker(q.broker).send(q.topic, 0, records, ctx=_ctx(self._timeout_s))
        except TopicNotFound:
            self._ready.discard(q.id)
            await self.ensure(q)
            results = await self._broker(q.broker).send(q.topic, 0, records, ctx=_ctx(self._timeout_s))
        self.metrics.published[q.id] += len(results)
        return results

    async def pop(self, q: QueueMeta, count: int, long_poll_ms: int) -> list[Delivery]:
        await self.ensure(q)
        request = PopRequest(q.group, q.topic, 0, min(count, _POP_MAX), self._invisible_ms, long_poll_ms=long_poll_ms)
        got = await self._broker(q.broker).pop(request, ctx=_ctx(long_poll_ms / 1000 + self._timeout_s))
        self.metrics.delivered[q.id] += len(got)
        return [to_delivery(m) for m in got]

    async def ack(self, q: QueueMeta, handles: list[str]) -> None:
        await self._broker(q.broker).ack(q.group, q.topic, handles, ctx=_ctx(self._timeout_s))
        self.metrics.acked[q.id] += len(handles)

    async def renew(self, q: QueueMeta, handles: list[str]) -> list[str]:
        """Extend the lease of delivered messages (their handles stay valid); the handles that
        could not be renewed (acknowledged meanwhile, or no longer in flight)."""
        results = await self._broker(q.broker).renew(q.group, q.topic, handles, self._invisible_ms)
        return [r.receipt_handle for r in results if not r.ok]

    async def requeue(self, q: QueueMeta, handle: str) -> None:
        await self._broker(q.broker).change_invisible_duration(q.group, q.topic, handle, 0, ctx=_ctx(self._timeout_s))

    async def counts(self, q: QueueMeta) -> tuple[int, int]:
        """(ready, unacknowledged) messages of the queue, exactly: ready were never delivered or
        were requeued; unacknowledged are with a consumer now."""
        await self.ensure(q)
        return await self.depth(q)

    async def depth(self, q: QueueMeta) -> tuple[int, int]:
        """What `counts` answers, without creating the topic and group (NotFound when missing)."""
        ready, unacked, _ = queue_counts(await self._broker(q.broker).group_status(q.group, [q.topic]), q)
        return ready, unacked

    async def ready(self, q: QueueMeta) -> tuple[int, int]:
        """(messages, body bytes) ready in the queue, exactly (what x-max-length-bytes limits)."""
        await self.ensure(q)
        status = await self._broker(q.broker).group_status(q.group, [q.topic], ready_bytes=True)
        ready, _, size = queue_counts(status, q)
        return ready, size

    async def purge(self, q: QueueMeta) -> int:
        """Drop the queue's ready messages; how many there were."""
        ready, _ = await self.counts(q)
        if q.max_priority is not None:  # its level queues: taken and acknowledged
            left = ready
            while left > 0 and (got := await self.pop(q, min(left, _POP_MAX), 0)):
                await self.ack(q, [d.handle for d in got])
                left -= len(got)
            return ready
        api = self._broker(q.broker)
        status = await api.topic_status(q.topic)
        end = max((s.max_offset for s in status.queues), default=0)
        await api.reset_offset(q.group, q.topic, 0, end)
        return ready

    async def delete(self, q: QueueMeta) -> None:
        api = self._broker(q.broker)
        self._ready.discard(q.id)
        with contextlib.suppress(NotFound):
            await api.delete_group(q.group)
        with contextlib.suppress(NotFound):
            await api.delete_topic(q.topic)
