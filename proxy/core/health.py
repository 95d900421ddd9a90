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
time resets its failures. With a `probe` (the proxy's: a BrokerInfo call), a broker that did not
answer a send (unreachable, timed out: `is_silence`) is not probed with clients' sends: it stays
avoided until a probe of its own, made in the background every `isolate_ms` with at most `slow_ms`
to answer, is answered. A broker cut off from the network answers no probe (a send to it would
wait for its client's deadline: issue 43), so while it is cut every send goes to the other
brokers; it is used again within one `isolate_ms` of answering. That it stopped answering is
logged once, with its name, and again when it answers.
Soft state of one proxy process (each worker keeps its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from common.errors import (
    InternalError,
    NotPrimary,
    ProxyTimeout,
    RequestTimeout,
    SluiceError,
    TooFewInSync,
    Unavailable,
)
from common.logs import kv
from proxy.config import SendHealthConfig

log = logging.getLogger("sluice.proxy.health")
Probe = Callable[[str], Awaitable[object]]


def is_broker_fault(exc: SluiceError) -> bool:
    """A failure that says something about the broker (not about the request)."""
    return exc.retriable or isinstance(exc, InternalError)


def is_silence(exc: SluiceError) -> bool:
    """A failure that says the broker did not answer (unreachable, timed out, the send cancelled
    while waiting), not that it answered no (overloaded, failed internally, not the primary, too few
    members in sync: a group's refusals the failover path handles)."""
    return isinstance(exc, Unavailable | RequestTimeout | ProxyTimeout) and not isinstance(
        exc, NotPrimary | TooFewInSync
    )


class BrokerHealth:
    def __init__(
        self, config: SendHealthConfig, clock: Callable[[], float] = time.monotonic, *, probe: Probe | None = None
    ) -> None:
        self._probe = probe
        self._probes: dict[str, asyncio.Task[None]] = {}  # one per broker avoided until it answers
        self._closed = False  # no probe starts after `close`
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
            if is_silence(error):
                self._watch(broker, error)
            return
        self._failures.pop(broker, None)
        if now - began > self._slow_s:
            self._avoid_until[broker] = max(self._avoid_until.get(broker, 0.0), now + self._isolate_s)

    def silent(self, broker: str, why: str) -> None:
        """The proxy's connection to `broker` answered no keepalive PING in time (its host is cut
        off, or it hangs): avoided as after a send it did not answer, until it answers a probe.
        Every proxy finds this out by itself within ~1.5 s of the cut, whether or not a send of
        its own was waiting (common/http2/client.py), so a client's retry through another proxy
        does not wait on the same broker again."""
        self.finished(broker, self.started(broker), Unavailable(f"broker {broker}: {why}"))

    def usable(self, broker: str) -> bool:
        if broker in self._probes:
            return False
        now = self._clock()
        if now < self._avoid_until.get(broker, 0.0):
            return False
        sends = self._in_flight.get(broker)
        if sends:
            oldest = next(iter(sends.values()))
            return now - oldest <= self._slow_s
        return True

    def _watch(self, broker: str, error: SluiceError) -> None:
        """Avoid `broker` until a probe of it is answered (with a probe; once per outage)."""
        if self._probe is None or broker in self._probes or self._closed:
            return
        log.warning("broker stopped answering sends: avoided until it answers a probe",
                    extra=kv(broker=broker, error=str(error)[:200]))  # fmt: skip
        probing = self._probe_until_answered(broker)  # in a context of its own, not the failed request's ids
        self._probes[broker] = asyncio.get_running_loop().create_task(probing, name=f"probe-{broker}",
                                                                      context=contextvars.Context())  # fmt: skip

    async def _probe_until_answered(self, broker: str) -> None:
        assert self._probe is not None
        began = self._clock()
        try:
            while True:
                await asyncio.sleep(max(0.0, self._avoid_until.get(broker, 0.0) - self._clock()))
                try:
                    await asyncio.wait_for(self._probe(broker), self._slow_s)
                except (SluiceError, TimeoutError):
                    self._avoid_until[broker] = self._clock() + self._isolate_s
                    continue
                self._failures.pop(broker, None)
                self._avoid_until.pop(broker, None)
                log.info("broker answers again", extra=kv(broker=broker, after_s=round(self._clock() - began, 1)))
                return
        finally:
            self._probes.pop(broker, None)

    async def close(self) -> None:
        """Stop probing (the proxy is stopping); no probe starts after this."""
        self._closed = True
        tasks = list(self._probes.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
