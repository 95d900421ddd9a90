"""Which endpoints of other processes this proxy can reach now, for the routes it answers (issue 43).

A route sends a client straight to other processes: a merged node's queues carry that node's client
endpoint (docs/shards.md), and the proxy endpoints of a route list this proxy's peers (or the
fleet's, from navigation). When such a host drops off the network, nothing comes back: a call to
it waits the client's whole request timeout (3 s for the official clients). The official Python
client then tries the next queue of its route, and reads routes again only every 30 s; so with a
quarter of a route's queues on a cut host, one send in four waited 3 s for as long as the cut
lasted. The routes this proxy answers are the one thing that reaches the client: while an endpoint
is unreachable from here, routes leave it out (`proxy/core/routing.py` `reachable_only`, and the
proxy endpoints `ProxyApp.endpoints` lists), so a client stops dialling it at its next route
refresh, and gets it back at the first refresh after it answers again.

`ReachWatch` watches the endpoints routes asked about (`reachable`) and are not this proxy's own:
every `interval_s` it opens a TCP connection to each, as a client would, and closes it; `failures`
connections in a row that do not open within `timeout_s` make the endpoint unreachable (logged
once, with the endpoint), one that opens makes it reachable again (logged). A connection refused at
once counts as a failure too (a process that is gone). An endpoint no route asked about for
`forget_s` is no longer watched, and at most `watched_max` are (the oldest asked-about goes). A
process that accepts connections but does not answer (hung) is not detected here: the client's
timeout and the proxies' send health (proxy/core/health.py) cover that.

Soft state of one proxy process (each worker keeps its own). The watch runs in `ProxyApp.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from common.addresses import split_host_port
from common.logs import kv
from proxy.config import ReachConfig

log = logging.getLogger("sluice.proxy.reach")
Connect = Callable[[str, int], Awaitable[None]]


async def tcp_connect(host: str, port: int) -> None:
    """Open a TCP connection to `host`:`port` and close it (OSError when it cannot be opened)."""
    _, writer = await asyncio.open_connection(host, port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class ReachWatch:
    def __init__(
        self,
        config: ReachConfig,
        own: Collection[str],
        *,
        connect: Connect = tcp_connect,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = config
        self._own = frozenset(own)
        self._connect = connect
        self._clock = clock
        self._asked: dict[str, float] = {}  # endpoint -> when a route last asked about it, oldest first
        self._failures: dict[str, int] = {}  # endpoint -> failed connections in a row
        self._unreachable: set[str] = set()

    def reachable(self, endpoint: str) -> bool:
        """False while `endpoint` is known unreachable; watched from now on (this proxy's own
        endpoints are always reachable and never watched)."""
        if endpoint in self._own:
            return True
        self._asked.pop(endpoint, None)  # re-inserted last: the dict stays in order of asking
        self._asked[endpoint] = self._clock()
        if len(self._asked) > self._cfg.watched_max:
            self._forget(next(iter(self._asked)))
        return endpoint not in self._unreachable

    async def run(self, stop: asyncio.Event) -> None:
        """Probe the watched endpoints every `interval_s` until `stop`."""
        while not stop.is_set():
            await self.probe_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._cfg.interval_s)

    async def probe_all(self) -> None:
        """One round: forget endpoints no route asked about for `forget_s`, probe the others at once."""
        now = self._clock()
        for endpoint in [e for e, at in self._asked.items() if now - at > self._cfg.forget_s]:
            self._forget(endpoint)
        watched = list(self._asked)
        answers = await asyncio.gather(*(self._probe(e) for e in watched))
        for endpoint, answered in zip(watched, answers, strict=True):
            if endpoint in self._asked:  # not forgotten meanwhile
                self._note(endpoint, answered)

    async def _probe(self, endpoint: str) -> bool:
        try:
            host, port = split_host_port(endpoint)
            await asyncio.wait_for(self._connect(host, port), self._cfg.timeout_s)
        except (OSError, TimeoutError, ValueError):
            return False
        return True

    def _note(self, endpoint: str, answered: bool) -> None:
        if answered:
            self._failures.pop(endpoint, None)
            if endpoint in self._unreachable:
                self._unreachable.discard(endpoint)
                log.info("route endpoint reachable again: back in routes", extra=kv(endpoint=endpoint))
            return
        failures = self._failures[endpoint] = self._failures.get(endpoint, 0) + 1
        if failures >= self._cfg.failures and endpoint not in self._unreachable:
            self._unreachable.add(endpoint)
            log.warning("route endpoint unreachable: left out of routes until it answers",
                        extra=kv(endpoint=endpoint, failed_connects=failures))  # fmt: skip

    def _forget(self, endpoint: str) -> None:
        self._asked.pop(endpoint, None)
        self._failures.pop(endpoint, None)
        self._unreachable.discard(endpoint)
