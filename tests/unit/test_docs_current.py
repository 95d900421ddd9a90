"""Operator docs that must stay true: the configuration reference matches the typed configuration,
and no page points outside the repository (users have only the repository)."""

from __future__ import annotations

import re
from pathlib import Path

from deploy.configref import render

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current() -> None:
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == render(), "docs/configuration.md is stale: run python scripts/gen_config_docs.py"


def test_every_config_key_is_in_the_reference() -> None:
    text = render()
    for key in ("`flush_policy`", "`segment_max_age_s`", "`client_report_s`", "`broker_expiry_s`", "`drain_s`"):
        assert key in text


def test_no_doc_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|PROTOCOL\.md|ARCHITECTURE\.md|\]\(\.\./")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.name}:{n}" for p in pages for n, line in enumerate(p.read_text().splitlines(), 1)
             if outside.search(line)]  # fmt: skip
    assert not found, f"links outside the repository: {found}"
