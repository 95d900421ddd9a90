"""deploy/prometheus/alerts.yml: every metric it uses exists, and `promtool check rules` and
`promtool test rules` (deploy/prometheus/alerts.test.yml) pass. promtool comes from Debian's
`prometheus` package: `make promtool` unpacks it into build/prometheus (no service is installed or
started); `make test` does that first. Where it cannot be had the promtool tests skip."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
WANTED = {"SluiceConsumerLagGrowing", "SluiceDeadLettersGrowing", "SluiceDiskNearlyFull", "SluiceTieringStuck",
          "SluiceBrokerDown", "SluiceMqttRefusals", "SluiceMqttDeliveriesStuck"}  # fmt: skip


def _promtool() -> str | None:
    unpacked = ROOT / "build" / "prometheus" / "usr" / "bin" / "promtool"
    return str(unpacked) if unpacked.exists() else shutil.which("promtool")


def _families() -> set[str]:
    names: set[str] = set()
    for value in vars(metrics).values():
        name = getattr(value, "_name", None) or getattr(value, "name", None)
        if isinstance(name, str) and name.startswith("sluice_"):
            names.add(name)
    return names


def test_rules_cover_the_operator_alerts_and_use_real_metrics() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= WANTED
    known = _families()
    for rule in rules:
        used = set(re.findall(r"\b(sluice_[a-z0-9_]+)", rule["expr"]))
        assert used or "up{" in rule["expr"], rule["alert"]
        for name in used:
            base = name.removesuffix("_total")
            assert name in known or base in known, f"{rule['alert']} uses {name}, which Sluice does not export"
        assert rule["annotations"]["summary"] and rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize("command", [["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]])
def test_promtool(command: list[str]) -> None:
    tool = _promtool()
    if tool is None:
        pytest.skip("promtool not found: `make promtool` unpacks Debian's prometheus package into build/prometheus")
    proc = subprocess.run([tool, *command], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
