"""The console's plots read from Prometheus: the PromQL it sends, the points it draws, and the
fall-back to its own samples when Prometheus fails. A fake Prometheus (aiohttp on loopback) answers
`/api/v1/query_range` as the real one does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from console.config import ConsoleConfig
from console.history import GroupPoint, History
from console.plots import PrometheusPlots, label, matrix_points

NOW = 1_700_000_000.0
MATRIX = {"status": "success", "data": {"resultType": "matrix",
          "result": [{"metric": {}, "values": [[NOW - 20, "1.5"], [NOW - 10, "2"], [NOW, "0"]]}]}}  # fmt: skip


def with_fake_prometheus(answer: Any, status: int = 200) -> tuple[list[dict[str, str]], list[Any]]:
    """Ask every kind of plot of a fake Prometheus answering `answer`; (queries seen, series got)."""
    seen: list[dict[str, str]] = []

    async def query_range(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        return web.json_response(answer, status=status)

    async def main() -> list[Any]:
        app = web.Application()
        app.router.add_get("/api/v1/query_range", query_range)
        history = History(history_s=3600, interval_s=10, watched_max=10, clock=lambda: NOW)
        history.record_group('g"1', GroupPoint(consumed=0, lag=7, in_flight=0))
        async with TestServer(app, host="127.0.0.1") as server:
            plots = PrometheusPlots(str(server.make_url("/")), history=history, range_s=3600, step_s=10,
                                    window_s=60, timeout_s=5, clock=lambda: NOW)  # fmt: skip
            try:
                return [await plots.topic_rate_in("t\\1"), await plots.topic_rate_out("t"),
                        await plots.group_lag('g"1'), await plots.group_rate_out("g"),
                        await plots.cluster_rate_in(), await plots.cluster_rate_out()]  # fmt: skip
            finally:
                await plots.close()

    return seen, asyncio.run(main())


def test_plots_come_from_range_queries_of_the_exported_families() -> None:
    seen, got = with_fake_prometheus(MATRIX)
    assert [q["query"] for q in seen] == [
        'sum(rate(sluice_messages_in_total{topic="t\\\\1"}[60s]))',
        'sum(rate(sluice_messages_out_total{topic="t"}[60s]))',
        'sum(sluice_consumer_lag_messages{group="g\\"1"})',
        'sum(rate(sluice_messages_acked_total{group="g"}[60s]))',
        "sum(rate(sluice_messages_in_total[60s]))",
        "sum(rate(sluice_messages_out_total[60s]))",
    ]
    assert {(q["start"], q["end"], q["step"]) for q in seen} == {(f"{NOW - 3600:.3f}", f"{NOW:.3f}", "10")}
    assert all(s.source == "Prometheus" for s in got)
    assert got[0].points == [(NOW - 20, 1.5), (NOW - 10, 2.0), (NOW, 0.0)]


def test_a_failing_prometheus_falls_back_to_the_consoles_own_samples_and_says_so() -> None:
    _, got = with_fake_prometheus({"status": "error", "error": "parse error"}, status=400)
    assert all("Prometheus failed" in s.source and "parse error" in s.source for s in got)
    assert got[2].points == [(NOW, 7.0)]  # the group's lag the console sampled itself


def test_answers_parse_as_one_series_or_none() -> None:
    assert matrix_points({"status": "success", "data": {"resultType": "matrix", "result": []}}) == []
    with pytest.raises(ValueError, match="not a matrix"):
        matrix_points({"status": "success", "data": {"resultType": "vector", "result": []}})
    assert label('a"b\\c') == '"a\\"b\\\\c"'


def test_the_prometheus_setting_must_be_an_http_url() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        ConsoleConfig(prometheus="prometheus:9090")
    assert ConsoleConfig(prometheus="http://127.0.0.1:9090").prometheus
