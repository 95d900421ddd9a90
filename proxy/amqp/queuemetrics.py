"""Per-queue Prometheus metrics of the AMQP gateway (docs/metrics.md, `sluice_amqp_queue_*`).

The queue store counts what this proxy published into, delivered from and acknowledged on each
queue (plain integers per queue number, no labelled children on the hot path). At scrape time the
numbers are named after the metadata document (vhost, queue), so a deleted queue's series end.
Ready and unacked come from the queue's broker; a scrape cannot wait for brokers, so it shows
the counts the previous scrape asked for (at most one refresh runs at a time, and none without
scrapes) - one scrape interval old.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from common import metrics
from common.errors import SluiceError
from common.logs import kv
from proxy.amqp.meta import MetaDoc, QueueMeta

log = logging.getLogger("sluice.proxy.amqp")


class QueueMetrics:
    def __init__(self) -> None:
        self.published: Counter[int] = Counter()  # queue number -> messages this proxy stored into it
        self.delivered: Counter[int] = Counter()  # every delivery (basic.deliver / get-ok), redeliveries too
        self.acked: Counter[int] = Counter()  # acknowledged on the broker
        self._depth: dict[int, tuple[int, int]] = {}  # queue number -> (ready, unacked) at the last refresh
        self._refresh: asyncio.Task[None] | None = None

    def samples(self, doc: MetaDoc, consumers: Callable[[str, QueueMeta], int],
                counts: Callable[[QueueMeta], Awaitable[tuple[int, int]]]) -> list[metrics.Sample]:  # fmt: skip
        queues = [(vhost, q) for vhost, v in doc.vhosts.items() for q in v.queues.values()]
        out: list[metrics.Sample] = []
        for vhost, q in queues:
            labels = (vhost, q.name)
            out += [(metrics.AMQP_QUEUE_CONSUMERS, labels, float(consumers(vhost, q))),
                    (metrics.AMQP_QUEUE_PUBLISHED, labels, float(self.published[q.id])),
                    (metrics.AMQP_QUEUE_DELIVERED, labels, float(self.delivered[q.id])),
                    (metrics.AMQP_QUEUE_ACKED, labels, float(self.acked[q.id]))]  # fmt: skip
            if q.id in self._depth:
                ready, unacked = self._depth[q.id]
                out += [(metrics.AMQP_QUEUE_READY, labels, float(ready)),
                        (metrics.AMQP_QUEUE_UNACKED, labels, float(unacked))]  # fmt: skip
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not scraped from the event loop's thread: no refresh
            return out
        if self._refresh is None or self._refresh.done():
            refresh = self._refresh_depth([q for _, q in queues], doc.next_id, counts)
            self._refresh = loop.create_task(refresh, name="amqp-queue-depth")
        return out

    async def _refresh_depth(self, queues: list[QueueMeta], next_id: int,
                             counts: Callable[[QueueMeta], Awaitable[tuple[int, int]]]) -> None:  # fmt: skip
        depth: dict[int, tuple[int, int]] = {}
        for q in queues:
            try:
                depth[q.id] = await counts(q)
            except SluiceError as exc:  # deleted meanwhile, or its broker is down: no sample this time
                log.debug("AMQP queue depth not read", extra=kv(queue=q.name, error=str(exc)))
        self._depth = depth
        live = {q.id for q in queues}  # numbers from next_id on were allocated after the snapshot
        for counter in (self.published, self.delivered, self.acked):
            for gone in [i for i in counter if i < next_id and i not in live]:
                del counter[gone]

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
