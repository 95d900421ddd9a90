"""`LiteService`: lite topics in one broker: send, subscriptions, fair ordered pops, expiry.

* **Send.** A LITE message names its lite topic (system property `LITE_TOPIC`). The lite topic is
  created on first use (quota: the bind topic's `max_lite_topics`) and the message is stored in the
  lite topic's own queue of the bind topic (broker/lite/keys.py), whatever queue the producer chose.
* **Subscriptions** belong to a (group, bind topic, client id), are stored (broker/lite/state.py)
  and change with `sync` (SyncLiteSubscription's four actions). A client's set is loaded into
  memory when it syncs or pops; a client idle for `idle_client_s` is dropped from memory only.
* **Pops** of a lite consumer take, round robin over its subscribed lite topics that may hold
  messages (`ready`), at most one new message per lite topic, and only from a lite topic with
  nothing in flight for the group: each lite topic is consumed in order (its next message once the
  previous one is acknowledged, dead-lettered, or visible again for a retry; on a replicated
  primary once every in-sync member holds that ack or dead letter, as for a FIFO message group:
  broker/popstate.py, "Lite topics"), and one hot lite topic cannot starve the others. Dispatches
  mark the lite topics they touched ready for the clients watching them and wake their long polls.
* **Filter subscriptions** (`LiteSync.filters`: `a/+/c`, `a/#`; common/litefilter.py) are stored
  (`lite_filt`) and held, all of them, in a trie per bind topic. A send matches each lite topic it
  writes against the trie, before its append: a (group, client) whose filter matches and that is
  not yet subscribed to the lite topic is subscribed to it then, the group starting at the lite
  topic's end (this send's first message), so from then on it is one of the client's lite topics
  like any other. Removing a filter unsubscribes the lite topics no remaining filter matches (and
  forgets the group's position in those no other client of the group still reads). Filters synced
  with a namespace's scope as their topic (`lite_scope`: `ns%*`) apply to every LITE topic of that
  namespace on this broker, those created later too (a trie of their own, matched with the bind
  topic's): the MQTT gateway's filters whose first level is a wildcard.
* **Expiry.** A lite topic without a new message for its bind topic's `lite_expiration_s` is
  removed by a sweep over the expiry index (due first, bounded per run); its subscribers get a
  `LiteRemoval` that proxies claim and turn into NotifyUnsubscribeLiteCommand.

Event-loop thread only (like the pop engine whose internals the pop reuses).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from broker.client.api import (
    GroupInfo,
    LiteAction,
    LiteOffset,
    LiteOffsetPolicy,
    LiteRemoval,
    LiteSync,
    LiteTopicInfo,
    LiteTopicList,
    PopRequest,
    SendResult,
    StoredMessage,
    TopicSpec,
    lite_scope,
)
from broker.config import LimitsConfig, LiteConfig
from broker.consumer import PopEngine, _Cold
from broker.filter import MessageFilter, TagFilter
from broker.lite.heads import deliver_heads, read_heads
from broker.lite.state import LiteRecord, LiteState
from broker.longpoll import LongPollHub, group_key, lite_client_key
from broker.messages import at_queues, validate_all
from broker.popstate import PopBatch, PopState
from broker.store.store import MessageStore
from broker.store.writer import offsets_of, span_of
from broker.trace import TraceRecorder
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import (
    BadRequest,
    IllegalInvisibleTime,
    IllegalLiteTopic,
    LiteSubscriptionQuotaExceeded,
    LiteTopicQuotaExceeded,
    MessageTypeConflict,
)
from common.litefilter import FilterTrie, matches
from common.logs import kv
from common.model import MessageType, TopicInfo, validate_lite_filter, validate_lite_topic_name
from common.record import SYSPROP_LITE_TOPIC, MessageRecord

log = logging.getLogger("sluice.broker.lite")
MAX_REMOVALS_PER_CLIENT = 10_000
MAX_READY_CHECKS = 4_096  # lite topics a pop looks at, at most (the rotation continues next pop)
SUBSCRIBERS_CACHE_MAX = 100_000  # lite topics whose subscribers a send's filter matching remembers


_LITE_ONLY = frozenset({MessageType.LITE})
_MESSAGE_ID = attrgetter("message_id")


def is_lite(spec: TopicSpec) -> bool:
    return spec.message_types == _LITE_ONLY


@dataclass(eq=False)
class _Client:
    """A lite consumer's subscriptions in memory (while it is active)."""

    group: str
    topic: str
    topic_id: int
    client_id: str
    names: dict[str, int] = field(default_factory=dict)  # subscribed lite topic -> its queue id
    qids: set[int] = field(default_factory=set)
    ready: collections.OrderedDict[int, None] = field(default_factory=collections.OrderedDict)
    version: int = 0
    seen: float = 0.0  # the clock's monotonic time of its last pop or sync
    wake_key: str = ""  # its long polls' own key (set on creation)

    def __post_init__(self) -> None:
        self.wake_key = lite_client_key(self.group, self.client_id)


