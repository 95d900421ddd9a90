"""Recent history for the console's plots, kept in memory: message rates of topics, lag of groups.

Sampling every topic and group of a large cluster every few seconds would cost thousands of
broker calls for plots nobody looks at. So the console samples what operators look at: a topic or
group shown on a page is *watched* for `history_s` after its last view (at most `watched_max`, the
least recently viewed dropped first), and every `sample_interval_s` the sampler reads the watched
ones through the admin functions (`describe_topic`, `describe_group`) and appends a point. A page
also records the figures it has just read (`record_topic`, `record_group`), so a plot starts with
the first view, and the sampler leaves out what a page recorded within the last interval. Rates
are differences of offsets (or delivery counts) between points, per second.

`History` is used from the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.errors import SluiceError
from deploy.admin import groups, topics
from deploy.admin.cluster import Cluster
from deploy.admin.output import Report

log = logging.getLogger("sluice.console")

Point = tuple[float, float]  # (epoch seconds, value)


@dataclass(frozen=True, slots=True)
class TopicPoint:
    stored: int  # sum of the queues' max offsets: every message ever stored
    backlog: int  # messages currently stored (max - min)
    delivered: int = 0  # handed to consumers since each broker started (every attempt)
    local_bytes: int = 0  # estimated bytes on the brokers' disks


@dataclass(frozen=True, slots=True)
class GroupPoint:
    consumed: int  # sum of the consumed offsets
    lag: int
    in_flight: int
    retrying: int = 0


class History:
    def __init__(self, *, history_s: float, interval_s: float, watched_max: int,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self._history_s = history_s
        self._interval_s = interval_s
        self._watched_max = watched_max
        self._clock = clock
        self._points_max = max(2, int(history_s / interval_s) + 2)
        self._topics: dict[str, deque[tuple[float, Any]]] = {}  # of TopicPoint
        self._groups: dict[str, deque[tuple[float, Any]]] = {}  # of GroupPoint
        self._watched: OrderedDict[tuple[str, str], float] = OrderedDict()  # (kind, name) -> last view

    # -- what pages call ------------------------------------------------------------------------

    def record_topic(self, name: str, point: TopicPoint) -> None:
        self._watch("topic", name)
        self._append(self._topics, name, point)

    def record_group(self, name: str, point: GroupPoint) -> None:
        self._watch("group", name)
        self._append(self._groups, name, point)

    def topic_rate_in(self, name: str) -> list[Point]:
        """Messages stored per second, between consecutive points."""
        return _rates([(t, p.stored) for t, p in self._topics.get(name, ())])

    def topic_rate_out(self, name: str) -> list[Point]:
        """Messages delivered per second (every attempt), between consecutive points."""
        return _rates([(t, p.delivered) for t, p in self._topics.get(name, ())])

    def group_rate_out(self, name: str) -> list[Point]:
        """Messages consumed (acknowledged or dead-lettered) per second, between consecutive points."""
        return _rates([(t, p.consumed) for t, p in self._groups.get(name, ())])

    def group_lag(self, name: str) -> list[Point]:
        return [(t, float(p.lag)) for t, p in self._groups.get(name, ())]

    def last_rate_in(self, name: str) -> float | None:
        rates = self.topic_rate_in(name)
        return rates[-1][1] if rates else None

    def last_rate_out(self, name: str) -> float | None:
        rates = self.group_rate_out(name)
        return rates[-1][1] if rates else None

    def last_topic_rate_out(self, name: str) -> float | None:
        rates = self.topic_rate_out(name)
        return rates[-1][1] if rates else None

    # -- the sampler ----------------------------------------------------------------------------

    async def run(self, cluster: Cluster, stop: asyncio.Event) -> None:
        """Sample the watched topics and groups every interval until `stop` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self._interval_s)
                return
            except TimeoutError:
                pass
            await self.sample(cluster)

    async def sample(self, cluster: Cluster) -> None:
        """A point for every watched topic and group that no page gave one within the last interval:
        a list page being looked at records its 50 rows itself, and reading them again here would
        only compete with the pages (the broker may share the console's process and event loop)."""
        self._forget_stale()
        fresh_after = self._clock() - self._interval_s
        for kind, name in list(self._watched):
            points = (self._topics if kind == "topic" else self._groups).get(name)
            if points and points[-1][0] > fresh_after:
                continue
            try:
                if kind == "topic":
                    self._append(self._topics, name, topic_point(await topics.describe_topic(cluster, name)))
                else:
                    self._append(self._groups, name, group_point(await groups.describe_group(cluster, name)))
            except SluiceError as exc:  # deleted meanwhile, broker down: no point this round
                log.debug("console sampler: %s %s: %s", kind, name, exc)

    # -- internals ------------------------------------------------------------------------------

    def _watch(self, kind: str, name: str) -> None:
        self._watched[(kind, name)] = self._clock()
        self._watched.move_to_end((kind, name))
        while len(self._watched) > self._watched_max:
            (old_kind, old_name), _ = self._watched.popitem(last=False)
            (self._topics if old_kind == "topic" else self._groups).pop(old_name, None)

    def _forget_stale(self) -> None:
        horizon = self._clock() - self._history_s
        for key, seen in list(self._watched.items()):
            if seen < horizon:
                del self._watched[key]
                (self._topics if key[0] == "topic" else self._groups).pop(key[1], None)

    def _append(self, series: dict[str, deque[tuple[float, Any]]], name: str, point: object) -> None:
        points = series.get(name)
        if points is None:
            points = series[name] = deque(maxlen=self._points_max)
        now = self._clock()
        # Two views within a second add nothing to a plot; keep the newer figure.
        if points and now - points[-1][0] < 1.0:
            points[-1] = (now, point)
        else:
            points.append((now, point))


def topic_point(report: Report) -> TopicPoint:
    """The totals of a `describe_topic` report."""
    rows = report.rows
    return TopicPoint(stored=sum(r["max_offset"] for r in rows), backlog=sum(r["messages"] for r in rows),
                      delivered=_per_broker_sum(rows, "broker_delivered"),
                      local_bytes=_per_broker_sum(rows, "broker_local_bytes"))  # fmt: skip


def group_point(report: Report) -> GroupPoint:
    """The totals of a `describe_group` report."""
    rows = report.rows
    return GroupPoint(consumed=sum(r["consumed_offset"] for r in rows), lag=sum(r["lag"] for r in rows),
                      in_flight=sum(r["in_flight"] for r in rows),
                      retrying=sum(r.get("retrying", 0) for r in rows))  # fmt: skip


def _per_broker_sum(rows: list[dict[str, Any]], key: str) -> int:
    """A figure `describe_topic` repeats on every queue row of a broker, summed once per broker."""
    return sum({r["broker"]: r.get(key, 0) for r in rows}.values())


def _rates(points: list[tuple[float, int]]) -> list[Point]:
    return [(t1, max(0.0, (v1 - v0) / (t1 - t0))) for (t0, v0), (t1, v1) in itertools.pairwise(points) if t1 > t0]
