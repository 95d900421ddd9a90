"""Navigation's state: an in-memory registry of proxies and the ranked answers it gives clients.

Pure and synchronous (no gRPC, no tasks): the service calls it from the event loop's thread only,
so it needs no locks. Time comes from an injectable monotonic clock, so tests drive expiry.

Ordering rule of `select` (the contract clients rely on): among live proxies that are not
draining, serve the namespace and have an endpoint on the network, sort by
1. same zone as asked first (only when a zone is asked; an unknown zone counts as another zone),
2. load score (`model.load_score`: in-flight requests + connected clients), lowest first,
3. proxy id, so equal proxies come out in the same order on every navigation server.

Invariants:
- A proxy whose last accepted registration is `proxy_expiry_s` old or older is invisible to every
  read at once; `expire()` (the service's sweep) only reclaims its memory.
- Within one instance, the state held is that of the highest sequence received; a lower one is
  ignored (STALE) and does not even refresh liveness.
- After an ordered unregistration (instance id and sequence given), a tombstone ignores late
  registrations of that instance up to that sequence for `proxy_expiry_s`, so a heartbeat still in
  flight cannot resurrect a proxy that left. Tombstones are bounded by `max_proxies`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import TooManyRequests
from navigation.model import (
    EndpointQuery,
    ProxyEndpoint,
    ProxyRegistration,
    ProxyStatus,
    RegisterOutcome,
    validate_proxy_id,
    validate_query,
    validate_registration,
)

Clock = Callable[[], float]
DEFAULT_MAX_PROXIES = 10_000


@dataclass(slots=True)
class _Entry:
    registration: ProxyRegistration
    last_seen: float


@dataclass(frozen=True, slots=True)
class _Tombstone:
    instance_id: str
    sequence: int
    at: float


class Registry:
    def __init__(
        self,
        *,
        proxy_expiry_s: float,
        max_proxies: int = DEFAULT_MAX_PROXIES,
        clock: Clock = time.monotonic,
    ) -> None:
        if proxy_expiry_s <= 0:
            raise ValueError(f"proxy_expiry_s must be positive, got {proxy_expiry_s}")
        if max_proxies < 1:
            raise ValueError(f"max_proxies must be at least 1, got {max_proxies}")
        self._expiry_s = proxy_expiry_s
        self._max_proxies = max_proxies
        self._clock = clock
        self._proxies: dict[str, _Entry] = {}
        self._tombstones: dict[str, _Tombstone] = {}  # insertion order = age order

    @property
    def proxy_expiry_s(self) -> float:
        return self._expiry_s

    @property
    def max_proxies(self) -> int:
        return self._max_proxies

    # -- writes ---------------------------------------------------------------------------------

    def register(self, registration: ProxyRegistration) -> RegisterOutcome:
        """Hold `registration` as the proxy's whole state and refresh its liveness (unless stale)."""
        validate_registration(registration)
        now = self._clock()
        proxy_id = registration.proxy_id
        if self._buried(registration, now):
            return RegisterOutcome.STALE
        entry = self._proxies.get(proxy_id)
        if entry is not None and self._expired(entry, now):
            del self._proxies[proxy_id]
            entry = None
        if entry is None:
            self._make_room(proxy_id)
            self._proxies[proxy_id] = _Entry(registration, now)
            return RegisterOutcome.NEW
        held = entry.registration
        if _is_stale(held, registration):
            return RegisterOutcome.STALE
        entry.registration = registration
        entry.last_seen = now
        if held.instance_id and registration.instance_id and held.instance_id != registration.instance_id:
            return RegisterOutcome.RESTARTED
        return RegisterOutcome.HEARTBEAT if _same_place(held, registration) else RegisterOutcome.CHANGED

    def unregister(self, proxy_id: str, instance_id: str = "", sequence: int = 0) -> bool:
        """Forget a proxy; with `instance_id`, only if the held registration is that instance's.

        With both `instance_id` and `sequence`, also ignore that instance's registrations up to
        `sequence` arriving later (see the module invariants). Returns whether a proxy was removed.
        """
        validate_proxy_id(proxy_id)
        now = self._clock()
        if instance_id and sequence > 0:
            self._bury(proxy_id, _Tombstone(instance_id, sequence, now))
        entry = self._proxies.get(proxy_id)
        if entry is None:
            return False
        held = entry.registration.instance_id
        if instance_id and held and held != instance_id:
            return False
        del self._proxies[proxy_id]
        return not self._expired(entry, now)

    def expire(self) -> list[ProxyStatus]:
        """Remove every proxy past its expiry (and old tombstones); returns the proxies as last seen."""
        now = self._clock()
        gone = [_status(e, now) for e in self._proxies.values() if self._expired(e, now)]
        for status in gone:
            del self._proxies[status.proxy_id]
        old = [pid for pid, t in self._tombstones.items() if now - t.at >= self._expiry_s]
        for proxy_id in old:
            del self._tombstones[proxy_id]
        return gone

    # -- reads ----------------------------------------------------------------------------------

    def select(self, query: EndpointQuery) -> list[ProxyEndpoint]:
        """The proxies a client should use, best first (see the ordering rule); BadRequest on bad input."""
        validate_query(query, max_limit=self._max_proxies)
        now = self._clock()
        candidates = [
            e.registration
            for e in self._proxies.values()
            if not self._expired(e, now)
            and not e.registration.draining
            and e.registration.serves(query.namespace)
            and query.network in e.registration.endpoints
        ]
        zone = query.zone

        def rank(reg: ProxyRegistration) -> tuple[bool, int, str]:
            return (bool(zone) and reg.zone != zone, reg.load.score, reg.proxy_id)

        candidates.sort(key=rank)
        if query.limit:
            candidates = candidates[: query.limit]
        return [
            ProxyEndpoint(proxy_id=r.proxy_id, zone=r.zone, endpoint=r.endpoints[query.network], load=r.load)
            for r in candidates
        ]

    def proxies(self) -> list[ProxyStatus]:
        """Every live proxy, draining ones included, sorted by proxy id."""
        now = self._clock()
        found = [_status(e, now) for e in self._proxies.values() if not self._expired(e, now)]
        return sorted(found, key=lambda s: s.proxy_id)

    def live_count(self) -> int:
        now = self._clock()
        return sum(1 for e in self._proxies.values() if not self._expired(e, now))

    # -- internals ------------------------------------------------------------------------------

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.last_seen >= self._expiry_s

    def _make_room(self, proxy_id: str) -> None:
        if len(self._proxies) >= self._max_proxies:
            self.expire()  # expired proxies must not keep live ones out
        if len(self._proxies) >= self._max_proxies:
            raise TooManyRequests(
                f"registry holds {self._max_proxies} proxies (max_proxies); proxy {proxy_id} was not registered"
            )

    def _buried(self, registration: ProxyRegistration, now: float) -> bool:
        tombstone = self._tombstones.get(registration.proxy_id)
        if tombstone is None:
            return False
        if now - tombstone.at >= self._expiry_s or tombstone.instance_id != registration.instance_id:
            del self._tombstones[registration.proxy_id]  # a new instance (or a late one) may take the id
            return False
        # Unordered sends (sequence 0) of the instance that left are refused as well.
        return registration.sequence <= tombstone.sequence

    def _bury(self, proxy_id: str, tombstone: _Tombstone) -> None:
        self._tombstones.pop(proxy_id, None)
        while len(self._tombstones) >= self._max_proxies:
            del self._tombstones[next(iter(self._tombstones))]  # the oldest goes first
        self._tombstones[proxy_id] = tombstone


def _is_stale(held: ProxyRegistration, incoming: ProxyRegistration) -> bool:
    """Same instance, older sequence: a registration overtaken in flight by a newer one."""
    return bool(held.instance_id) and held.instance_id == incoming.instance_id and incoming.sequence < held.sequence


def _same_place(held: ProxyRegistration, incoming: ProxyRegistration) -> bool:
    """Equal apart from load and ordering stamps: a plain heartbeat."""
    return (held.endpoints, held.zone, held.namespaces, held.draining) == (
        incoming.endpoints,
        incoming.zone,
        incoming.namespaces,
        incoming.draining,
    )


def _status(entry: _Entry, now: float) -> ProxyStatus:
    reg = entry.registration
    return ProxyStatus(
        proxy_id=reg.proxy_id,
        endpoints=reg.endpoints,
        zone=reg.zone,
        namespaces=reg.namespaces,
        draining=reg.draining,
        load=reg.load,
        last_heartbeat_age_s=max(0.0, now - entry.last_seen),
    )
