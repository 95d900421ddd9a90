"""`Janitor`: what a crashed proxy or a stale one leaves behind, removed by every proxy.

- **Orphan queue topics and groups.** A queue is deleted metadata first, then its group and
  topic; a proxy that routed a publish with a copy of the metadata from just before the delete
  (or that could not refresh it) can store into the topic after it was deleted, and the broker
  creates it again. Queue numbers are never reused, so `AMQP_Q<n>` / `AMQP_G<n>` with `n` below
  the document's `next_id` and no queue of that number in it is an orphan, never a queue being
  declared (its metadata entry is written before its topic): it is deleted.
- **Exclusive queues of a proxy that died.** RabbitMQ deletes an exclusive queue with its
  connection; a proxy that is killed cannot. The proxies report their AMQP connections to the
  brokers every `client_report_s` (a broker keeps a report for three intervals): an exclusive
  queue whose owning connection is neither here nor in the reports at two sweeps in a row
  (`2*client_report_s` apart, so a live connection has been reported between them) is deleted.

Every proxy sweeps every `2*client_report_s` (10 s by default): an orphan goes within that
time of its creation, an exclusive queue of a killed proxy within about
`3*client_report_s` (the report expiring) + `4*client_report_s` (two sweeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable

from broker.client.api import BrokerApi, ConnectedClient
from common.errors import NotFound, SluiceError, Unavailable
from common.logs import kv
from proxy.amqp.codes import AmqpError
from proxy.amqp.meta import AMQP_CLIENT_TYPE, MetaDoc, QueueMeta
from proxy.amqp.metastore import MetaStore

log = logging.getLogger("sluice.proxy.amqp")

_TOPIC_RE = re.compile(r"^AMQP_Q([0-9]{1,18})$")
_GROUP_RE = re.compile(r"^AMQP_G([0-9]{1,18})$")


def orphans(doc: MetaDoc, names: list[str], pattern: re.Pattern[str]) -> list[str]:
    """The queue topics or groups among `names` whose queue number was allocated and is in no vhost."""
    live = {q.id for v in doc.vhosts.values() for q in v.queues.values()}
    out = []
    for name in names:
        m = pattern.match(name)
        if m is not None and int(m.group(1)) < doc.next_id and int(m.group(1)) not in live:
            out.append(name)
    return out


class Janitor:
    def __init__(
        self, meta: MetaStore, *, broker: Callable[[str], BrokerApi], broker_names: Callable[[], list[str]],
        local: Callable[[str], bool], delete_queue: Callable[[str, QueueMeta, str], Awaitable[None]],
        interval_s: float,
    ) -> None:  # fmt: skip
        self._meta = meta
        self._broker = broker
        self._broker_names = broker_names
        self._local = local  # a connection id of this proxy that is open
        self._delete_queue = delete_queue
        self.interval_s = interval_s
        self._missing: set[str] = set()  # owners not found at the previous sweep

    async def sweep(self) -> None:
        await self._orphans()
        await self._exclusive()

    async def _orphans(self) -> None:
        for name in sorted(self._broker_names()):
            api = self._broker(name)
            topics = [t.name for t in await api.list_topics()]
            groups = [g.spec.name for g in await api.list_groups()]
            if not any(_TOPIC_RE.match(t) for t in topics) and not any(_GROUP_RE.match(g) for g in groups):
                continue
            await self._meta.refresh()  # after the listing: a queue declared meanwhile is in the document
            for group in orphans(self._meta.doc, groups, _GROUP_RE):
                with contextlib.suppress(NotFound):
                    await api.delete_group(group)
                log.info("orphan AMQP queue group deleted", extra=kv(broker=name, group=group))
            for topic in orphans(self._meta.doc, topics, _TOPIC_RE):
                with contextlib.suppress(NotFound):
                    await api.delete_topic(topic)
                log.info("orphan AMQP queue topic deleted", extra=kv(broker=name, topic=topic))

    async def _reported(self) -> set[str]:
        """The AMQP connections any broker holds a report of (every proxy reports to every broker;
        a broker that does not answer is left out; when none answers the sweep fails)."""
        found: set[str] = set()
        answered = False
        failure: SluiceError | None = None
        for name in sorted(self._broker_names()):
            try:
                clients: list[ConnectedClient] = await self._broker(name).list_clients()
            except SluiceError as exc:
                failure = exc
                continue
            answered = True
            found.update(c.client_id for c in clients if c.client_type == AMQP_CLIENT_TYPE)
        if not answered:  # no broker's reports: nothing can be called gone
            raise failure or Unavailable("no broker is known to ask for the client reports")
        return found

    async def _exclusive(self) -> None:
        owned = [(vhost, q) for vhost, v in self._meta.doc.vhosts.items() for q in v.queues.values()
                 if q.exclusive_owner and not self._local(q.exclusive_owner)]  # fmt: skip
        if not owned:
            self._missing.clear()
            return
        reported = await self._reported()
        missing = {q.exclusive_owner for _, q in owned if q.exclusive_owner not in reported}
        gone = missing & self._missing
        self._missing = missing
        for vhost, q in owned:
            if q.exclusive_owner in gone:
                log.info("exclusive AMQP queue of a connection that is gone deleted",
                         extra=kv(vhost=vhost, queue=q.name, owner=q.exclusive_owner))  # fmt: skip
                await self._delete_queue(vhost, q, q.exclusive_owner)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            if stop.is_set():
                return
            try:
                await self.sweep()
            except (SluiceError, AmqpError) as exc:  # a broker unreachable: the next sweep
                log.warning("AMQP janitor sweep failed", extra=kv(error=str(exc)))
            except Exception:  # never let a bug stop the sweeps
                log.exception("AMQP janitor sweep failed")
