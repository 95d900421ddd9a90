"""Flow control: token buckets per namespace and topic (produce) and per consumer group (receive).

Limits are cluster state (`common.security.Limit`, set with `sluice admin limit set`); every proxy
enforces `rate / proxy_count` of each (see docs/flow-control.md for the tolerance this gives).

A bucket holds up to `burst_s` seconds of its rate and refills continuously. A request is admitted
while the bucket is positive and then charged its full cost, which may take the bucket below zero
(a debt the refill pays back): a batch larger than the burst still passes once, and the long-run
rate is the configured one. Over the limit the request is refused with TOO_MANY_REQUESTS before
anything is stored; the official clients back off and retry. Tenants without a limit pay one dict
lookup per request. Use from the event loop's thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from common.errors import TooManyRequests
from common.security import Limit, LimitScope

Clock = Callable[[], float]
_MIN_BURST = 1.0


class TokenBucket:
    def __init__(self, rate_per_s: float, burst_s: float, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.capacity = max(rate_per_s * burst_s, _MIN_BURST)
        self._tokens = self.capacity
        self._last = now

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._tokens = min(self.capacity, self._tokens + elapsed * self.rate_per_s)

    def has_tokens(self, now: float) -> bool:
        self._refill(now)
        return self._tokens > 0

    def charge(self, cost: float, now: float) -> None:
        self._refill(now)
        self._tokens -= cost


@dataclass(slots=True)
class _Buckets:
    limit: Limit
    messages: TokenBucket | None
    bytes: TokenBucket | None


class FlowControl:
    def __init__(self, *, proxy_count: int, burst_s: float, clock: Clock = time.monotonic) -> None:
        self._proxy_count = max(1, proxy_count)
        self._burst_s = burst_s
        self._clock = clock
        self._buckets: dict[tuple[LimitScope, str, str], _Buckets] = {}
        self.refused = 0  # requests refused since start (for logs and tests)

    def update(self, limits: Iterable[Limit]) -> None:
        """Put `limits` in force; a limit that did not change keeps its bucket's state."""
        now = self._clock()
        fresh: dict[tuple[LimitScope, str, str], _Buckets] = {}
        for limit in limits:
            old = self._buckets.get(limit.key)
            if old is not None and old.limit == limit:
                fresh[limit.key] = old
                continue
            fresh[limit.key] = _Buckets(limit, self._bucket(limit.messages_per_s, now),
                                        self._bucket(limit.bytes_per_s, now))  # fmt: skip
        self._buckets = fresh

    @property
    def limited(self) -> bool:
        """Whether any limit is in force (without one, admission needs no look at a request)."""
        return bool(self._buckets)

    def _bucket(self, rate: float, now: float) -> TokenBucket | None:
        return TokenBucket(rate / self._proxy_count, self._burst_s, now) if rate > 0 else None

    def admit_produce(self, namespace: str, topic: str, messages: int, size_bytes: int) -> None:
        """Charge a send of `messages` totalling `size_bytes`; TooManyRequests if a limit is exhausted."""
        if not self._buckets:
            return
        found = [b for b in (self._buckets.get((LimitScope.NAMESPACE, namespace, "")),
                             self._buckets.get((LimitScope.TOPIC, namespace, topic))) if b is not None]  # fmt: skip
        if not found:
            return
        now = self._clock()
        for b in found:
            for bucket, unit in ((b.messages, "messages"), (b.bytes, "bytes")):
                if bucket is not None and not bucket.has_tokens(now):
                    self.refused += 1
                    raise TooManyRequests(_over(b.limit, unit))
        for b in found:
            if b.messages is not None:
                b.messages.charge(messages, now)
            if b.bytes is not None:
                b.bytes.charge(size_bytes, now)

    def admit_receive(self, namespace: str, group: str) -> None:
        """TooManyRequests if the group's receive limit is exhausted; charge with `charge_receive`."""
        b = self._buckets.get((LimitScope.GROUP, namespace, group)) if self._buckets else None
        if b is not None and b.messages is not None and not b.messages.has_tokens(self._clock()):
            self.refused += 1
            raise TooManyRequests(_over(b.limit, "messages"))

    def charge_receive(self, namespace: str, group: str, messages: int) -> None:
        b = self._buckets.get((LimitScope.GROUP, namespace, group)) if self._buckets else None
        if b is not None and b.messages is not None and messages:
            b.messages.charge(messages, self._clock())


def _over(limit: Limit, unit: str) -> str:
    rate = limit.messages_per_s if unit == "messages" else limit.bytes_per_s
    if limit.scope is LimitScope.NAMESPACE:
        what = f"namespace {limit.namespace or '(default)'}"
    else:
        what = f"{limit.scope.value} {limit.name}" + (f" of namespace {limit.namespace}" if limit.namespace else "")
    return f"{what} is over its limit of {rate:g} {unit}/s; retry after a short backoff"
