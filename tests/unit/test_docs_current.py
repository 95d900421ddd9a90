"""Operator docs that must stay true: the configuration reference matches the typed configuration,
and no page points outside the repository (users have only the repository)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from sluice import main as cli
from sluice.configref import render

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


def test_docs_readme_is_the_one_index() -> None:
    """docs/README.md lists every page and says where each reader starts; README.md links it."""
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    missing = [name for name in pages if f"]({name})" not in index]
    assert not missing, f"pages missing from docs/README.md: {missing}"
    for reader in ("**Operator**", "**Application developer**", "**Data engineer**", "**Contributor**"):
        assert reader in index, f"docs/README.md has no start for {reader}"
    assert "](docs/README.md)" in (ROOT / "README.md").read_text()


def test_one_way_to_run_sluice() -> None:
    """The docs run `sluice` as it is on PATH after `. .venv/bin/activate` (README.md says how),
    never as `.venv/bin/sluice` (the README used both)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.name}:{n}" for p in pages for n, line in enumerate(p.read_text().splitlines(), 1)
             if ".venv/bin/sluice" in line]  # fmt: skip
    assert not found, f"run sluice from PATH (. .venv/bin/activate), not .venv/bin/sluice: {found}"
    assert ". .venv/bin/activate" in (ROOT / "README.md").read_text()


def test_every_sluice_command_in_the_readme_parses() -> None:
    """Each `sluice ...` line of README.md's sh blocks is a command `sluice` accepts as written
    (tests/e2e/test_readme.py runs the admin walkthrough; this covers the rest: up, spark, tier)."""
    fences = re.findall(r"^```sh\n(.*?)^```$", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    argvs = [shlex.split(line, comments=True) for block in fences for line in block.replace("\\\n", " ").splitlines()]
    commands = [argv[1:] for argv in argvs if argv[:1] == ["sluice"]]
    assert len(commands) >= 10, commands
    for argv in commands:
        try:
            cli.parse(cli.build_parser(argv[0]), argv)
        except SystemExit as exc:
            raise AssertionError(f"README.md: sluice {shlex.join(argv)} is refused") from exc
