"""The NameServer's state: an in-memory registry of brokers and the topic routes they imply.

Pure and synchronous (no gRPC, no tasks): the service calls it from the event loop's thread only,
so it needs no locks. Time comes from an injectable monotonic clock, so tests drive expiry.

Invariants:
- `_by_topic[t][b]` exists exactly when broker `b` is held and its registration lists topic `t`
  (the index is rebuilt for a broker whenever its topic list changes; a registration replaces the
  broker's topics, never merges them).
- A broker whose last registration is `broker_expiry_s` old or older is invisible to every read
  at once; `expire()` (the service's sweep) only reclaims its memory.
- For `young_s` after the registry is made (the NameServer's start), and after a stall (no `tick`
  for `stall_s`: the process was stopped or starved), routes say `young`: a live broker's
  heartbeats may not have reached this NameServer yet.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import PreconditionFailed, TooManyRequests, TopicNotFound
from common.model import MessageType, TopicInfo, validate_topic_name
from nameserver.model import (
    BrokerQueues,
    BrokerRegistration,
    BrokerStatus,
    RegisterOutcome,
    TopicRoute,
    TopicSummary,
    validate_name,
    validate_registration,
)

Clock = Callable[[], float]
DEFAULT_MAX_BROKERS = 10_000


@dataclass(slots=True)
class _Entry:
    registration: BrokerRegistration
    topics: dict[str, TopicInfo]
    last_seen: float


class Registry:
    def __init__(
        self,
        *,
        broker_expiry_s: float,
        max_brokers: int = DEFAULT_MAX_BROKERS,
        young_s: float = 0.0,
        stall_s: float = math.inf,
        clock: Clock = time.monotonic,
    ) -> None:
        if broker_expiry_s <= 0:
            raise ValueError(f"broker_expiry_s must be positive, got {broker_expiry_s}")
        if max_brokers < 1:
            raise ValueError(f"max_brokers must be at least 1, got {max_brokers}")
        if young_s < 0:
            raise ValueError(f"young_s must not be negative, got {young_s}")
        self._expiry_s = broker_expiry_s
        self._max_brokers = max_brokers
        self._clock = clock
        self._young_s = young_s
        self._stall_s = stall_s
        self._young_until = clock() + young_s
        self._last_tick = clock()
        self._brokers: dict[str, _Entry] = {}
        self._by_topic: dict[str, dict[str, TopicInfo]] = {}

    @property
    def broker_expiry_s(self) -> float:
        return self._expiry_s

    @property
    def young(self) -> bool:
        """Started (or woke from a stall) less than `young_s` ago, or stalled now (no `tick` for
        `stall_s`): live brokers' heartbeats may have been missed."""
        now = self._clock()
        return now < self._young_until or now - self._last_tick > self._stall_s

    def tick(self) -> bool:
        """The service's sweep is running. A gap longer than `stall_s` since the last tick means the
        NameServer was hung (stopped, starved) and missed heartbeats: young again for `young_s`
        (returns True)."""
        now = self._clock()
        stalled = now - self._last_tick > self._stall_s
        if stalled:
            self._young_until = max(self._young_until, now + self._young_s)
        self._last_tick = now
        return stalled

    # -- writes ---------------------------------------------------------------------------------

    def register(self, registration: BrokerRegistration) -> RegisterOutcome:
        """Hold `registration` as the broker's whole state and refresh its liveness."""
        validate_registration(registration)
        now = self._clock()
        entry = self._brokers.get(registration.broker_name)
        if entry is not None and self._expired(entry, now):
            self._remove(registration.broker_name)
            entry = None
        if entry is None:
            if len(self._brokers) >= self._max_brokers:
                self.expire()  # expired brokers must not keep live ones out
            if len(self._brokers) >= self._max_brokers:
                raise TooManyRequests(
                    f"registry holds {self._max_brokers} brokers (max_brokers); "
                    f"broker {registration.broker_name} was not registered"
                )
            self._insert(registration, now)
            return RegisterOutcome.NEW
        held_epoch = entry.registration.epoch
        if 0 < registration.epoch < held_epoch:  # a deposed primary's, late: it must not take the route back
            name, epoch = registration.broker_name, registration.epoch
            raise PreconditionFailed(f"broker {name}: a registration of epoch {epoch} came after one of epoch "
                                     f"{held_epoch}: a newer primary holds the route")  # fmt: skip
        entry.last_seen = now
        if _is_stale(entry.registration, registration):
            return RegisterOutcome.STALE
        topics = {t.name: t for t in registration.topics}
        previous = entry.registration
        entry.registration = registration
        same_place = (previous.cluster_name, previous.address, previous.client_endpoint) == (
            registration.cluster_name,
            registration.address,
            registration.client_endpoint,
        )
        if topics == entry.topics:
            return RegisterOutcome.HEARTBEAT if same_place else RegisterOutcome.CHANGED
        self._unindex(registration.broker_name, entry.topics)
        entry.topics = topics
        self._index(registration.broker_name, topics)
        return RegisterOutcome.CHANGED

    def unregister(self, broker_name: str, instance_id: str = "") -> bool:
        """Forget a broker; with `instance_id`, only if the held registration is that instance's."""
        validate_name("broker", broker_name)
        entry = self._brokers.get(broker_name)
        if entry is None:
            return False
        held = entry.registration.instance_id
        if instance_id and held and held != instance_id:
            return False
        self._remove(broker_name)
        return True

    def expire(self) -> list[BrokerStatus]:
        """Remove every broker past its expiry; returns them as they were last seen."""
        now = self._clock()
        gone = [self._status(e, now) for e in self._brokers.values() if self._expired(e, now)]
        for status in gone:
            self._remove(status.broker_name)
        return gone

    # -- reads ----------------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRoute:
        """Every live broker holding `topic`, sorted by broker name; TopicNotFound if none."""
        validate_topic_name(topic, allow_system=True)
        now = self._clock()
        holders = self._by_topic.get(topic, {})
        brokers = []
        for broker_name in sorted(holders):
            entry = self._brokers[broker_name]
            if self._expired(entry, now):
                continue
            info = holders[broker_name]
            brokers.append(
                BrokerQueues(
                    broker_name=broker_name,
                    address=entry.registration.address,
                    cluster_name=entry.registration.cluster_name,
                    queue_count=info.queue_count,
                    permission=info.permission,
                    message_types=info.message_types,
                    client_endpoint=entry.registration.client_endpoint,
                )
            )
        if not brokers:
            raise TopicNotFound(f"no live broker holds topic {topic!r}")
        return TopicRoute(topic=topic, brokers=tuple(brokers), young=self.young)

    def brokers(self, cluster_name: str = "") -> list[BrokerStatus]:
        """Live brokers (of one cluster, if given), sorted by (cluster name, broker name)."""
        now = self._clock()
        found = [
            self._status(e, now)
            for e in self._brokers.values()
            if not self._expired(e, now) and (not cluster_name or e.registration.cluster_name == cluster_name)
        ]
        return sorted(found, key=lambda s: (s.cluster_name, s.broker_name))

    def topics(self) -> list[TopicSummary]:
        """Every topic held by at least one live broker, sorted by name."""
        now = self._clock()
        summaries = []
        for topic in sorted(self._by_topic):
            holders = self._by_topic[topic]
            live = sorted(b for b in holders if not self._expired(self._brokers[b], now))
            if not live:
                continue
            types: set[MessageType] = set()
            for b in live:
                types |= holders[b].message_types
            summaries.append(
                TopicSummary(
                    name=topic,
                    broker_names=tuple(live),
                    queue_count=sum(holders[b].queue_count for b in live),
                    message_types=frozenset(types),
                )
            )
        return summaries

    # -- internals ------------------------------------------------------------------------------

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.last_seen >= self._expiry_s

    def _status(self, entry: _Entry, now: float) -> BrokerStatus:
        reg = entry.registration
        return BrokerStatus(
            cluster_name=reg.cluster_name,
            broker_name=reg.broker_name,
            address=reg.address,
            topic_count=len(entry.topics),
            last_heartbeat_age_s=max(0.0, now - entry.last_seen),
            client_endpoint=reg.client_endpoint,
        )

    def _insert(self, registration: BrokerRegistration, now: float) -> None:
        topics = {t.name: t for t in registration.topics}
        self._brokers[registration.broker_name] = _Entry(registration, topics, now)
        self._index(registration.broker_name, topics)

    def _remove(self, broker_name: str) -> None:
        entry = self._brokers.pop(broker_name)
        self._unindex(broker_name, entry.topics)

    def _index(self, broker_name: str, topics: dict[str, TopicInfo]) -> None:
        for name, info in topics.items():
            self._by_topic.setdefault(name, {})[broker_name] = info

    def _unindex(self, broker_name: str, topics: dict[str, TopicInfo]) -> None:
        for name in topics:
            holders = self._by_topic[name]
            del holders[broker_name]
            if not holders:
                del self._by_topic[name]


def _is_stale(held: BrokerRegistration, incoming: BrokerRegistration) -> bool:
    """Same broker instance, older sequence: a registration overtaken in flight by a newer one."""
    return bool(held.instance_id) and held.instance_id == incoming.instance_id and (incoming.sequence < held.sequence)
