"""Message expiry, delivery limits and dead-lettering (RabbitMQ's queue arguments).

- `x-message-ttl` (queue) and `expiration` (message property, ms) give a stored message an
  expiry time (`AMQP_EXPIRES_AT`, set when it is stored in each queue). An expired message is never
  delivered: when a pop meets it, it is dead-lettered (reason `expired`) or dropped.
- `x-delivery-limit`: a message delivered more often than that is dead-lettered (`delivery_limit`)
  instead of delivered again.
- A reject or nack without requeue dead-letters (`rejected`) when the queue has
  `x-dead-letter-exchange`, else drops the message.

Dead-lettering publishes a copy to the queue's dead-letter exchange with its
`x-dead-letter-routing-key` (else the message's own routing key), with an `x-death` entry (queue,
reason, count, exchange, routing keys, time), `x-first-death-*` and `x-last-death-*` headers, and
without `expiration`; the copy is stored in the queues it routes to, and in the RocketMQ topics of
the mapped exchanges it reaches, before the original is acknowledged, so a message is never lost
between the two (at worst, after a crash, it is both).
"""

from __future__ import annotations

import datetime as dt
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common.errors import SluiceError, Unavailable
from common.logs import kv
from proxy.amqp.meta import QueueMeta
from proxy.amqp.metastore import MetaStore
from proxy.amqp.queues import Delivery, Publish, QueueStore, to_outgoing
from proxy.amqp.routing import decode_properties, route

log = logging.getLogger("sluice.proxy.amqp")

EXPIRATION_FLAG = 0x0100  # the `expiration` bit of a content header's property flags
EXPIRED, REJECTED, DELIVERY_LIMIT = "expired", "rejected", "delivery_limit"


def message_ttl_ms(raw: bytes) -> int | None:
    """The message's `expiration` in ms; None when it has none (or one that is not a number)."""
    if len(raw) < 2 or not struct.unpack_from(">H", raw)[0] & EXPIRATION_FLAG:
        return None
    value = decode_properties(raw).expiration
    try:
        ms = int(str(value))
    except ValueError:
        return None
    return ms if ms >= 0 else None


def expires_at_ms(queue: QueueMeta, raw_properties: bytes, now_ms: int) -> int:
    """When a message stored now in `queue` expires; 0: never."""
    ttls = [t for t in (queue.message_ttl_ms, message_ttl_ms(raw_properties)) if t is not None]
    return now_ms + min(ttls) if ttls else 0


def dead_properties(raw: bytes, queue: QueueMeta, d: Delivery, reason: str) -> bytes:
    """The dead-lettered copy's property bytes: `x-death` updated, `expiration` removed."""
    props = decode_properties(raw)
    headers: dict[str, Any] = dict(props.headers or {})
    before = headers.get("x-death")
    deaths: list[dict[str, Any]] = [x for x in before if isinstance(x, dict)] if isinstance(before, list) else []
    mine = next((x for x in deaths if x.get("queue") == queue.name and x.get("reason") == reason), None)
    if mine is not None:
        deaths.remove(mine)
    count = mine.get("count", 0) if mine is not None else 0
    entry: dict[str, Any] = dict(mine or {})  # an earlier death here keeps its fields (original-expiration)
    entry.update({"queue": queue.name, "reason": reason, "count": (count if isinstance(count, int) else 0) + 1,
                  "exchange": d.exchange, "routing-keys": [d.routing_key],
                  "time": dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None)})  # fmt: skip
    if props.expiration is not None:
        entry["original-expiration"] = props.expiration
    headers["x-death"] = [entry, *deaths]
    for prefix in ("x-first-death", "x-last-death"):
        if prefix == "x-last-death" or f"{prefix}-queue" not in headers:
            headers[f"{prefix}-queue"], headers[f"{prefix}-reason"] = queue.name, reason
            headers[f"{prefix}-exchange"] = d.exchange
    props.headers = headers
    props.expiration = None
    return props.marshal()


# (vhost, topic, publishes, host) -> whether each was stored in the mapped topic (TopicBridge.publish)
TopicCopy = Callable[[str, str, list[Publish], str], Awaitable[list[bool]]]


class DeadLetters:
    def __init__(self, meta: MetaStore, store: QueueStore, topic_copy: TopicCopy) -> None:
        """`topic_copy` stores a dead-lettered copy in a mapped exchange's RocketMQ topic."""
        self._meta = meta
        self._store = store
        self._topic_copy = topic_copy

    def reason(self, queue: QueueMeta, d: Delivery, now_ms: int) -> str | None:
        """Why a popped message must not be delivered (None: deliver it)."""
        if d.expires_at_ms and d.expires_at_ms <= now_ms:
            return EXPIRED
        limit = queue.delivery_limit
        if limit is not None and d.attempt > limit + 1:
            return DELIVERY_LIMIT
        return None

    async def screen(self, vhost: str, queue: QueueMeta, got: list[Delivery]) -> list[Delivery]:
        """The deliverable messages of a pop; the others are dead-lettered or dropped here."""
        if queue.delivery_limit is None and not any(d.expires_at_ms for d in got):
            return got  # no expiry, no delivery limit: every one is deliverable (a pop's common case)
        now = int(time.time() * 1000)
        live: list[Delivery] = []
        for d in got:
            why = self.reason(queue, d, now)
            if why is None:
                live.append(d)
            else:
                await self.dead_letter(vhost, queue, d, why)
        return live

    async def dead_letter(self, vhost: str, queue: QueueMeta, d: Delivery, reason: str) -> None:
        """Copy `d` to the queue's dead-letter exchange (if it has one and it routes), then ack it.
        On a failure the original stays in flight and comes back after its lease."""
        try:
            exchange = queue.dead_letter_exchange
            if exchange is not None:
                v = self._meta.doc.vhost(vhost)
                key = queue.dead_letter_routing_key or d.routing_key
                raw = dead_properties(d.properties, queue, d, reason)
                copy = Publish(exchange, key, raw, d.body)
                now = int(time.time() * 1000)
                if v.exchange_type(exchange) is not None:
                    targets, topics = route(v, exchange, key, lambda: dict(decode_properties(raw).headers or {}))
                    for target in targets:
                        expires = expires_at_ms(target, raw, now)
                        await self._store.send(target, [to_outgoing(copy, "", expires, target.max_priority)])
                    for topic in topics:
                        if not all(await self._topic_copy(vhost, topic, [copy], "")):
                            raise Unavailable(f"the dead-lettered copy was not stored in RocketMQ topic {topic}")
            await self._store.ack(queue, [d.handle])
        except SluiceError as exc:
            log.warning("dead-lettering failed; the message comes back after its lease",
                        extra=kv(queue=queue.name, reason=reason, error=exc.message))  # fmt: skip
