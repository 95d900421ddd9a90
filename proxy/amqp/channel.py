"""One AMQP channel: its methods, content assembly, publishes with confirms, consumers, unacked
deliveries and their settlement.

Publishes of a channel are stored in order by one task (`_publisher`): it takes what has
arrived, stores it with one broker send per queue, then writes the returns and confirms in
publish order; a confirm is written only after every queue's broker stored the message. A publish
is never dropped in silence: one a broker refuses for what it is (its content, a missing mapped
topic) closes the channel with the refusal's code, as RabbitMQ refuses it; one a broker failed to
store is nacked, fails its transaction's commit or, without either, closes the connection with
541 (each counted, `sluice_amqp_publishes_refused_total`). Acks, nacks and rejects are settled
with the brokers by another task (`_settler`), in batches; unacked deliveries go back to their
queues when the channel closes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from pamqp import base, commands

from common import metrics
from common.errors import NotFound, SluiceError
from common.logs import kv
from proxy.amqp import overflow, topology
from proxy.amqp.access import CONFIGURE, READ, WRITE
from proxy.amqp.codes import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    INTERNAL_ERROR,
    NO_ROUTE,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    AmqpError,
    from_sluice,
    reply_text,
)
from proxy.amqp.consumer import Consumer, DeliveryLoop
from proxy.amqp.deadletter import REJECTED, expires_at_ms
from proxy.amqp.frames import (
    BODY,
    HEADER,
    METHOD,
    ContentHeader,
    Frame,
    PublishMethod,
    content_bytes,
    decode_header,
    decode_method,
    deliver_bytes,
    fast_ack,
    fast_publish,
    publish_method,
)
from proxy.amqp.meta import TOPIC_ARG, BindingMeta, QueueMeta, arguments
from proxy.amqp.queues import Delivery, Publish, QueueGone, to_outgoing
from proxy.amqp.routing import decode_headers, route

if TYPE_CHECKING:
    from proxy.amqp.connection import Connection

log = logging.getLogger("sluice.proxy.amqp")

_PUBLISH_BATCH = 256  # publishes one broker round of a channel takes at most
# ... and bodies, past its first publish: one broker send stays well under the internal RPC's
# limit (broker/client/grpc_convert.py MAX_MESSAGE_BYTES) whatever the bodies' sizes.
_PUBLISH_BATCH_BYTES = 32 * 1024 * 1024
# Bodies this large (a publish's, or a batch's for one queue) are joined and encoded in a thread:
# a 16 MiB body is some 10 ms of copying and CRC the event loop would otherwise spend at once.
_LARGE_BODY_BYTES = 1 << 20
# Why a publish was not stored (the `reason` of sluice_amqp_publishes_refused_total):
MAX_SIZE = "max_size"  # its body is over max_body_bytes (406, before it is routed)
REFUSED = "refused"  # a broker refused it for what it is (the channel closes with the refusal's code)
NOT_STORED = "not_stored"  # a broker failed (nack; a failed tx.commit; else the connection closes, 541)
QUEUE_FULL = "queue_full"  # an x-overflow reject-publish queue was full (nack; dropped without confirms, as RabbitMQ)
ACK, REQUEUE, REJECT = "ack", "requeue", "reject"  # how an unacked delivery is settled
_TOPIC_COPY = 0  # the "queue number" of a publish's copy in its exchange's topic, in `_store_batch`'s failures
_GET_SCREENS = 100  # basic.get: pops of expired or over-limit messages before it answers get-empty
# Acks gather this long before the settler sends them (unless this many wait already): an ack per
# message arrives a few at a time, and one broker call per few acks cost more than the pop they
# freed. The client does not wait for an ack's settlement (its credit comes back when the ack
# arrives); a basic.get or queue count after it waits for it (`_settled`).
_SETTLE_GATHER_S = 0.002
_SETTLE_FULL = 64


@dataclass
class _Pending:
    method: PublishMethod
    header: ContentHeader | None = None
    chunks: list[bytes] = field(default_factory=list)
    received: int = 0


@dataclass(slots=True)
class _Routed:
    seq: int  # publisher-confirm sequence number; 0 outside confirm mode
    publish: Publish
    mandatory: bool
    queues: tuple[QueueMeta, ...] = ()  # set by the publisher, from the metadata as it is then
    topics: tuple[str, ...] = ()  # RocketMQ topics of the mapped exchanges it reaches (set with `queues`)


@dataclass(slots=True)
class _Stored:
    """What storing a batch of publishes came to."""

    failed: set[tuple[int, int]] = field(default_factory=set)  # (queue number or _TOPIC_COPY, id of the publish)
    reasons: dict[int, str] = field(default_factory=dict)  # id of a publish not stored -> why (REFUSED etc.)
    refused: AmqpError | None = None  # the first refusal of a publish for what it is (a channel error)
    error: AmqpError | None = None  # the first failure of a broker (a connection error)

    def fail(self, where: int, publishes: list[Publish], exc: BaseException) -> None:
        """`publishes` not stored at `where` because of `exc`: a refusal or a failure."""
        if isinstance(exc, SluiceError):
            err = from_sluice(exc)
        else:  # a bug: logged where it was caught
            err = AmqpError(INTERNAL_ERROR, "storing a publish failed; see the proxy's log")
        err.method = (60, 40)
        reason = NOT_STORED if err.hard else REFUSED
        if err.hard:
            self.error = self.error or err
        else:
            self.refused = self.refused or err
        for p in publishes:
            self.failed.add((where, id(p)))
            self.reasons[id(p)] = reason


@dataclass(frozen=True, slots=True)
class _Unacked:
    queue: QueueMeta
    handle: str
    consumer: Consumer | None  # None: delivered by basic.get
    at: float = field(default_factory=time.monotonic)
    delivery: Delivery | None = None  # kept where a reject dead-letters it (the queue has a DLX)


class Channel:
    def describe(self) -> dict[str, object]:
        """What `sluice admin amqp channels` shows of this channel."""
        return {"channel": self.number, "consumers": len(self._consumers), "unacked": len(self._unacked),
                "prefetch": self._prefetch_consumer, "global_prefetch": self._prefetch_channel,
                "confirm": self._confirm, "transactional": self._tx,
                "queues": sorted(c.queue.name for c in list(self._consumers.values()))}  # fmt: skip

    def __init__(self, conn: Connection, number: int) -> None:
        self.conn = conn
        self.gw = conn.gw
        self.number = number
        self.closing = False  # we sent channel.close; waiting for close-ok
        self._pending: _Pending | None = None
        self._confirm = False
        self._tx = False  # tx.select: publishes and settlements wait for tx.commit
        self._tx_publishes: list[_Routed] = []
        self._tx_settles: list[tuple[int, _Unacked, str]] = []
        self._tx_failed = False  # a publish of the pipeline was not stored (checked by tx.commit)
        self._tx_refused: AmqpError | None = None  # ... refused for what it is (tx.commit answers with it)
        self._seq = 0
        self._next_tag = 0
        self._unacked: dict[int, _Unacked] = {}
        self._consumers: dict[str, Consumer] = {}
        self._prefetch_channel = 0  # basic.qos global: the channel's unacked limit
        self._prefetch_consumer = 0  # basic.qos per consumer: for consumers started after it
        self._credit_changed = asyncio.Event()
        self._publishes: asyncio.Queue[_Routed | None] = asyncio.Queue(maxsize=self.gw.config.max_channel_publishes)
        self._closed = False
        self._settle: asyncio.Queue[tuple[_Unacked, str] | None] = asyncio.Queue()  # (what, ACK etc.); None: the end
        self._tasks: set[asyncio.Task[None]] = set()
        self._publisher_task = self._spawn(self._publisher(), "publisher")
        self._spawn(self._settler(), "settler")

    def _spawn(self, coro: Awaitable[None], what: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"amqp-{self.conn.id}-ch{self.number}-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A channel task that failed (a bug) ends the connection, rather than leave the client
        waiting for confirms or deliveries that will not come; its deliveries go back to their queues."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        log.error("AMQP channel task failed; closing the connection", exc_info=task.exception(),
                  extra=kv(connection=self.conn.id, channel=self.number, task=task.get_name()))  # fmt: skip
        self.conn.abort()

    # -- frames ------------------------------------------------------------------------------------

    async def handle(self, frame: Frame) -> None:
        """A frame for this channel; a soft AmqpError closes the channel, a hard one the connection."""
        if self._pending is not None:
            self._content(frame)
            if self._pending is not None and self._complete():
                await self._published(self._pending)
                self._pending = None
            return
        if frame.type != METHOD:
            raise AmqpError(UNEXPECTED_FRAME, f"content frame (type {frame.type}) on channel {self.number} without a "
                            "basic.publish before it")  # fmt: skip
        # The methods of every message first, read without pamqp (frames.py's fast paths)
        call: Awaitable[None]
        if (published := fast_publish(frame.payload)) is not None:
            call, ids = self._publish(published), (60, 40)
        elif (acked := fast_ack(frame.payload)) is not None:
            call, ids = self._ack_tag(acked), (60, 80)
        else:
            method = decode_method(frame.payload)
            handler = self._handlers().get(type(method))
            ids = (method.index >> 16, method.index & 0xFFFF)
            if handler is None:
                raise AmqpError(NOT_IMPLEMENTED, f"{method.name} is not supported by Sluice yet", ids)
            call = handler(method)
        try:
            await call
        except AmqpError as exc:
            exc.method = exc.method if exc.method != (0, 0) else ids
            raise
        except SluiceError as exc:
            err = from_sluice(exc)
            err.method = ids
            raise err from None

    def _content(self, frame: Frame) -> None:
        pending = self._pending
        assert pending is not None
        if pending.header is None:
            if frame.type != HEADER:
                raise AmqpError(UNEXPECTED_FRAME, f"expected a content header on channel {self.number}, got a frame "
                                f"of type {frame.type}")  # fmt: skip
            header = decode_header(frame.payload)
            if header.class_id != 60:
                raise AmqpError(FRAME_ERROR, f"content header of class {header.class_id}, expected 60 (basic)")
            if header.body_size > self.gw.config.max_body_bytes:
                self._pending = None
                metrics.count_amqp_refused(self.conn.vhost, MAX_SIZE)
                raise AmqpError(PRECONDITION_FAILED, f"message size {header.body_size} is larger than configured max "
                                f"size {self.gw.config.max_body_bytes}", (60, 40))  # fmt: skip
            pending.header = header
            return
        if frame.type != BODY:
            raise AmqpError(UNEXPECTED_FRAME, f"expected a content body on channel {self.number}, got a frame of type "
                            f"{frame.type}")  # fmt: skip
        pending.received += len(frame.payload)
        if pending.received > pending.header.body_size:
            raise AmqpError(FRAME_ERROR, f"content body of {pending.received} bytes, the header announced "
                            f"{pending.header.body_size}")  # fmt: skip
        pending.chunks.append(frame.payload)

    def _complete(self) -> bool:
        p = self._pending
        return p is not None and p.header is not None and p.received == p.header.body_size

    def _handlers(self) -> dict[type, Callable[[Any], Awaitable[None]]]:
        C, Q, E, B = commands.Channel, commands.Queue, commands.Exchange, commands.Basic
        return {
            C.Open: self._reopen, C.Close: self._channel_close, C.Flow: self._flow,
            E.Declare: self._exchange_declare, E.Delete: self._exchange_delete,
            E.Bind: self._exchange_bind, E.Unbind: self._exchange_unbind,
            Q.Declare: self._queue_declare, Q.Bind: self._queue_bind, Q.Unbind: self._queue_unbind,
            Q.Purge: self._queue_purge, Q.Delete: self._queue_delete,
            B.Qos: self._qos, B.Publish: self._publish_decoded, B.Consume: self._consume, B.Cancel: self._cancel,
            B.Ack: self._ack, B.Nack: self._nack, B.Reject: self._reject, B.Get: self._get,
            B.Recover: self._recover, B.RecoverAsync: self._recover,
            commands.Confirm.Select: self._confirm_select,
            commands.Tx.Select: self._tx_select, commands.Tx.Commit: self._tx_commit,
            commands.Tx.Rollback: self._tx_rollback,
        }  # fmt: skip

    @property
    def busy(self) -> bool:
        """Some of its tasks (publishing, consumers, settling) still run."""
        return any(not t.done() for t in self._tasks)

    def send(self, method: base.Frame) -> None:
        self.conn.send_method(self.number, method)

    # -- channel ------------------------------------------------------------------------------------

    async def _channel_close(self, m: commands.Channel.Close) -> None:
        await self.close()
        self.send(commands.Channel.CloseOk())
        self.conn.forget_channel(self.number)

    async def _reopen(self, m: commands.Channel.Open) -> None:
        raise AmqpError(CHANNEL_ERROR, f"second 'channel.open' seen on channel {self.number}")

    async def _flow(self, m: commands.Channel.Flow) -> None:
        if not m.active:
            raise AmqpError(NOT_IMPLEMENTED, "channel.flow with active=false is not supported")
        self.send(commands.Channel.FlowOk(active=True))

    async def close(self) -> None:
        """Store what was published before, stop consumers; unacked deliveries go back to their queues."""
        if self._closed:
            return
        self._closed = True
        self._pending = None
        consumers = list(self._consumers.values())
        self._consumers.clear()
        for c in consumers:
            c.cancelled = True
        self._credit_changed.set()
        self.conn.release(sum(len(r.publish.body) for r in self._tx_publishes))  # never committed
        uncommitted = [u for _, u, _ in self._tx_settles]  # their acks never committed: requeued
        self._tx_publishes, self._tx_settles = [], []
        for u in [*uncommitted, *(self._unacked.pop(tag) for tag in list(self._unacked))]:
            self._settle.put_nowait((u, REQUEUE))
        await self._publishes.put(None)  # the publisher ends after storing what came before
        await asyncio.gather(self._publisher_task, return_exceptions=True)
        for c in consumers:
            await self.gw.consumer_gone(self.conn.vhost, c.queue, self.conn.id)
        self._settle.put_nowait(None)

    async def wait_closed(self) -> None:
        """Until the consumers stopped and the settlements are done (bounded by the broker calls' deadlines)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- exchanges and queues ---------------------------------------------------------------------

    async def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        d = topology.ExchangeDeclare(m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete, m.internal,
                                     arguments(m.arguments))  # fmt: skip
        vhost = self.conn.vhost
        if m.passive:  # read-only, on the newest copy (it may have been declared through another proxy)
            await self.gw.meta.refresh()
            topology.declare_exchange(self.gw.meta.doc, vhost, d)
        else:
            self.conn.perms.exchange(CONFIGURE, d.name)
            topic = d.arguments.get(TOPIC_ARG)
            if isinstance(topic, str) and topology.valid_topic(topic):  # mapped: the topic must exist
                await self.gw.bridge.prepare(vhost, d.name, topic)
            await self.gw.meta.change(lambda doc: topology.declare_exchange(doc, vhost, d))
        if not m.nowait:
            self.send(commands.Exchange.DeclareOk())

    async def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        vhost = self.conn.vhost
        self.conn.perms.exchange(CONFIGURE, m.exchange)
        removed = await self.gw.meta.change(lambda doc: topology.delete_exchange(doc, vhost, m.exchange, m.if_unused))
        if removed is not None:
            await self.gw.bridge.forget(vhost, removed)
        if not m.nowait:
            self.send(commands.Exchange.DeleteOk())

    async def _exchange_bind(self, m: commands.Exchange.Bind) -> None:
        b = BindingMeta(m.source, m.destination, m.routing_key, arguments(m.arguments), to_exchange=True)
        vhost, owner = self.conn.vhost, self.conn.id
        self.conn.perms.exchange(WRITE, m.destination)
        self.conn.perms.exchange(READ, m.source)
        await self.gw.meta.change(lambda doc: topology.bind(doc, vhost, b, owner))
        if not m.nowait:
            self.send(commands.Exchange.BindOk())

    async def _exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        b = BindingMeta(m.source, m.destination, m.routing_key, arguments(m.arguments), to_exchange=True)
        vhost, owner = self.conn.vhost, self.conn.id
        self.conn.perms.exchange(WRITE, m.destination)
        self.conn.perms.exchange(READ, m.source)
        await self.gw.meta.change(lambda doc: topology.unbind(doc, vhost, b, owner))
        if not m.nowait:
            self.send(commands.Exchange.UnbindOk())

    async def _queue_declare(self, m: commands.Queue.Declare) -> None:
        name = m.queue or f"amq.gen-{secrets.token_urlsafe(16)}"
        d = topology.QueueDeclare(name, m.passive, m.durable, m.exclusive, m.auto_delete,
                                  arguments(m.arguments))  # fmt: skip
        vhost, owner = self.conn.vhost, self.conn.id
        if m.passive:
            await self.gw.meta.refresh()
        else:
            self.conn.perms.queue(CONFIGURE, name)
        home = self.gw.meta.home_broker()
        now_ms = int(time.time() * 1000)
        queue = await self.gw.meta.change(lambda doc: topology.declare_queue(doc, vhost, d, owner, home, now_ms))
        if queue.exclusive_owner:
            self.conn.exclusive.add(queue.name)
        await self._settled()
        ready, _ = await self.gw.store.counts(queue)
        if not m.nowait:
            consumers = self.gw.consumer_count(vhost, queue)
            self.send(commands.Queue.DeclareOk(queue=name, message_count=ready, consumer_count=consumers))

    def _queue(self, name: str) -> QueueMeta:
        return topology.find_queue(self.gw.meta.doc, self.conn.vhost, name, self.conn.id)

    async def _find_queue(self, name: str) -> QueueMeta:
        """The queue from the cached metadata, else from the newest (it may have just been declared elsewhere)."""
        try:
            return self._queue(name)
        except AmqpError as exc:
            if exc.code != NOT_FOUND:
                raise
        await self.gw.meta.refresh()
        return self._queue(name)

    async def _queue_bind(self, m: commands.Queue.Bind) -> None:
        b = BindingMeta(m.exchange, m.queue, m.routing_key, arguments(m.arguments))
        vhost, owner = self.conn.vhost, self.conn.id
        self.conn.perms.queue(WRITE, m.queue)
        self.conn.perms.exchange(READ, m.exchange)
        await self.gw.meta.change(lambda doc: topology.bind(doc, vhost, b, owner))
        if not m.nowait:
            self.send(commands.Queue.BindOk())

    async def _queue_unbind(self, m: commands.Queue.Unbind) -> None:
        b = BindingMeta(m.exchange, m.queue, m.routing_key, arguments(m.arguments))
        vhost, owner = self.conn.vhost, self.conn.id
        self.conn.perms.queue(WRITE, m.queue)
        self.conn.perms.exchange(READ, m.exchange)
        await self.gw.meta.change(lambda doc: topology.unbind(doc, vhost, b, owner))
        self.send(commands.Queue.UnbindOk())

    async def _queue_purge(self, m: commands.Queue.Purge) -> None:
        self.conn.perms.queue(READ, m.queue)
        queue = await self._find_queue(m.queue)
        await self._settled()
        count = await self.gw.store.purge(queue)
        if not m.nowait:
            self.send(commands.Queue.PurgeOk(message_count=count))

    async def _queue_delete(self, m: commands.Queue.Delete) -> None:
        vhost = self.conn.vhost
        self.conn.perms.queue(CONFIGURE, m.queue)
        try:
            queue = await self._find_queue(m.queue)
        except AmqpError as exc:
            if exc.code != NOT_FOUND:
                raise
            if not m.nowait:  # deleting a missing queue is fine (RabbitMQ 3.x+)
                self.send(commands.Queue.DeleteOk(message_count=0))
            return
        await self._settled()
        ready, _ = await self.gw.store.counts(queue)
        what = f"queue '{queue.name}' in vhost '{vhost}'"
        if m.if_empty and ready:
            raise AmqpError(PRECONDITION_FAILED, f"{what} not empty")
        if m.if_unused and self.gw.consumer_count(vhost, queue):
            raise AmqpError(PRECONDITION_FAILED, f"{what} in use")
        await self.gw.delete_queue(vhost, queue, self.conn.id)
        if not m.nowait:
            self.send(commands.Queue.DeleteOk(message_count=ready))

    # -- publishing -------------------------------------------------------------------------------

    async def _confirm_select(self, m: commands.Confirm.Select) -> None:
        if self._tx:
            raise AmqpError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self._confirm = True
        if not m.nowait:
            self.send(commands.Confirm.SelectOk())

    # -- transactions -----------------------------------------------------------------------------

    async def _tx_select(self, m: commands.Tx.Select) -> None:
        if self._confirm:
            raise AmqpError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self._tx = True
        self.send(commands.Tx.SelectOk())

    async def _tx_commit(self, m: commands.Tx.Commit) -> None:
        """Store the transaction's publishes (in order, after what came before) and settle its
        acks, nacks and rejects; commit-ok once the brokers hold all of it."""
        if not self._tx:
            raise AmqpError(PRECONDITION_FAILED, "channel is not transactional")
        publishes, settles = self._tx_publishes, self._tx_settles
        self._tx_publishes, self._tx_settles = [], []
        await self._publishes.join()
        self._tx_failed, self._tx_refused = False, None
        for r in publishes:
            await self._publishes.put(r)
        for _, u, action in settles:
            self._settle.put_nowait((u, action))
        await self._settled()
        if self._tx_refused is not None:  # what the client must change: a channel error
            raise self._tx_refused
        if self._tx_failed:
            raise AmqpError(INTERNAL_ERROR, "a broker did not store the transaction's publishes; some may be stored")
        self.send(commands.Tx.CommitOk())

    async def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        """Drop the transaction's publishes; its acknowledged deliveries are unacknowledged again."""
        if not self._tx:
            raise AmqpError(PRECONDITION_FAILED, "channel is not transactional")
        self.conn.release(sum(len(r.publish.body) for r in self._tx_publishes))
        for tag, u, _ in self._tx_settles:
            self._unacked[tag] = u
            if u.consumer is not None:
                u.consumer.unacked += 1
        self._unacked = dict(sorted(self._unacked.items()))
        self._tx_publishes, self._tx_settles = [], []
        self.send(commands.Tx.RollbackOk())

    async def _publish_decoded(self, m: commands.Basic.Publish) -> None:
        await self._publish(publish_method(m))

    async def _publish(self, m: PublishMethod) -> None:
        self.conn.perms.exchange(WRITE, m.exchange)
        kind = self.gw.meta.doc.vhost(self.conn.vhost).exchange_type(m.exchange)
        if kind is None:
            await self.gw.meta.refresh()
            topology.find_exchange(self.gw.meta.doc, self.conn.vhost, m.exchange)
        found = self.gw.meta.doc.vhost(self.conn.vhost).exchanges.get(m.exchange)
        if found is not None and found.internal:
            raise AmqpError(ACCESS_REFUSED, f"cannot publish to internal exchange '{m.exchange}' in vhost "
                            f"'{self.conn.vhost}'")  # fmt: skip
        if m.immediate:
            raise AmqpError(NOT_IMPLEMENTED, "immediate=true")
        self._pending = _Pending(m)

    async def _published(self, p: _Pending) -> None:
        assert p.header is not None
        m = p.method
        if p.received < _LARGE_BODY_BYTES:
            body = b"".join(p.chunks)
        else:
            body = await asyncio.get_running_loop().run_in_executor(None, b"".join, p.chunks)
        publish = Publish(m.exchange, m.routing_key, p.header.properties, body)
        if self._confirm:
            self._seq += 1
        await self.conn.admit(len(publish.body))
        routed = _Routed(self._seq if self._confirm else 0, publish, m.mandatory)
        if self._tx:
            self._tx_publishes.append(routed)
        else:
            await self._publishes.put(routed)

    async def _publisher(self) -> None:
        end = False
        while not end:
            batch: list[_Routed] = []
            size = 0
            item = await self._publishes.get()
            while item is not None:
                batch.append(item)
                size += len(item.publish.body)
                if len(batch) >= _PUBLISH_BATCH or size >= _PUBLISH_BATCH_BYTES or self._publishes.empty():
                    break
                item = self._publishes.get_nowait()
            end = item is None
            taken = len(batch) + end
            await self._route(batch)
            try:
                outcome = await self._store_batch(batch)
            finally:
                self.conn.release(size)
            failed = outcome.failed
            acks: list[tuple[int, bool]] = []
            cut: int | None = None  # confirms written: those before the first refused publish (its channel closes)
            for r in batch:
                if not r.queues and not r.topics and r.mandatory:
                    self._return(r.publish)
                stored = (
                    not any((q.id, id(r.publish)) in failed for q in r.queues)
                    and (_TOPIC_COPY, id(r.publish)) not in failed
                )
                if not stored:
                    reason = outcome.reasons.get(id(r.publish), NOT_STORED)
                    metrics.count_amqp_refused(self.conn.vhost, reason)
                    if reason == REFUSED and cut is None:
                        cut = len(acks)
                if r.seq:
                    acks.append((r.seq, stored))
                self._tx_failed |= not stored
            self._confirms(acks[:cut])
            await self.conn.flush()
            self._not_stored(outcome)
            for _ in range(taken):
                self._publishes.task_done()

    def _not_stored(self, outcome: _Stored) -> None:
        """Tell the client of publishes a broker refused or failed to store, beyond their nacks: a
        refusal closes the channel (in a transaction: its commit), as RabbitMQ refuses a publish; a
        failure without confirms or a transaction closes the connection (541), the only way left
        to tell the client."""
        if outcome.refused is not None:
            if self._tx:
                self._tx_refused = self._tx_refused or outcome.refused
            elif not self._closed:  # a task of its own: closing the channel waits for this publisher
                self._spawn(self.conn.fail_channel(self, outcome.refused), "refused")
        elif outcome.error is not None and not self._confirm and not self._tx:
            self.conn.fail(AmqpError(INTERNAL_ERROR, f"publishes on channel {self.number} were not stored: "
                                     f"{outcome.error.text}", (60, 40)))  # fmt: skip

    def _return(self, p: Publish) -> None:
        self.send(commands.Basic.Return(reply_code=NO_ROUTE, reply_text="NO_ROUTE", exchange=p.exchange,
                                        routing_key=p.routing_key))  # fmt: skip
        self.conn.send_raw(content_bytes(self.number, p.properties, p.body, self.conn.frame_max))

    def _confirms(self, acks: list[tuple[int, bool]]) -> None:
        if acks and all(ok for _, ok in acks) and [s for s, _ in acks] == list(range(acks[0][0], acks[-1][0] + 1)):
            self.send(commands.Basic.Ack(delivery_tag=acks[-1][0], multiple=len(acks) > 1))
            return
        for seq, ok in acks:
            self.send(
                commands.Basic.Ack(delivery_tag=seq) if ok else commands.Basic.Nack(delivery_tag=seq, requeue=False)
            )

    async def _route(self, batch: list[_Routed]) -> None:
        """Each publish's queues, from the newest metadata: a binding made through another proxy
        before the publish was sent is seen (one cheap read per batch; the cached copy when the
        metadata's broker does not answer)."""
        if not batch:
            return
        try:
            await self.gw.meta.refresh()
        except SluiceError as exc:
            log.debug("AMQP metadata not refreshed before routing", extra=kv(error=exc.message))
        vhost = self.gw.meta.doc.vhost(self.conn.vhost)
        for r in batch:
            p = r.publish
            queues, topics = route(vhost, p.exchange, p.routing_key, partial(decode_headers, p.properties))
            r.queues, r.topics = tuple(queues), tuple(topics)

    async def _store_batch(self, batch: list[_Routed]) -> _Stored:
        """Store every routed publish, one send per queue; those not stored (a queue's broker
        refused or failed, or a full reject-publish queue refused it) and why."""
        per_queue: dict[int, tuple[QueueMeta, list[Publish]]] = {}
        per_topic: dict[str, list[Publish]] = {}
        out = _Stored()
        for r in batch:
            refusal = next(filter(None, (self.gw.bridge.refusal(t, r.publish) for t in r.topics)), None)
            if refusal is not None:  # refused as a whole: stored nowhere
                out.fail(_TOPIC_COPY, [r.publish], refusal)
                continue
            for q in r.queues:
                per_queue.setdefault(q.id, (q, []))[1].append(r.publish)
            for topic in r.topics:
                per_topic.setdefault(topic, []).append(r.publish)
        host = self.conn.peer
        now_ms = int(time.time() * 1000)

        def records(q: QueueMeta, accepted: list[Publish]) -> list[bytes]:
            return [to_outgoing(p, host, expires_at_ms(q, p.properties, now_ms), q.max_priority) for p in accepted]

        async def one(q: QueueMeta, publishes: list[Publish]) -> None:
            accepted = await overflow.admit(self.gw.store, q, publishes) if overflow.rejects(q) else publishes
            kept = {id(p) for p in accepted}
            for p in publishes:
                if id(p) not in kept:
                    out.failed.add((q.id, id(p)))
                    out.reasons[id(p)] = QUEUE_FULL
            if accepted:
                if sum(len(p.body) for p in accepted) < _LARGE_BODY_BYTES:
                    outgoing = records(q, accepted)
                else:  # CRC and copies of large bodies: in a thread, the loop runs between their steps
                    outgoing = await asyncio.get_running_loop().run_in_executor(None, records, q, accepted)
                await self.gw.store.send(q, outgoing)
                await overflow.trim(self.gw.store, self.gw.dead, self.conn.vhost, q)

        async def topic_copy(topic: str, publishes: list[Publish]) -> None:
            errors = await self.gw.bridge.publish(self.conn.vhost, topic, publishes, host)
            for p, err in zip(publishes, errors, strict=True):
                if err is not None:
                    out.fail(_TOPIC_COPY, [p], err)

        items = list(per_queue.values())
        copies = [topic_copy(t, ps) for t, ps in per_topic.items()]
        results = await asyncio.gather(*(one(q, ps) for q, ps in items), *copies, return_exceptions=True)
        for res, (topic, publishes) in zip(results[len(items) :], per_topic.items(), strict=True):
            if isinstance(res, BaseException):
                log.error("storing AMQP publishes in their mapped topic failed", exc_info=res,
                          extra=kv(topic=topic))  # fmt: skip
                out.fail(_TOPIC_COPY, publishes, res)
        results = results[: len(items)]
        for (q, publishes), res in zip(items, results, strict=True):
            if isinstance(res, QueueGone):  # deleted since the routing: not routed there, as in RabbitMQ
                continue
            if isinstance(res, BaseException):
                if not isinstance(res, SluiceError):
                    log.error("storing AMQP publishes failed", exc_info=res)
                else:
                    log.warning("AMQP publishes not stored", extra=kv(queue=q.name, error=res.message))
                out.fail(q.id, publishes, res)
        return out

    # -- consuming --------------------------------------------------------------------------------

    async def _qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise AmqpError(NOT_IMPLEMENTED, "prefetch_size is not supported (RabbitMQ does not support it either)")
        if m.global_:
            self._prefetch_channel = m.prefetch_count
        else:
            self._prefetch_consumer = m.prefetch_count
        self._credit_changed.set()
        self.send(commands.Basic.QosOk())

    def _credit(self, c: Consumer) -> int:
        limits = [self.gw.config.max_prefetch]
        if c.prefetch and not c.no_ack:
            limits.append(c.prefetch - c.unacked)
        if self._prefetch_channel and not c.no_ack:
            limits.append(self._prefetch_channel - len(self._unacked))
        return min(limits)

    async def _consume(self, m: commands.Basic.Consume) -> None:
        self.conn.perms.queue(READ, m.queue)
        queue = await self._find_queue(m.queue)
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in self._consumers:
            raise AmqpError(COMMAND_INVALID, f"consumer tag '{tag}' is already in use on channel {self.number}")
        if m.exclusive and self.gw.consumer_count(self.conn.vhost, queue):
            raise AmqpError(ACCESS_REFUSED, f"queue '{queue.name}' in vhost '{self.conn.vhost}' in exclusive use")
        await self.gw.expiry.used(self.conn.vhost, queue)
        c = Consumer(tag, self.conn.vhost, queue, m.no_ack, self._prefetch_consumer)
        self._consumers[tag] = c
        self.gw.consumer_added(self.conn.vhost, queue)
        if not m.nowait:
            self.send(commands.Basic.ConsumeOk(consumer_tag=tag))
        loop = DeliveryLoop(c, self.gw.store, credit=self._credit, wake=self._credit_changed, deliver=self._deliver,
                            flush=self.conn.flush, gone=self._queue_gone, screen=self._screen,
                            long_poll_ms=self.gw.config.long_poll_ms)  # fmt: skip
        c.task = self._spawn(loop.run(), f"consumer-{tag}")

    async def _screen(self, queue: QueueMeta, got: list[Delivery]) -> list[Delivery]:
        return await self.gw.dead.screen(self.conn.vhost, queue, got)

    def _deliver(self, c: Consumer, d: Delivery) -> None:
        self._next_tag += 1
        if not c.no_ack:
            self._unacked[self._next_tag] = _Unacked(c.queue, d.handle, c, delivery=_kept(c.queue, d))
            c.unacked += 1
        self.conn.send_raw(deliver_bytes(self.number, c.tag, self._next_tag, d.redelivered, d.exchange, d.routing_key))
        self.conn.send_raw(content_bytes(self.number, d.properties, d.body, self.conn.frame_max))

    def _queue_gone(self, c: Consumer) -> None:
        if self._consumers.pop(c.tag, None) is None:
            return
        c.cancelled = True
        self.gw.consumer_removed(self.conn.vhost, c.queue)
        if self.conn.cancel_notify:
            self.send(commands.Basic.Cancel(consumer_tag=c.tag, nowait=True))

    def queue_deleted(self, vhost: str, name: str) -> None:
        """A queue deleted through this proxy: its consumers here are cancelled (and told)."""
        for c in list(self._consumers.values()):
            if c.vhost == vhost and c.queue.name == name:
                self._queue_gone(c)

    async def _cancel(self, m: commands.Basic.Cancel) -> None:
        c = self._consumers.pop(m.consumer_tag or "", None)
        if c is not None:
            c.cancelled = True
            self._credit_changed.set()
            await self.gw.consumer_gone(self.conn.vhost, c.queue, self.conn.id)
        if not m.nowait:
            self.send(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))

    async def _get(self, m: commands.Basic.Get) -> None:
        self.conn.perms.queue(READ, m.queue)
        queue = await self._find_queue(m.queue)
        await self.gw.expiry.used(self.conn.vhost, queue)
        await self._settled()
        got: list[Delivery] = []
        for _ in range(_GET_SCREENS):  # expired or over-limit messages are dead-lettered, not answered
            popped = await self.gw.store.pop(queue, 1, 0)
            got = await self._screen(queue, popped)
            if got or not popped:
                break
        if not got:
            self.send(commands.Basic.GetEmpty())
            return
        d = got[0]
        self._next_tag += 1
        if m.no_ack:
            await self.gw.store.ack(queue, [d.handle])
        else:
            self._unacked[self._next_tag] = _Unacked(queue, d.handle, None, delivery=_kept(queue, d))
        ready, _ = await self.gw.store.counts(queue)
        self.send(commands.Basic.GetOk(delivery_tag=self._next_tag, redelivered=d.redelivered, exchange=d.exchange,
                                       routing_key=d.routing_key, message_count=ready))  # fmt: skip
        self.conn.send_raw(content_bytes(self.number, d.properties, d.body, self.conn.frame_max))

    # -- leases -------------------------------------------------------------------------------------

    def held(self) -> dict[int, tuple[QueueMeta, list[str]]]:
        """The unacknowledged deliveries' handles, by queue number (their leases to renew)."""
        out: dict[int, tuple[QueueMeta, list[str]]] = {}
        for u in self._unacked.values():
            out.setdefault(u.queue.id, (u.queue, []))[1].append(u.handle)
        return out

    def overdue(self, timeout_s: float) -> bool:
        """Some delivery has waited for its ack longer than `timeout_s`."""
        first = next(iter(self._unacked.values()), None)  # the oldest: tags grow with time
        return first is not None and time.monotonic() - first.at > timeout_s

    # -- settling -----------------------------------------------------------------------------------

    def _settle_later(self, taken: list[tuple[int, _Unacked]], action: str) -> None:
        for tag, u in taken:
            if self._tx:
                self._tx_settles.append((tag, u, action))
            else:
                self._settle.put_nowait((u, action))

    def _take(self, tag: int, multiple: bool) -> list[tuple[int, _Unacked]]:
        if multiple:
            tags = [t for t in self._unacked if tag == 0 or t <= tag]
        elif tag in self._unacked:
            tags = [tag]
        else:
            raise AmqpError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        taken = [(t, self._unacked.pop(t)) for t in tags]
        for _, u in taken:
            if u.consumer is not None:
                u.consumer.unacked -= 1
        self._credit_changed.set()
        return taken

    async def _ack(self, m: commands.Basic.Ack) -> None:
        self._settle_later(self._take(m.delivery_tag, m.multiple), ACK)

    async def _ack_tag(self, ack: tuple[int, bool]) -> None:
        self._settle_later(self._take(*ack), ACK)

    async def _nack(self, m: commands.Basic.Nack) -> None:
        self._settle_later(self._take(m.delivery_tag, m.multiple), REQUEUE if m.requeue else REJECT)

    async def _reject(self, m: commands.Basic.Reject) -> None:
        self._settle_later(self._take(m.delivery_tag or 0, False), REQUEUE if m.requeue else REJECT)

    async def _recover(self, m: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        for _, u in self._take(0, True):  # basic.recover is not transactional
            self._settle.put_nowait((u, REQUEUE))
        if isinstance(m, commands.Basic.Recover):
            self.send(commands.Basic.RecoverOk())

    async def _settler(self) -> None:
        """Acks (one broker call per queue and round) and requeues, until the channel's end marker."""
        done = False
        while not done:
            batch = [await self._settle.get()]
            if batch[0] is not None and self._settle.qsize() < _SETTLE_FULL:
                await asyncio.sleep(_SETTLE_GATHER_S)  # let a few more acks come: one broker call for them all
            while not self._settle.empty():
                batch.append(self._settle.get_nowait())
            acks: dict[int, tuple[QueueMeta, list[str]]] = {}
            requeued: dict[int, QueueMeta] = {}
            calls: list[Awaitable[None]] = []
            for item in batch:
                if item is None:
                    done = True
                    continue
                u, action = item
                if action == REQUEUE:
                    calls.append(self.gw.store.requeue(u.queue, u.handle))
                    requeued[u.queue.id] = u.queue
                elif action == REJECT and u.delivery is not None:
                    calls.append(self.gw.dead.dead_letter(self.conn.vhost, u.queue, u.delivery, REJECTED))
                else:  # an ack, or a reject without a dead-letter exchange: the message is done
                    acks.setdefault(u.queue.id, (u.queue, []))[1].append(u.handle)
            calls += [self.gw.store.ack(q, hs) for q, hs in acks.values()]
            for res in await asyncio.gather(*calls, return_exceptions=True):
                if isinstance(res, NotFound):
                    continue  # the queue is gone, and its messages with it
                if isinstance(res, BaseException):
                    log.warning("an AMQP ack or requeue failed; the message comes back after its invisible time",
                                extra=kv(error=getattr(res, "message", str(res))))  # fmt: skip
            for q in requeued.values():  # a requeue can take a drop-head queue over its limits, as in RabbitMQ
                await overflow.trim(self.gw.store, self.gw.dead, self.conn.vhost, q)
            for _ in batch:
                self._settle.task_done()

    async def _settled(self) -> None:
        """Until the publishes (stored or refused), acks, requeues and rejects this channel
        received so far reached the brokers: a later basic.get, queue count, purge or delete on
        the channel sees them, as RabbitMQ's would."""
        if not self._closed:
            await self._publishes.join()
            await self._settle.join()


def _kept(queue: QueueMeta, d: Delivery) -> Delivery | None:
    return d if queue.dead_letter_exchange is not None else None


def close_method(err: AmqpError) -> commands.Channel.Close:
    return commands.Channel.Close(reply_code=err.code, reply_text=err.text, class_id=err.method[0],
                                  method_id=err.method[1])  # fmt: skip


__all__ = ["Channel", "close_method", "reply_text"]
