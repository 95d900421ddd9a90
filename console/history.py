"""Recent history for the console's plots, kept in memory: message rates of topics, lag of groups.

Sampling every topic and group of a large cluster every few seconds would cost thousands of
broker calls for plots nobody looks at. So the console samples what operators look at: a topic or
group shown on a page is *watched* for `history_s` after its last view (at most `watched_max`, the
least recently viewed dropped first), and every `sample_interval_s` the sampler reads the watched
ones through the admin functions (`describe_topic`, `describe_group`) and appends a point. A page
also records the figures it has just read (`record_topic`, `record_group`), so a plot starts with
the first view, and the sampler leaves out what a page recorded within the last interval. Rates
are differences of offsets (or delivery counts) between points, per second.

The cluster page watches the whole cluster (`watch_cluster`): while it is watched, the sampler
reads every user topic (`describe_topic`, `fanout.CONCURRENCY_MAX` at a time) and keeps, per
broker, the messages written and delivered, for the cluster's and each broker's rates in and out.
A cluster of more than `cluster_topics_max` topics is not sampled (the page says so; Prometheus
gives its rates).

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

from admin import groups, topics
from admin.cluster import Cluster, view
from admin.output import Report
from common.errors import SluiceError
from common.model import SYSTEM_PREFIX
from console import fanout

log = logging.getLogger("sluice.console")

Point = tuple[float, float]  # (epoch seconds, value)


@dataclass(frozen=True, slots=True)
class TopicPoint:
    stored: int  # sum of the queues' max offsets: every message ever stored
    backlog: int  # messages currently stored (max - min)
    delivered: int = 0  # handed to consumers since each broker started (every attempt)
    local_bytes: int = 0  # estimated bytes on the brokers' disks


@dataclass(frozen=True, slots=True)
class ClusterPoint:
    written: dict[str, int]  # per broker: messages ever stored in user topics (sum of max offsets)
    delivered: dict[str, int]  # per broker: deliveries of user topics since it started


@dataclass(frozen=True, slots=True)
class GroupPoint:
    consumed: int  # sum of the consumed offsets
    lag: int
    in_flight: int
    retrying: int = 0


class History:
    def __init__(self, *, history_s: float, interval_s: float, watched_max: int,
                 clock: Callable[[], float] = time.time, cluster_topics_max: int = 1000) -> None:  # fmt: skip
        self._history_s = history_s
        self._interval_s = interval_s
        self._watched_max = watched_max
        self._clock = clock
        self.cluster_topics_max = cluster_topics_max
        self.cluster_too_large = 0  # the topic count when the last cluster sample was skipped, else 0
        self._points_max = max(2, int(history_s / interval_s) + 2)
        self._topics: dict[str, deque[tuple[float, Any]]] = {}  # of TopicPoint
        self._groups: dict[str, deque[tuple[float, Any]]] = {}  # of GroupPoint
        self._cluster: dict[str, deque[tuple[float, Any]]] = {}  # of ClusterPoint, under ""
        self._watched: OrderedDict[tuple[str, str], float] = OrderedDict()  # (kind, name) -> last view

    # -- what pages call ------------------------------------------------------------------------

    def record_topic(self, name: str, point: TopicPoint) -> None:
        self._watch("topic", name)
        self._append(self._topics, name, point)

    def record_group(self, name: str, point: GroupPoint) -> None:
        self._watch("group", name)
        self._append(self._groups, name, point)

    def watch_cluster(self) -> None:
        """The cluster page is looked at: sample the cluster's rates (from the next round on)."""
        self._watch("cluster", "")

    def cluster_rate_in(self, broker: str | None = None) -> list[Point]:
        """Messages written per second into user topics, of the cluster or of one broker."""
        return _rates([(t, _total(p.written, broker)) for t, p in self._cluster.get("", ())])

    def cluster_rate_out(self, broker: str | None = None) -> list[Point]:
        """Deliveries per second (every attempt) of user topics, of the cluster or of one broker."""
        return _rates([(t, _total(p.delivered, broker)) for t, p in self._cluster.get("", ())])

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
            with view():  # one round reuses what it asked itself, as a page does
                await self.sample(cluster)

    async def sample(self, cluster: Cluster) -> None:
        """A point for every watched topic and group that no page gave one within the last interval:
        a list page being looked at records its 50 rows itself, and reading them again here would
        only compete with the pages (the broker may share the console's process and event loop)."""
        self._forget_stale()
        fresh_after = self._clock() - self._interval_s
        for kind, name in list(self._watched):
            points = self._series(kind).get(name)
            if points and points[-1][0] > fresh_after:
                continue
            try:
                if kind == "cluster":
                    point = await self._cluster_point(cluster)
                    if point is not None:
                        self._append(self._cluster, "", point)
                elif kind == "topic":
                    self._append(self._topics, name, topic_point(await topics.describe_topic(cluster, name)))
                else:
                    self._append(self._groups, name, group_point(await groups.describe_group(cluster, name)))
            except SluiceError as exc:  # deleted meanwhile, broker down: no point this round
                log.debug("console sampler: %s %s: %s", kind, name, exc)

    async def _cluster_point(self, cluster: Cluster) -> ClusterPoint | None:
        listed = (await topics.list_topics(cluster)).rows
        names = [r["topic"] for r in listed if not r["topic"].startswith(SYSTEM_PREFIX)]
        if len(names) > self.cluster_topics_max:
            self.cluster_too_large = len(names)
            return None
        self.cluster_too_large = 0
        written: dict[str, int] = {}
        delivered: dict[str, int] = {}
        for report in await fanout.each(names, lambda name: topics.describe_topic(cluster, name)):
            if isinstance(report, SluiceError):
                continue  # deleted meanwhile: its messages leave the sums (a rate never goes below 0)
            for row in report.rows:
                written[row["broker"]] = written.get(row["broker"], 0) + row["max_offset"]
            for broker, count in {r["broker"]: r.get("broker_delivered", 0) for r in report.rows}.items():
                delivered[broker] = delivered.get(broker, 0) + count
        return ClusterPoint(written, delivered)

    # -- internals ------------------------------------------------------------------------------

    def _series(self, kind: str) -> dict[str, deque[tuple[float, Any]]]:
        return {"topic": self._topics, "group": self._groups}.get(kind, self._cluster)

    def _watch(self, kind: str, name: str) -> None:
        self._watched[(kind, name)] = self._clock()
        self._watched.move_to_end((kind, name))
        while len(self._watched) > self._watched_max:
            (old_kind, old_name), _ = self._watched.popitem(last=False)
            self._series(old_kind).pop(old_name, None)

    def _forget_stale(self) -> None:
        horizon = self._clock() - self._history_s
        for key, seen in list(self._watched.items()):
            if seen < horizon:
                del self._watched[key]
                self._series(key[0]).pop(key[1], None)

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


def _total(per_broker: dict[str, int], broker: str | None) -> int:
    return sum(per_broker.values()) if broker is None else per_broker.get(broker, 0)


def _rates(points: list[tuple[float, int]]) -> list[Point]:
    return [(t1, max(0.0, (v1 - v0) / (t1 - t0))) for (t0, v0), (t1, v1) in itertools.pairwise(points) if t1 > t0]
