"""Lite consumers in the proxy: SyncLiteSubscription routed to the brokers that hold the lite
topics, receives gathered from every broker of the bind topic, and removal notices delivered on
the clients' Telemetry streams (docs/lite-topics.md).

A lite topic lives on one broker (`routing.lite_broker`, the same hash producers are placed by), so
a client's subscription set is split by broker: each broker stores the part it holds. COMPLETE_ADD
and COMPLETE_REMOVE go to every broker of the bind topic (a broker whose part is empty clears it).

The subscription quota is the client's across brokers. A COMPLETE_ADD names the whole set, checked
here. Every broker answers a sync with the client's count there; the router keeps those counts, and
a PARTIAL_ADD's part may grow the client's set on its broker only up to the quota less what the
client holds on the others. A client this proxy has not seen sync yet (it reconnected to another
proxy) counts nothing elsewhere until its next sync; the Python client's COMPLETE_ADD every 30 s
brings the counts back.

A lite topic's broker follows the bind topic's route, and a route can grow after a client
subscribed (a topic just created, a broker registering it a moment later; a broker added). The
router remembers the lite topics each client synced through it and the brokers they were placed
over; each poll (`replace_moved`) it moves the lite topics whose broker the route now names
differently (PARTIAL_ADD there, PARTIAL_REMOVE where they were), so a consumer does not wait for
its client's next COMPLETE_ADD to get the messages producers now send there.

What the router knows of a client's lite subscriptions of one bind topic (placement and counts
per broker) is one record (`_Subscriptions`) under (client id, group, bind topic), in one map
bounded by `clients_max`, least recently synced or moved forgotten first: a client's placement
and counts are kept or forgotten together.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

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
from proxy.core.routing import lite_owner, writable_brokers
from proxy.directory import BrokerDirectory

log = logging.getLogger("sluice.proxy.lite")
Notify = Callable[[LiteRemoval], bool]  # False: the stream's queue is full
_Key = tuple[str, str, str]  # (client id, group, bind topic)


@dataclass
class _Subscriptions:
    """What this proxy knows of one client's lite subscriptions of one bind topic: the lite topics
    it synced through this proxy and the writable brokers of the route they were placed over, and
    how many lite topics it holds per broker as each broker last answered (a broker's count also
    counts what the client synced through other proxies)."""

    brokers: tuple[str, ...]
    names: set[str] = field(default_factory=set)
    held: dict[str, int] = field(default_factory=dict)


class LiteRouter:
    def __init__(self, directory: BrokerDirectory, quota: int, poll_ms: int, clients_max: int) -> None:
        self._dir = directory
        self._quota = quota
        self._poll_s = poll_ms / 1000.0
        self._streams: dict[int, tuple[str, Notify]] = {}  # telemetry stream id -> (client id, deliver)
        self._pending: dict[str, list[LiteRemoval]] = {}  # claimed, not yet delivered (stream queue full)
        self._known: collections.OrderedDict[_Key, _Subscriptions] = collections.OrderedDict()  # recent last
        self._known_max = clients_max

    async def sync(self, sync: LiteSync) -> None:
        if sync.action is LiteAction.COMPLETE_ADD and len(set(sync.lite_topics)) > self._quota:
            raise LiteSubscriptionQuotaExceeded(
                f"{len(set(sync.lite_topics))} lite topics asked for; a client may subscribe to {self._quota}"
            )
        routes = await self._dir.route(sync.topic)
        brokers = tuple(writable_brokers(routes))
        if not brokers:
            raise Forbidden(f"topic {sync.topic} has no writable queue")
        parts: dict[str, list[str]] = {b: [] for b in brokers}
        for name in sync.lite_topics:
            parts[lite_owner(brokers, name)].append(name)
        key = (sync.client_id, sync.group, sync.topic)
        known = self._known.get(key)
        if known is not None and sync.action in (LiteAction.PARTIAL_ADD, LiteAction.PARTIAL_REMOVE):
            # what it holds follows the route first, so that one tuple places all it holds
            await self._replace(key, known, brokers)
        complete = sync.action in (LiteAction.COMPLETE_ADD, LiteAction.COMPLETE_REMOVE)
        for broker, names in parts.items():
            if names or complete:
                quota = self._part_quota(key, broker) if sync.action is LiteAction.PARTIAL_ADD else self._quota
                part = LiteSync(sync.group, sync.topic, sync.client_id, sync.action, tuple(names), sync.version,
                                sync.offset, quota)  # fmt: skip
                api: LiteApi = self._dir.broker(broker)
                count = await api.sync_lite_subscription(part)
                self._count(key, brokers, broker, count)
        self._place(key, brokers, sync)

    def _place(self, key: _Key, brokers: tuple[str, ...], sync: LiteSync) -> None:
        """Note the lite topics `sync` leaves the client with, placed over `brokers`."""
        known = self._known.get(key) or _Subscriptions(brokers)
        if sync.action is LiteAction.PARTIAL_ADD:
            known.names |= set(sync.lite_topics)
        elif sync.action is LiteAction.PARTIAL_REMOVE:
            known.names -= set(sync.lite_topics)
        elif sync.action is LiteAction.COMPLETE_ADD:
            known.names = set(sync.lite_topics)
        else:
            known.names = set()
        known.brokers = brokers
        self._remember(key, known)

    def _count(self, key: _Key, brokers: tuple[str, ...], broker: str, count: int) -> None:
        """Note the client's count on `broker` as the broker answered a sync (`brokers`: the route
        the sync placed over, for a client not known yet)."""
        known = self._known.get(key) or _Subscriptions(brokers)
        if count:
            known.held[broker] = count
        else:
            known.held.pop(broker, None)
        self._remember(key, known)

    def _remember(self, key: _Key, known: _Subscriptions) -> None:
        """Keep `known` as what this proxy knows of `key`, most recent last, while it says anything;
        the least recent are forgotten beyond `clients_max` (its placement and counts together)."""
        self._known.pop(key, None)
        if known.names or known.held:
            self._known[key] = known
            while len(self._known) > self._known_max:
                self._known.popitem(last=False)

    async def replace_moved(self) -> int:
        """Move the remembered lite topics whose broker the bind topic's route now names
        differently; how many moved. A move that fails is tried again at the next call."""
        moved = 0
        routes_of: dict[str, tuple[str, ...] | None] = {}
        for key, known in list(self._known.items()):
            _, _, topic = key
            if not known.names:  # counts only: nothing this proxy placed
                continue
            if topic not in routes_of:
                try:
                    routes = await self._dir.route(topic)
                except SluiceError:
                    routes_of[topic] = None
                else:
                    routes_of[topic] = tuple(writable_brokers(routes)) or None
            brokers = routes_of[topic]
            if brokers is not None:
                try:
                    moved += await self._replace(key, known, brokers)
                except SluiceError as exc:
                    log.warning("could not move lite subscriptions to the broker the route names now",
                                extra=kv(client=key[0], group=key[1], topic=topic, error=exc.message))  # fmt: skip
        return moved

    async def _replace(self, key: _Key, known: _Subscriptions, brokers: tuple[str, ...]) -> int:
        """Move `known`'s lite topics whose broker differs over `brokers`; how many moved."""
        if brokers == known.brokers:
            return 0
        moves: dict[tuple[str, str], list[str]] = collections.defaultdict(list)  # (from, to) -> names
        for name in sorted(known.names):
            old, new = lite_owner(known.brokers, name), lite_owner(brokers, name)
            if old != new:
                moves[(old, new)].append(name)
        for (old, new), names in moves.items():
            await self._move(key, brokers, old, new, tuple(names))
        known.brokers = brokers
        return sum(map(len, moves.values()))

    async def _move(self, key: _Key, brokers: tuple[str, ...], old: str, new: str, names: tuple[str, ...]) -> None:
        client_id, group, topic = key
        quota = self._part_quota(key, new, moving=(old, len(names)))
        add = LiteSync(group, topic, client_id, LiteAction.PARTIAL_ADD, names, quota=quota)
        to: LiteApi = self._dir.broker(new)
        self._count(key, brokers, new, await to.sync_lite_subscription(add))
        log.info("lite subscriptions moved to the broker the route names now",
                 extra=kv(client=client_id, group=group, topic=topic, lite_topics=len(names), broker=new))  # fmt: skip
        try:
            frm: LiteApi = self._dir.broker(old)
            remove = LiteSync(group, topic, client_id, LiteAction.PARTIAL_REMOVE, names)
            self._count(key, brokers, old, await frm.sync_lite_subscription(remove))
        except SluiceError as exc:  # the added part counts; the old broker no longer gets these names' messages
            log.debug("could not drop moved lite subscriptions", extra=kv(broker=old, error=exc.message))

    def _part_quota(self, key: _Key, broker: str, moving: tuple[str, int] = ("", 0)) -> int:
        """How many lite topics a PARTIAL_ADD may leave the client holding on `broker`: the quota
        less what it holds on the other brokers (never below what it holds there already).
        `moving`: (broker, n) when the add moves n lite topics from that broker, where they then
        no longer count (the move drops them there once added)."""
        known = self._known.get(key)
        held = {} if known is None else dict(known.held)
        frm, moved = moving
        if frm in held:
            held[frm] = max(held[frm] - moved, 0)
        room = self._quota - sum(n for b, n in held.items() if b != broker)
        if room < 1 and held.get(broker, 0) == 0:  # every name of the part would be new there
            raise LiteSubscriptionQuotaExceeded(
                f"the client holds {self._quota - room} lite topics on other brokers; a client may subscribe to "
                f"{self._quota}"
            )
        return max(room, held.get(broker, 0), 1)

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
            try:
                await self.replace_moved()
            except Exception:
                log.exception("moving lite subscriptions failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._poll_s)
