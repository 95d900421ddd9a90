"""common/metrics.py: hot-path helpers (cached children, the off switch) and scrape-time sources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY, generate_latest

from common import metrics


@pytest.fixture(autouse=True)
def _default_config() -> Iterator[None]:
    metrics.configure(metrics.MetricsConfig())
    yield
    metrics.configure(metrics.MetricsConfig())


def value(name: str, **labels: str) -> float:
    got = REGISTRY.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_counters_move_per_batch() -> None:
    before = value("sluice_messages_in_total", topic="unit-a")
    metrics.count_in("unit-a", 3, 300)
    metrics.count_in("unit-a", 2, 20)
    assert value("sluice_messages_in_total", topic="unit-a") == before + 5
    assert value("sluice_message_bytes_in_total", topic="unit-a") >= 320


def test_rpc_observation_counts_by_code_and_times() -> None:
    metrics.observe_rpc("SendMessage", "OK", 0.002)
    metrics.observe_rpc("SendMessage", "TOPIC_NOT_FOUND", 0.001)
    assert value("sluice_proxy_rpc_requests_total", rpc="SendMessage", code="TOPIC_NOT_FOUND") >= 1
    assert value("sluice_proxy_rpc_duration_seconds_count", rpc="SendMessage") >= 2


def test_disabled_metrics_do_not_move() -> None:
    metrics.configure(metrics.MetricsConfig(enabled=False))
    before = value("sluice_messages_out_total", topic="unit-off", group="g")
    metrics.count_out("unit-off", "g", 10, 10)
    metrics.observe_rpc("AckMessage", "OK", 0.1)
    assert value("sluice_messages_out_total", topic="unit-off", group="g") == before == 0


def test_scrape_sources_are_asked_at_scrape_time_and_removed() -> None:
    backlog = {"n": 4.0}
    remove = metrics.register_gauge_source(metrics.TIMER_PENDING, lambda: backlog["n"], "unit-broker")
    try:
        assert value("sluice_timer_pending_messages", broker="unit-broker") == 4.0
        backlog["n"] = 7.0
        assert value("sluice_timer_pending_messages", broker="unit-broker") == 7.0
    finally:
        remove()
    assert REGISTRY.get_sample_value("sluice_timer_pending_messages", {"broker": "unit-broker"}) is None
    # The family stays in the exposition with no sample.
    assert b"# TYPE sluice_timer_pending_messages gauge" in generate_latest(REGISTRY)


def test_same_labels_from_two_sources_are_summed() -> None:
    removers = [metrics.register_source(lambda: [(metrics.PROXY_IN_FLIGHT, (), 2.0)]) for _ in range(2)]
    try:
        text = generate_latest(REGISTRY).decode()
        lines = [ln for ln in text.splitlines() if ln.startswith("sluice_proxy_in_flight_requests ")]
        assert lines == ["sluice_proxy_in_flight_requests 4.0"]
    finally:
        for remove in removers:
            remove()


def test_series_beyond_the_limit_are_dropped_and_counted() -> None:
    metrics.configure(metrics.MetricsConfig(max_series_per_family=3))
    samples = [(metrics.CONSUMER_LAG, ("b", f"g{i}", "t"), 1.0) for i in range(5)]
    remove = metrics.register_source(lambda: samples)
    try:
        text = generate_latest(REGISTRY).decode()
        assert sum(1 for ln in text.splitlines() if ln.startswith("sluice_consumer_lag_messages{")) == 3
        assert value("sluice_metrics_series_dropped_total", family="sluice_consumer_lag_messages") >= 2
    finally:
        remove()


def test_gauge_source_checks_its_labels() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        metrics.register_gauge_source(metrics.TIER_UPLOAD_LAG, lambda: 1.0, "only-broker")
