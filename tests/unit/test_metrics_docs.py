"""The metric names are defined once (common/metrics.py), documented once (docs/metrics.md), and the
Grafana dashboard (deploy/grafana/sluice.json) queries only documented names."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from common import metrics

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "sluice.json"
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def documented() -> set[str]:
    return set(re.findall(r"^\| `(sluice_[a-z0-9_]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE))


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_docs_list_exactly_the_defined_families() -> None:
    assert documented() == set(metrics.family_names())


def test_family_names_follow_prometheus_conventions() -> None:
    for name in metrics.family_names():
        assert re.fullmatch(r"sluice_[a-z0-9_]+", name), name
    for family in metrics.SCRAPE_FAMILIES:
        assert family.name.endswith("_total") == (family.kind == "counter"), family.name


def test_dashboard_is_valid_json_querying_only_documented_names() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard["panels"])
    assert len(exprs) >= 20
    names = documented()
    used: set[str] = set()
    for expr in exprs:
        for token in re.findall(r"\bsluice_[a-z0-9_]+", expr):
            base = token
            for suffix in HISTOGRAM_SUFFIXES:
                if token.endswith(suffix) and token.removesuffix(suffix) in names:
                    base = token.removesuffix(suffix)
            assert base in names, f"dashboard queries {token}, which docs/metrics.md does not list ({expr})"
            used.add(base)
    unused = names - used
    assert not unused, f"families without a dashboard panel: {sorted(unused)}"


def test_every_panel_has_a_unique_id_and_a_datasource() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["type"] == "prometheus", p["title"]
