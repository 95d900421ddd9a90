"""Which brokers sends should avoid for now: latency and error feedback from the proxy's own sends.

The producer's queue selection (`routing.QueueSelector.pick`) skips a broker that is not `usable`,
as long as another writable broker is; FIFO message groups keep their fixed queue regardless (their
order matters more than the detour). A broker is avoided while

- a send to it has been in flight longer than `slow_ms` (a hung or stopped broker shows here at
  once, long before its sends time out), or
- a send to it failed (unreachable, timed out, overloaded): for `isolate_ms`, doubled on each
  failure after an isolation ended, up to `isolate_max_ms`; or a send to it took longer than
  `slow_ms`: for `isolate_ms`.

It comes back by itself: once the isolation ends the next send probes it, and a send answered in
time resets its failures. Soft state of one proxy process (each worker keeps its own).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from common.errors import InternalError, SluiceError
from proxy.config import SendHealthConfig


def is_broker_fault(exc: SluiceError) -> bool:
    """A failure that says something about the broker (not about the request)."""
    return exc.retriable or isinstance(exc, InternalError)


class BrokerHealth:
    def __init__(self, config: SendHealthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._slow_s = config.slow_ms / 1000
        self._isolate_s = config.isolate_ms / 1000
        self._isolate_max_s = config.isolate_max_ms / 1000
        self._clock = clock
        self._tokens = itertools.count()
        self._in_flight: dict[str, dict[int, float]] = {}  # broker -> send token -> start, oldest first
        self._avoid_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def started(self, broker: str) -> int:
        token = next(self._tokens)
        self._in_flight.setdefault(broker, {})[token] = self._clock()
        return token

    def finished(self, broker: str, token: int, error: SluiceError | None) -> None:
        now = self._clock()
        sends = self._in_flight.get(broker)
        began = sends.pop(token, now) if sends is not None else now
        if error is not None:
            if not is_broker_fault(error):
                return
            if now >= self._avoid_until.get(broker, 0.0):  # a new failure, not one of a batch that already counted
                failures = self._failures[broker] = self._failures.get(broker, 0) + 1
                self._avoid_until[broker] = now + min(self._isolate_s * 2 ** (failures - 1), self._isolate_max_s)
            return
        self._failures.pop(broker, None)
        if now - began > self._slow_s:
            self._avoid_until[broker] = max(self._avoid_until.get(broker, 0.0), now + self._isolate_s)

    def usable(self, broker: str) -> bool:
        now = self._clock()
        if now < self._avoid_until.get(broker, 0.0):
            return False
        sends = self._in_flight.get(broker)
        if sends:
            oldest = next(iter(sends.values()))
            return now - oldest <= self._slow_s
        return True
