"""The merged metrics of a parent and its workers (ops/merge.py): every family once, each
worker's samples labelled with its index, the parent's as they are, parseable exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ops.merge import WORKER_LABEL, merge
from processes.workerpool import available_cores, worker_count


def _worker_text(calls: float, extra: bool = False) -> str:
    registry = CollectorRegistry()
    counter = Counter("demo_calls", "Calls served.", ["rpc"], registry=registry)
    counter.labels(rpc="SendMessage").inc(calls)
    if extra:
        Gauge("demo_only_in_workers", "A family the parent lacks.", registry=registry).set(7)
    return generate_latest(registry).decode()


def _parent() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("demo_calls", "Calls served.", ["rpc"], registry=registry).labels(rpc="Admin").inc(1)
    Gauge("demo_parent_gauge", "The parent's own.", registry=registry).set(3)
    return registry


def test_each_family_once_with_worker_labels() -> None:
    text = merge(_parent().collect(), [(0, _worker_text(5)), (1, _worker_text(2, extra=True))]).decode()
    assert text.count("# TYPE demo_calls_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    calls = {(s.labels.get(WORKER_LABEL), s.labels["rpc"]): s.value for s in families["demo_calls"].samples
             if s.name == "demo_calls_total"}  # fmt: skip
    assert calls == {(None, "Admin"): 1.0, ("0", "SendMessage"): 5.0, ("1", "SendMessage"): 2.0}
    assert [s.labels for s in families["demo_parent_gauge"].samples] == [{}]
    assert [(s.labels, s.value) for s in families["demo_only_in_workers"].samples] == [({WORKER_LABEL: "1"}, 7.0)]


def test_no_workers_is_the_parent_alone() -> None:
    parent = _parent()
    assert merge(parent.collect(), []) == generate_latest(parent)


def test_worker_count_defaults_to_the_usable_cores() -> None:
    assert worker_count(None) == available_cores() >= 1
    assert worker_count(3) == 3
