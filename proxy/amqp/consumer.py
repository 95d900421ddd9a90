"""One `basic.consume`: a task that pops from the queue's broker while the consumer has credit
(its own prefetch and its channel's) and writes `basic.deliver`s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from common.errors import NotFound, SluiceError
from common.logs import kv
from proxy.amqp.meta import QueueMeta
from proxy.amqp.queues import Delivery, QueueStore

log = logging.getLogger("sluice.proxy.amqp")

_RETRY_S = 1.0
_BATCH = 32  # deliveries a pop asks for at most (the broker's own cap)
_GATHER_S = 0.002  # with little credit and many unacked: how long acks may gather before a pop


@dataclass(eq=False)
class Consumer:
    tag: str
    vhost: str
    queue: QueueMeta
    no_ack: bool
    prefetch: int  # 0: no limit of its own
    unacked: int = 0
    cancelled: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class DeliveryLoop:
    """Runs one consumer; `credit` says how many more it may take now (0: wait for `wake`),
    `deliver` writes one delivery (and records it unacked), `gone` tells the client the queue is gone."""

    def __init__(
        self,
        consumer: Consumer,
        store: QueueStore,
        *,
        credit: Callable[[Consumer], int],
        wake: asyncio.Event,
        deliver: Callable[[Consumer, Delivery], None],
        flush: Callable[[], Awaitable[None]],
        gone: Callable[[Consumer], None],
        screen: Callable[[QueueMeta, list[Delivery]], Awaitable[list[Delivery]]],
        long_poll_ms: int,
    ) -> None:
        self._c = consumer
        self._store = store
        self._credit = credit
        self._wake = wake
        self._deliver = deliver
        self._flush = flush
        self._gone = gone
        self._screen = screen
        self._long_poll_ms = long_poll_ms

    async def run(self) -> None:
        c = self._c
        while not c.cancelled:
            credit = self._credit(c)
            if credit <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            if credit < _BATCH and c.unacked > credit:  # acks are coming: a few more make a fuller pop
                await asyncio.sleep(_GATHER_S)
                credit = self._credit(c)
                if credit <= 0:
                    continue
            try:
                got = await self._store.pop(c.queue, credit, self._long_poll_ms)
            except NotFound:  # the queue was deleted (here or through another proxy)
                if not c.cancelled:
                    self._gone(c)
                return
            except SluiceError as exc:
                log.warning("AMQP consumer could not receive; retrying",
                            extra=kv(queue=c.queue.name, consumer=c.tag, error=exc.message))  # fmt: skip
                await asyncio.sleep(_RETRY_S)
                continue
            if c.cancelled:  # popped after the cancel: back to the queue at once
                await self._requeue(got)
                return
            got = await self._screen(c.queue, got)  # expired, over the delivery limit: dead-lettered
            for d in got:
                self._deliver(c, d)
            if c.no_ack and got:
                await self._store.ack(c.queue, [d.handle for d in got])
            await self._flush()

    async def _requeue(self, got: list[Delivery]) -> None:
        for d in got:
            try:
                await self._store.requeue(self._c.queue, d.handle)
            except SluiceError as exc:
                where = kv(queue=self._c.queue.name, error=exc.message)
                log.warning("could not requeue a message popped after its consumer was cancelled (it comes back "
                            "after its invisible time)", extra=where)  # fmt: skip
