"""x-expires: a queue unused for that long is deleted (docs/amqp.md).

A use is a declare, a basic.get or a consumer. Every proxy shares the last use through the
metadata document (`QueueMeta.used_ms`, kept only for queues with x-expires): a basic.get or a
new consumer records it when the recorded one is older than a third of the queue's x-expires, and
a proxy with consumers of the queue records it as often while they last. Every proxy sweeps every
`SWEEP_S`: a queue without consumers here and unused for its x-expires is removed from the
metadata (compare-and-set, so a use recorded meanwhile by another proxy keeps it), then its group
and topic, as a queue.delete does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from common.errors import SluiceError
from common.logs import kv
from proxy.amqp import topology
from proxy.amqp.codes import AmqpError
from proxy.amqp.meta import QueueMeta
from proxy.amqp.metastore import MetaStore

log = logging.getLogger("sluice.proxy.amqp")

SWEEP_S = 0.5


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueueExpiry:
    def __init__(self, meta: MetaStore, consumers: Callable[[str, QueueMeta], int],
                 removed: Callable[[str, QueueMeta], Awaitable[None]]) -> None:  # fmt: skip
        self._meta = meta
        self._consumers = consumers
        self._removed = removed  # drops the removed queue's group and topic, tells its consumers

    async def used(self, vhost: str, queue: QueueMeta) -> None:
        """Record a use of `queue` (a no-op without x-expires, or when recorded recently)."""
        expires = queue.expires_ms
        if expires is None:
            return
        stored = self._meta.doc.vhosts.get(vhost)
        current = None if stored is None else stored.queues.get(queue.name)
        now = _now_ms()
        if current is not None and current.id == queue.id and now - current.used_ms < expires / 3:
            return
        await self._meta.change(lambda doc: topology.touch_queue(doc, vhost, queue, now))

    async def sweep(self) -> None:
        now = _now_ms()
        for vhost, v in list(self._meta.doc.vhosts.items()):
            for queue in list(v.queues.values()):
                expires = queue.expires_ms
                if expires is None:
                    continue
                if self._consumers(vhost, queue):
                    await self.used(vhost, queue)
                elif now - queue.used_ms >= expires:
                    await self._expire(vhost, queue, now)

    async def _expire(self, vhost: str, queue: QueueMeta, now: int) -> None:
        removed = await self._meta.change(lambda doc: topology.expire_queue(doc, vhost, queue, now))
        if removed is not None:
            log.info("AMQP queue expired (x-expires)", extra=kv(vhost=vhost, queue=queue.name))
            await self._removed(vhost, removed)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep()
            except (SluiceError, AmqpError) as exc:  # the metadata or a broker unreachable: next round
                log.warning("AMQP queue expiry sweep failed", extra=kv(error=str(exc)))
            except Exception:  # never let a bug stop the sweeps
                log.exception("AMQP queue expiry sweep failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SWEEP_S)
