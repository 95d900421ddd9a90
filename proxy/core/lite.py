"""Lite consumers in the proxy: SyncLiteSubscription routed to the brokers that hold the lite
topics, receives gathered from every broker of the bind topic, and removal notices delivered on
the clients' Telemetry streams (docs/lite-topics.md).

A lite topic lives on one broker (`routing.lite_broker`, the same hash producers are placed by), so
a client's subscription set is split by broker: each broker stores the part it holds. COMPLETE_ADD
and COMPLETE_REMOVE go to every broker of the bind topic (a broker whose part is empty clears it).

The subscription quota is the client's across brokers. A COMPLETE_ADD names the whole set, checked
here. Every broker answers a sync with the client's count there; the router keeps those counts per
client (a bounded cache), and a PARTIAL_ADD's part may grow the client's set on its broker only up
to the quota less what the client holds on the others. A client this proxy has not seen sync yet
(it reconnected to another proxy) counts nothing elsewhere until its next sync; the Python client's
COMPLETE_ADD every 30 s brings the counts back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

from broker.client.api import (
    NO_CONTEXT,
    CallContext,
    LiteAction,
    LiteApi,
    LiteRemoval,
    LiteSync,
    PopRequest,
    StoredMessage,
)
from common.errors import Forbidden, LiteSubscriptionQuotaExceeded, SluiceError
from common.logs import kv
from proxy.core.gather import pop_anywhere
from proxy.core.routing import lite_broker
from proxy.directory import BrokerDirectory

log = logging.getLogger("sluice.proxy.lite")
Notify = Callable[[LiteRemoval], bool]  # False: the stream's queue is full


class LiteRouter:
    def __init__(self, directory: BrokerDirectory, quota: int, poll_ms: int, clients_max: int) -> None:
        self._dir = directory
        self._quota = quota
        self._poll_s = poll_ms / 1000.0
        self._streams: dict[int, tuple[str, Notify]] = {}  # telemetry stream id -> (client id, deliver)
        self._pending: dict[str, list[LiteRemoval]] = {}  # claimed, not yet delivered (stream queue full)
        # (client id, group, bind topic) -> lite topics the client holds per broker, as brokers last said
        self._held: collections.OrderedDict[tuple[str, str, str], dict[str, int]] = collections.OrderedDict()
        self._held_max = clients_max

    async def sync(self, sync: LiteSync) -> None:
        if sync.action is LiteAction.COMPLETE_ADD and len(set(sync.lite_topics)) > self._quota:
            raise LiteSubscriptionQuotaExceeded(
                f"{len(set(sync.lite_topics))} lite topics asked for; a client may subscribe to {self._quota}"
            )
        routes = await self._dir.route(sync.topic)
        brokers = sorted(r.broker for r in routes if r.permission.writable)
        if not brokers:
            raise Forbidden(f"topic {sync.topic} has no writable queue")
        parts: dict[str, list[str]] = {b: [] for b in brokers}
        for name in sync.lite_topics:
            parts[lite_broker(sync.topic, routes, name)].append(name)
        key = (sync.client_id, sync.group, sync.topic)
        held = self._held.get(key, {})
        complete = sync.action in (LiteAction.COMPLETE_ADD, LiteAction.COMPLETE_REMOVE)
        for broker, names in parts.items():
            if names or complete:
                quota = self._part_quota(held, broker) if sync.action is LiteAction.PARTIAL_ADD else self._quota
                part = LiteSync(sync.group, sync.topic, sync.client_id, sync.action, tuple(names), sync.version,
                                sync.offset, quota)  # fmt: skip
                api: LiteApi = self._dir.broker(broker)
                held = self._remember(key, broker, await api.sync_lite_subscription(part))

    def _part_quota(self, held: dict[str, int], broker: str) -> int:
        """How many lite topics a PARTIAL_ADD may leave the client holding on `broker`: the quota
        less what it holds on the other brokers (never below what it holds there already)."""
        room = self._quota - sum(n for b, n in held.items() if b != broker)
        if room < 1 and held.get(broker, 0) == 0:  # every name of the part would be new there
            raise LiteSubscriptionQuotaExceeded(
                f"the client holds {self._quota - room} lite topics on other brokers; a client may subscribe to "
                f"{self._quota}"
            )
        return max(room, held.get(broker, 0), 1)

    def _remember(self, key: tuple[str, str, str], broker: str, count: int) -> dict[str, int]:
        held = self._held.pop(key, {})
        if count:
            held[broker] = count
        else:
            held.pop(broker, None)
        if held:
            self._held[key] = held  # most recent last
            if len(self._held) > self._held_max:
                self._held.popitem(last=False)
        return held

    async def receive(self, request: PopRequest, *, ctx: CallContext = NO_CONTEXT) -> list[StoredMessage]:
        """Pop from every broker of the bind topic, the first that has messages (proxy/core/gather.py)."""
        routes = await self._dir.route(request.topic)
        brokers = sorted(r.broker for r in routes if r.permission.readable)
        if not brokers:
            raise Forbidden(f"topic {request.topic} has no readable queue")
        return await pop_anywhere(self._dir, brokers, request, ctx=ctx)

    # -- removal notices -------------------------------------------------------------------------

    def register(self, stream_id: int, client_id: str, notify: Notify) -> None:
        self._streams[stream_id] = (client_id, notify)

    def unregister(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    async def poll_once(self) -> None:
        clients = sorted({cid for cid, _ in self._streams.values()})
        if not clients:
            return
        for name in self._dir.broker_names():
            try:
                api: LiteApi = self._dir.broker(name)
                removals = await api.claim_lite_removals(clients)
            except SluiceError as exc:
                log.debug("could not claim lite removals", extra=kv(broker=name, error=exc.message))
                continue
            for r in removals:
                self._pending.setdefault(r.client_id, []).append(r)
        for stream_client, notify in list(self._streams.values()):
            queue = self._pending.get(stream_client)
            while queue:
                if not notify(queue[0]):
                    break
                queue.pop(0)
            if queue is not None and not queue:
                del self._pending[stream_client]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll_once()
            except Exception:
                log.exception("lite removal poll failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._poll_s)
