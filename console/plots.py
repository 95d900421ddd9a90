"""Where the console's plots come from: its own samples (console/history.py), or Prometheus.

`MemoryPlots` reads the in-memory `History`. `PrometheusPlots` (the console's `prometheus` URL,
`sluice console --prometheus URL`) asks Prometheus's HTTP API (`/api/v1/query_range`) for the last
`history_s` at one point per `sample_interval_s`, from the families the proxies and brokers export
(docs/metrics.md):

- the cluster's rates in and out: the same sums over every topic,
- a topic's rate in: `sum(rate(sluice_messages_in_total{topic="T"}[W]))`, its rate out:
  `sum(rate(sluice_messages_out_total{topic="T"}[W]))` (every delivery attempt),
- a group's consume rate: `sum(rate(sluice_messages_acked_total{group="G"}[W]))`, its lag:
  `sum(sluice_consumer_lag_messages{group="G"})`,

W being `prometheus_rate_window_s`. When Prometheus cannot be asked (down, an error answer), the
plot falls back to the console's own samples and says so in its caption; the page still renders.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from console.history import History, Point

log = logging.getLogger("sluice.console")

QUERY_PATH = "/api/v1/query_range"


@dataclass(frozen=True, slots=True)
class Series:
    points: list[Point]
    source: str  # shown in the plot's caption


class Plots(Protocol):
    async def cluster_rate_in(self) -> Series: ...
    async def cluster_rate_out(self) -> Series: ...
    async def topic_rate_in(self, name: str) -> Series: ...
    async def topic_rate_out(self, name: str) -> Series: ...
    async def group_lag(self, name: str) -> Series: ...
    async def group_rate_out(self, name: str) -> Series: ...
    async def close(self) -> None: ...


class MemoryPlots:
    SOURCE = "console samples"

    def __init__(self, history: History) -> None:
        self._history = history

    async def cluster_rate_in(self) -> Series:
        return Series(self._history.cluster_rate_in(), self.SOURCE)

    async def cluster_rate_out(self) -> Series:
        return Series(self._history.cluster_rate_out(), self.SOURCE)

    async def topic_rate_in(self, name: str) -> Series:
        return Series(self._history.topic_rate_in(name), self.SOURCE)

    async def topic_rate_out(self, name: str) -> Series:
        return Series(self._history.topic_rate_out(name), self.SOURCE)

    async def group_lag(self, name: str) -> Series:
        return Series(self._history.group_lag(name), self.SOURCE)

    async def group_rate_out(self, name: str) -> Series:
        return Series(self._history.group_rate_out(name), self.SOURCE)

    async def close(self) -> None:
        return None


class PrometheusPlots:
    SOURCE = "Prometheus"

    def __init__(self, url: str, *, history: History, range_s: float, step_s: float, window_s: float,
                 timeout_s: float, clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self._url = url.rstrip("/") + QUERY_PATH
        self._fallback = MemoryPlots(history)
        self._range_s = range_s
        self._step_s = step_s
        self._window = f"{max(1, round(window_s))}s"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def cluster_rate_in(self) -> Series:
        query = f"sum(rate(sluice_messages_in_total[{self._window}]))"
        return await self._ask(query, self._fallback.cluster_rate_in)

    async def cluster_rate_out(self) -> Series:
        query = f"sum(rate(sluice_messages_out_total[{self._window}]))"
        return await self._ask(query, self._fallback.cluster_rate_out)

    async def topic_rate_in(self, name: str) -> Series:
        query = f"sum(rate(sluice_messages_in_total{{topic={label(name)}}}[{self._window}]))"
        return await self._ask(query, lambda: self._fallback.topic_rate_in(name))

    async def topic_rate_out(self, name: str) -> Series:
        query = f"sum(rate(sluice_messages_out_total{{topic={label(name)}}}[{self._window}]))"
        return await self._ask(query, lambda: self._fallback.topic_rate_out(name))

    async def group_lag(self, name: str) -> Series:
        query = f"sum(sluice_consumer_lag_messages{{group={label(name)}}})"
        return await self._ask(query, lambda: self._fallback.group_lag(name))

    async def group_rate_out(self, name: str) -> Series:
        query = f"sum(rate(sluice_messages_acked_total{{group={label(name)}}}[{self._window}]))"
        return await self._ask(query, lambda: self._fallback.group_rate_out(name))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _ask(self, query: str, fallback: Callable[[], Awaitable[Series]]) -> Series:
        end = self._clock()
        params = {"query": query, "start": f"{end - self._range_s:.3f}", "end": f"{end:.3f}",
                  "step": f"{self._step_s:g}"}  # fmt: skip
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=self._timeout)
            async with self._session.get(self._url, params=params) as answer:
                doc = await answer.json(content_type=None)
            return Series(matrix_points(doc), self.SOURCE)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("console: Prometheus query failed (%s): %s; plotting the console's own samples", query, exc)
            own = await fallback()
            return Series(own.points, f"console samples; Prometheus failed: {str(exc)[:120]}")


def label(value: str) -> str:
    """A PromQL label value: double-quoted, with backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def matrix_points(doc: Any) -> list[Point]:
    """The points of a `query_range` answer holding one series (a `sum`); [] when it holds none.
    ValueError for an error answer or a shape that is not a matrix."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error", "no status") if isinstance(doc, dict) else "not a JSON object"
        raise ValueError(f"Prometheus answered an error: {error}")
    data = doc.get("data") or {}
    if data.get("resultType") != "matrix":
        raise ValueError(f"Prometheus answered a {data.get('resultType')!r}, not a matrix")
    results = data.get("result") or []
    if not results:
        return []
    return [(float(t), float(v)) for t, v in results[0].get("values", [])]