ClientKey = tuple[str, str, str]  # group, bind topic, client id


class LiteService:
    def __init__(
        self, *, store: MessageStore, state: LiteState, pop_state: PopState, engine: PopEngine, hub: LongPollHub,
        trace: TraceRecorder, config: LiteConfig, limits: LimitsConfig, host: str, clock: Clock = SYSTEM_CLOCK,
    ) -> None:  # fmt: skip
        """`clock`: lite topic expiry and idle clients are measured on it (common/clock.py)."""
        self._store = store
        self._clock = clock
        self.state = state
        self._pop = pop_state
        self._engine = engine
        self._hub = hub
        self._trace = trace
        self._cfg = config
        self._limits = limits
        self._host = host
        self._clients: dict[ClientKey, _Client] = {}
        self._watch: dict[str, dict[int, set[_Client]]] = {}  # bind topic -> queue id -> clients
        self._removals: dict[str, list[LiteRemoval]] = {}
        self.expired = 0
        self.created = 0
        # Filter subscriptions: bind topic -> trie of (group, client id); and each client's filters.
        self._tries: dict[str, FilterTrie[tuple[str, str]]] = {}
        self._filters: dict[ClientKey, set[str]] = {}
        # (bind topic id, lite name) -> (group, client id) subscribed to it, for lite topics a filter
        # matched lately (bounded: a full cache starts over; a miss is one prefix scan).
        self._subscribed: dict[tuple[int, str], set[tuple[str, str]]] = {}
        for group, tid, client_id, text in state.all_filters():
            topic = store.index.topic_name(tid)
            if topic is not None:
                self._tries.setdefault(topic, FilterTrie()).add(text, (group, client_id))
                self._filters.setdefault((group, topic, client_id), set()).add(text)

    # -- send ------------------------------------------------------------------------------------

    def _expiration_ms(self, spec: TopicSpec) -> int:
        return max(1, spec.lite_expiration_s) * 1000

    def _max_topics(self, spec: TopicSpec) -> int:
        return spec.max_lite_topics or self._cfg.max_lite_topics

    def _granule_ms(self, spec: TopicSpec) -> int:
        return max(100, min(60_000, self._expiration_ms(spec) // 10))

    def resolve(
        self, spec: TopicSpec, topic_id: int, names: Iterable[str], now: int, *, write: bool
    ) -> tuple[dict[str, LiteRecord], set[str]]:
        """The lite topics `names` of a bind topic and which of them are new: those are created
        together, or none is (ILLEGAL_LITE_TOPIC for a bad name, LITE_TOPIC_QUOTA_EXCEEDED beyond
        the quota). Only new names are checked: an existing lite topic's passed when it was
        created. A write moves an existing one's expiry (once per granule)."""
        wanted = list(dict.fromkeys(names))
        found = self.state.get_many(topic_id, wanted)
        missing = [name for name in wanted if name not in found]
        for name in missing:
            validate_lite_topic_name(name, self._cfg.max_name_chars)
        if write:
            granule = self._granule_ms(spec)
            stale = [(name, rec) for name, rec in found.items() if now - rec.last_write_ms >= granule]
            if stale:
                self.state.touch(topic_id, stale, now, self._expiration_ms(spec))
        if missing:
            held, limit = self.state.count(topic_id), self._max_topics(spec)
            if held + len(missing) > limit:
                raise LiteTopicQuotaExceeded(
                    f"topic {spec.name} holds {held} lite topics on this broker and may hold {limit}; "
                    f"{len(missing)} more cannot be created"
                )
            created = self.state.create_many(topic_id, missing, now, now + self._expiration_ms(spec))
            self._store.note_empty_queues(spec.name, [rec.queue_id for rec in created.values()])
            found.update(created)
            self.created += len(missing)
        return found, set(missing)

    async def send(
        self, spec: TopicSpec, info: TopicInfo, messages: list[MessageRecord], client_id: str
    ) -> list[SendResult]:
        """Store each message in its lite topic's queue: one append, one trace event (its producer
        is `client_id`: a send is one producer's request), validated
        column by column (message by message only to name the error of a batch that fails).
        `info`: the bind topic `spec` describes, as messages are validated against it."""
        validate_all(messages, info, self._limits, _LITE_ONLY)
        named = [m.system_properties.get(SYSPROP_LITE_TOPIC) for m in messages]
        if None in named:
            raise IllegalLiteTopic(f"topic {spec.name} is a LITE topic: a message needs a lite topic")
        names = [n for n in named if n is not None]  # checked by `resolve` if new
        tid = self.state.topic_id(spec.name, create=True)
        assert tid is not None
        records, created = self.resolve(spec, tid, names, self._clock.now_ms(), write=True)
        tries = [t for t in (self._tries.get(spec.name), self._tries.get(lite_scope(spec.name))) if t and t.count]
        if tries:
            self._match_filters(spec.name, tid, tries, records, created)
        qids = [records[name].queue_id for name in names]
        results = await self._store.append(at_queues(messages, qids))
        self._trace.sent_append(spec.name, *span_of(results), client_id, messages[0].born_host)
        return list(map(SendResult, map(_MESSAGE_ID, messages), qids, offsets_of(results)))

    def _match_filters(self, topic: str, tid: int, tries: list[FilterTrie[tuple[str, str]]],
                       records: dict[str, LiteRecord], created: set[str]) -> None:  # fmt: skip
        """Subscribe the clients whose filters (in the bind topic's trie or its namespace's) match
        lite topics of a send and that are not yet subscribed to them, their group starting at the
        lite topic's end (no await: nothing is appended between this and the send's append, so the
        send's first message is the start)."""
        for name, rec in records.items():
            owners = tries[0].match(name) if len(tries) == 1 else tries[0].match(name) | tries[1].match(name)
            if not owners:
                continue
            subscribed = self._subscribers_of(tid, name)
            new = owners - subscribed
            if not new:
                continue
            qid = rec.queue_id
            start = 0 if name in created else self._store.queue_bounds(topic, qid)[1]
            batch = self._pop.batch()
            for group in {g for g, _ in new}:
                if name in created or self._pop.cursors(group, topic, [qid])[0] is None:
                    batch.set_cursor(group, topic, qid, start)
            batch.commit()
            for group, client_id in new:
                self.state.change_subscriptions(group, tid, client_id, {name}, set())
                subscribed.add((group, client_id))
                client = self._clients.get((group, topic, client_id))
                if client is not None:
                    self._watch_add(client, name, qid)
                    client.ready[qid] = None
                    self._hub.notify([client.wake_key])

    def _subscribers_of(self, tid: int, name: str) -> set[tuple[str, str]]:
        key = (tid, name)
        held = self._subscribed.get(key)
        if held is None:
            if len(self._subscribed) >= SUBSCRIBERS_CACHE_MAX:
                self._subscribed.clear()
            held = self._subscribed[key] = set(self.state.subscribers(tid, name))
        return held

    def _forget_subscribers(self, tid: int, names: Iterable[str]) -> None:
        for name in names:
            self._subscribed.pop((tid, name), None)

    def on_dispatch(self, topic: str, qids: Iterable[int]) -> None:
        """Mark dispatched lite queues of a bind topic ready for the clients that watch them, and
        wake those. They join the rotation in queue order, which is creation order: lite topics
        written together tend to be popped together, and their heads, stored back to back, read
        with one pread. Only watched queues are looked at further (a send touches one queue per
        message, most of them often unwatched)."""
        watch = self._watch.get(topic)
        if not watch:
            return
        woken: set[str] = set()
        for qid in sorted(filter(watch.__contains__, qids)):
            for client in watch[qid]:
                client.ready[qid] = None
                woken.add(client.wake_key)
        if woken:
            self._hub.notify(woken)

    # -- subscriptions ---------------------------------------------------------------------------

    def _client(self, group: str, spec: TopicSpec, client_id: str) -> _Client:
        key = (group, spec.name, client_id)
        client = self._clients.get(key)
        if client is None:
            tid = self.state.topic_id(spec.name, create=True)
            assert tid is not None
            client = _Client(group, spec.name, tid, client_id)
            for name, rec in self.state.get_many(tid, sorted(self.state.subscriptions(group, tid, client_id))).items():
                self._watch_add(client, name, rec.queue_id)
            client.ready.update((q, None) for q in client.qids)
            self._clients[key] = client
        client.seen = self._clock.monotonic()
        return client

    def _watch_add(self, client: _Client, name: str, qid: int) -> None:
        client.names[name] = qid
        client.qids.add(qid)
        self._watch.setdefault(client.topic, {}).setdefault(qid, set()).add(client)

    def _watch_drop(self, client: _Client, name: str) -> None:
        qid = client.names.pop(name, None)
        if qid is None:
            return
        client.qids.discard(qid)
        client.ready.pop(qid, None)
        watch = self._watch.get(client.topic)
        watchers = None if watch is None else watch.get(qid)
        if watch is None or watchers is None:
            return
        watchers.discard(client)
        if not watchers:
            del watch[qid]
            if not watch:
                del self._watch[client.topic]

    def sync(self, spec: TopicSpec, sync: LiteSync) -> int:
        """Apply a subscription change; how many lite topics (filters, for a filter sync) the client
        then holds here."""
        if sync.filters:
            return self.sync_filters(spec.name, sync, [spec.name])
        client = self._client(sync.group, spec, sync.client_id)
        if sync.version and sync.version < client.version:
            return len(client.names)  # an older request overtaken by a newer one: nothing to change
        wanted: list[str] = [validate_lite_topic_name(n, self._cfg.max_name_chars) for n in sync.lite_topics]
        current = set(client.names)  # loaded from the store with the client
        action = sync.action
        if action is LiteAction.PARTIAL_ADD:
            new = current | set(wanted)
        elif action is LiteAction.PARTIAL_REMOVE:
            new = current - set(wanted)
        elif action is LiteAction.COMPLETE_ADD:
            new = set(wanted)
        else:
            new = set()
        quota = min(sync.quota or self._cfg.max_subscriptions, self._cfg.max_subscriptions)
        if len(new) > quota and len(new) > len(current):
            raise LiteSubscriptionQuotaExceeded(
                f"client {sync.client_id} would subscribe to {len(new)} lite topics of {spec.name}; "
                f"its quota is {quota}"
            )
        added, removed = new - current, current - new
        starts = added if sync.offset is None else set(wanted) & new
        records, created = self.resolve(
            spec, client.topic_id, sorted(new & (added | starts)), self._clock.now_ms(), write=False
        )
        batch = self._pop.batch()
        for name in starts & created:  # new and empty: the group starts at its beginning
            batch.set_cursor(sync.group, spec.name, records[name].queue_id, 0)
        known = [records[name].queue_id for name in starts - created]
        self._start_many(batch, sync.group, spec.name, known, sync.offset)
        batch.commit()
        self.state.change_subscriptions(sync.group, client.topic_id, sync.client_id, added, removed)
        self._forget_subscribers(client.topic_id, added | removed)
        for name in removed:
            self._watch_drop(client, name)
        for name in added:
            self._watch_add(client, name, records[name].queue_id)
        # Ready: what may hold a message for the group now, i.e. what was added or had its start
        # moved; a lite topic this sync created is empty, and its first dispatch makes it ready.
        client.ready.update((records[name].queue_id, None) for name in (added | starts) & new if name not in created)
        if sync.version:
            client.version = sync.version
        if added:
            self._hub.notify([client.wake_key])
        log.debug("lite subscription synced", extra=kv(group=sync.group, topic=spec.name, action=action.name,
                                                       added=len(added), removed=len(removed)))  # fmt: skip
        return len(client.names)

    def sync_filters(self, name: str, sync: LiteSync, binds: list[str]) -> int:
        """Apply a change of a client's filter subscriptions of `name` (a bind topic, or a
        namespace's scope whose filters apply to its LITE topics `binds`); how many filters it then
        holds there. A removed filter unsubscribes the lite topics of `binds` no remaining filter of
        the client (of the bind topic or its scope) matches."""
        key = (sync.group, name, sync.client_id)
        current = self._filters.get(key, set())
        wanted = {validate_lite_filter(f, self._cfg.max_name_chars) for f in sync.lite_topics}
        action = sync.action
        if action is LiteAction.PARTIAL_ADD:
            new = current | wanted
        elif action is LiteAction.PARTIAL_REMOVE:
            new = current - wanted
        elif action is LiteAction.COMPLETE_ADD:
            new = wanted
        else:
            new = set()
        quota = min(sync.quota or self._cfg.max_subscriptions, self._cfg.max_subscriptions)
        if len(new) > quota and len(new) > len(current):
            raise LiteSubscriptionQuotaExceeded(
                f"client {sync.client_id} would hold {len(new)} filter subscriptions of {name}; its quota is {quota}"
            )
        added, removed = new - current, current - new
        tid = self.state.topic_id(name, create=True)
        assert tid is not None
        if added or removed:
            self.state.change_filters(sync.group, tid, sync.client_id, added, removed)
            trie = self._tries.setdefault(name, FilterTrie())
            owner = (sync.group, sync.client_id)
            for text in added:
                trie.add(text, owner)
            for text in removed:
                trie.remove(text, owner)
            if new:
                self._filters[key] = new
            else:
                self._filters.pop(key, None)
        if removed or action is LiteAction.COMPLETE_REMOVE:
            for bind in binds:
                bind_tid = self.state.topic_id(bind, create=True)
                assert bind_tid is not None
                held = self._filters.get((sync.group, bind, sync.client_id), set())
                held = held | self._filters.get((sync.group, lite_scope(bind), sync.client_id), set())
                self._unsubscribe_unmatched(bind, bind_tid, sync.group, sync.client_id, held)
        log.debug("lite filters synced", extra=kv(group=sync.group, topic=name, action=action.name,
                                                  added=len(added), removed=len(removed)))  # fmt: skip
        return len(new)

    def _unsubscribe_unmatched(self, topic: str, tid: int, group: str, client_id: str, filters: set[str]) -> None:
        """Drop the client's lite topics that none of `filters` matches; the group's position in one
        is forgotten too when no other client of the group reads it (a later match starts afresh)."""
        names = self.state.subscriptions(group, tid, client_id)
        gone = {n for n in names if not any(matches(f, n) for f in filters)}
        if not gone:
            return
        self.state.change_subscriptions(group, tid, client_id, set(), gone)
        self._forget_subscribers(tid, gone)
        client = self._clients.get((group, topic, client_id))
        records = self.state.get_many(tid, sorted(gone))
        for name in gone:
            if client is not None:
                self._watch_drop(client, name)
            rec = records.get(name)
            if rec is not None and not any(g == group for g, _ in self.state.subscribers(tid, name)):
                self._pop.delete_cursor(group, topic, rec.queue_id)

    def _start_many(self, batch: PopBatch, group: str, topic: str, qids: list[int], option: LiteOffset | None) -> None:
        """Set where the group starts in newly subscribed lite topics that exist. Without an option
        (or LAST) a lite topic the group has a cursor in keeps it, so the cursors come from one
        multi-get and only lite topics without one are looked at; an explicit option places each."""
        if option is None or option.policy is LiteOffsetPolicy.LAST:
            for qid, cursor in zip(qids, self._pop.cursors(group, topic, qids), strict=True):
                if cursor is None:
                    batch.set_cursor(group, topic, qid, self._store.queue_bounds(topic, qid)[0])
            return
        for qid in qids:
            batch.set_cursor(group, topic, qid, self._start_of(topic, qid, option))

    def _start_of(self, topic: str, qid: int, option: LiteOffset) -> int:
        low, high = self._store.queue_bounds(topic, qid)
        if option.policy is LiteOffsetPolicy.MIN:
            return low
        if option.policy is LiteOffsetPolicy.MAX:
            return high
        if option.offset is not None:
            return min(max(option.offset, low), high)
        if option.tail_n is not None:
            return max(low, high - max(0, option.tail_n))
        if option.timestamp_ms is not None:
            return self._store.offset_for_timestamp(topic, qid, option.timestamp_ms)
        return low

    # -- pop -------------------------------------------------------------------------------------

    async def pop(self, req: PopRequest, group: GroupInfo, spec: TopicSpec, filt: MessageFilter) -> list[StoredMessage]:
        cfg = self._engine._cfg
        if not cfg.min_invisible_ms <= req.invisible_ms <= cfg.max_invisible_ms:
            raise IllegalInvisibleTime(
                f"invisible duration {req.invisible_ms} ms is outside "
                f"[{cfg.min_invisible_ms}, {cfg.max_invisible_ms}] ms"
            )
        g = req.group
        client = self._client(g, spec, req.lite_client)
        n = max(1, min(req.max_messages, cfg.max_batch_messages))
        deadline = time.monotonic() + min(req.long_poll_ms, cfg.max_long_poll_ms) / 1000.0
        # Its own key (dispatches into its lite topics, acks freeing their next message, its syncs)
        # and the group's (redeliveries, resets): not the bind topic's, which every send moves.
        keys = (client.wake_key, group_key(g))
        while True:
            snapshot = self._hub.snapshot(keys)
            found = self._pop_once(client, group, spec.name, filt, n, req.invisible_ms, max(1, req.lite_window))
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            await self._hub.wait(snapshot, remaining)
            client.seen = self._clock.monotonic()

    def _pop_once(
        self,
        client: _Client,
        group: GroupInfo,
        topic: str,
        filt: MessageFilter,
        n: int,
        invisible_ms: int,
        window: int = 1,
    ) -> list[StoredMessage]:
        """Redeliveries first, then new messages from up to n lite topics taken round robin from the
        client's `ready` ones (those that may hold a message for it): one from each, skipping lite
        topics with a message in flight for the group, or whose last one's ack the in-sync replicas
        do not hold yet (their order: `PopState.settling`); with a `window` above 1, up to that many
        in flight per lite topic (the MQTT gateway's sessions, which promise no order across
        redeliveries and so do not wait for the replicas)."""
        pop = self._pop
        ordered = window == 1
        if ordered:
            pop.release_settled()
        # A new primary hands out no new message of a lite topic until the replicas hold the state
        # its term began with (`PopState.fifo_open`): a lite topic's last ack may be here only.
        closed = ordered and not pop.fifo_open()
        now = self._clock.now_ms()
        until = now + invisible_ms
        out: list[StoredMessage] = []
        batch = self._pop.batch()
        cold = _Cold()
        engine = self._engine
        g = client.group
        engine._redeliver(group, topic, client.qids, filt, n, now, until, batch, out, set(), cold)
        plain = isinstance(filt, TagFilter) and filt.tags is None
        inflight = self._pop.inflight
        ready = client.ready
        again: list[int] = []  # back into the rotation after this pop, not visited twice in it
        checks = 0
        while len(out) < n and ready and checks < MAX_READY_CHECKS:
            picked: list[int] = []
            while ready and len(out) + len(picked) < n and checks < MAX_READY_CHECKS:
                qid, _ = ready.popitem(last=False)
                checks += 1
                if qid not in client.qids:
                    continue
                if closed or inflight.get((g, topic, qid), 0) >= window or (ordered and pop.settling(g, topic, qid)):
                    again.append(qid)  # in order: its next message once this one is done (and held)
                    continue
                picked.append(qid)
            if not picked:
                break
            general = picked
            if plain and window == 1:
                heads, _, general = read_heads(self._store, self._pop, g, topic, client.topic_id, picked)
                for head, rec in deliver_heads(self._store, heads, g, topic, until, batch):
                    out.append(engine._deliver(rec, 1, self._pop.first_version, until, g))
                    if head.more:
                        again.append(head.queue_id)
            for qid in general:
                before = len(out)
                take = 1 if window == 1 else max(1, min(window - inflight.get((g, topic, qid), 0), n - before))
                engine._take_new(group, topic, qid, filt, before + take, until, batch, out, set(), cold)
                if len(out) > before:
                    again.append(qid)  # may hold more
        ready.update(dict.fromkeys(again))
        batch.commit()
        engine.delivered[topic] += len(out)
        if out and self._trace.enabled:
            self._trace.delivered_many(topic, g, [(m.queue_id, m.queue_offset, m.delivery_attempt) for m in out])
        return out

    def after_ack(self, group: str, topic: str, queue_ids: Iterable[int]) -> None:
        """Acknowledged lite messages (of the lite queues `queue_ids`) free their lite topics' next
        ones: wake the polls of the group's clients that watch those lite topics."""
        woken: set[str] = set()
        watch = self._watch.get(topic, {})
        for qid in queue_ids:
            woken.update(c.wake_key for c in watch.get(qid, ()) if c.group == group)
        if woken:
            self._hub.notify(woken)

    # -- expiry and removals ---------------------------------------------------------------------

    def sweep(self, specs: dict[str, TopicSpec]) -> int:
        """Remove expired lite topics (at most `sweep_batch`); how many were removed."""
        now = self._clock.now_ms()
        removed = 0
        for expires, tid, name in self.state.due(now, self._cfg.sweep_batch):
            topic = self._store.index.topic_name(tid)
            spec = specs.get(topic) if topic is not None else None
            rec = self.state.get(tid, name)
            if spec is None or rec is None:  # the lite topic or its bind topic is gone: a leftover key
                self.state.drop_expiry_key(expires, tid, name)
                continue
            exp_ms = self._expiration_ms(spec)
            if now - rec.last_write_ms < exp_ms:  # a stale key (the expiration changed): re-index
                self.state.drop_expiry_key(expires, tid, name)
                self.state.touch(tid, [(name, rec)], rec.last_write_ms, exp_ms)
                continue
            self._remove(spec.name, tid, name, rec, expires)
            removed += 1
        self._forget_idle()
        return removed

    def _remove(self, topic: str, tid: int, name: str, rec: LiteRecord, expires: int) -> None:
        subscribers = self.state.subscribers(tid, name)
        self.state.remove(tid, name, rec, expires)
        self._subscribed.pop((tid, name), None)
        for group, client_id in subscribers:
            self._pop.delete_cursor(group, topic, rec.queue_id)
            queue = self._removals.setdefault(client_id, [])
            if len(queue) < MAX_REMOVALS_PER_CLIENT:
                queue.append(LiteRemoval(client_id, group, topic, name))
            client = self._clients.get((group, topic, client_id))
            if client is not None:
                self._watch_drop(client, name)
        self.expired += 1
        log.info("lite topic removed", extra=kv(topic=topic, lite_topic=name, subscribers=len(subscribers)))

    def drop_topic(self, topic: str) -> None:
        """The bind topic was deleted: forget its lite topics and tell their subscribers."""
        tid = self._store.index.topic_id(topic)
        if tid is None:
            return
        for name, rec in list(self.state.lite_topics(tid)):
            self._remove(topic, tid, name, rec, rec.last_write_ms)
        for key in [k for k in self._clients if k[1] == topic]:
            del self._clients[key]
        for group, _, client_id in [k for k in self._filters if k[1] == topic]:
            self.state.change_filters(group, tid, client_id, set(), self._filters.pop((group, topic, client_id)))
        self._tries.pop(topic, None)
        self._subscribed.clear()

    def claim_removals(self, client_ids: list[str]) -> list[LiteRemoval]:
        out: list[LiteRemoval] = []
        for cid in client_ids:
            out.extend(self._removals.pop(cid, ()))
        return out

    def _forget_idle(self) -> None:
        cutoff = self._clock.monotonic() - self._cfg.idle_client_s
        for key, client in list(self._clients.items()):
            if client.seen < cutoff:
                for name in list(client.names):
                    self._watch_drop(client, name)
                del self._clients[key]
                self._hub.forget(client.wake_key)
        if len(self._removals) > 100_000:  # clients that never came back for theirs
            self._removals.clear()

    async def run_sweeper(self, stop: asyncio.Event, specs: dict[str, TopicSpec]) -> None:
        interval = self._cfg.sweep_interval_ms / 1000.0
        while not stop.is_set():
            try:
                self.sweep(specs)
            except Exception:
                log.exception("lite topic sweep failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    # -- status ----------------------------------------------------------------------------------

    def subscriptions(self) -> int:
        return sum(len(c.names) for c in self._clients.values())

    def count(self, topic: str) -> int:
        tid = self._store.index.topic_id(topic)
        return 0 if tid is None else self.state.count(tid)

    def list(self, spec: TopicSpec, group: str, limit: int) -> LiteTopicList:
        if limit <= 0 or limit > 10_000:
            raise BadRequest(f"limit must be between 1 and 10000, got {limit}")
        tid = self._store.index.topic_id(spec.name)
        if tid is None:
            return LiteTopicList(spec.name, 0, ())
        rows: list[tuple[int, str, LiteTopicInfo]] = []
        for name, rec in self.state.lite_topics(tid):
            low, high = self._store.queue_bounds(spec.name, rec.queue_id)
            if group:
                cursor = self._pop.cursor(group, spec.name, rec.queue_id)
                pending = self._pop.first_pending_offset(group, spec.name, rec.queue_id)
                done = low if cursor is None else (cursor if pending is None else min(cursor, pending))
                backlog = max(0, high - done)
            else:
                backlog = high - low
            info = LiteTopicInfo(name, backlog, rec.last_write_ms, rec.created_ms,
                                 len(self.state.subscribers(tid, name)))  # fmt: skip
            item = (backlog, name, info)
            if len(rows) < limit:
                heapq.heappush(rows, item)
            else:
                heapq.heappushpop(rows, item)
        ordered = sorted(rows, key=lambda r: (-r[0], r[1]))
        return LiteTopicList(spec.name, self.state.count(tid), tuple(r[2] for r in ordered))


def check_lite_spec(spec: TopicSpec) -> None:
    if spec.lite_expiration_s < 1:
        raise BadRequest(f"lite expiration must be at least 1 s, got {spec.lite_expiration_s}")
    if spec.max_lite_topics < 0:
        raise BadRequest(f"max lite topics must not be negative, got {spec.max_lite_topics}")
    if spec.message_types != frozenset({MessageType.LITE}):
        raise MessageTypeConflict("a LITE topic accepts only LITE messages: do not combine it with other types")
