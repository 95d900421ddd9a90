"""What `sluice cluster` says: `down` showed etcd's normal stop as `exit code -15`, and `up --detach`
told the user to stop with Ctrl-C, which reaches a background supervisor not at all."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cluster.control import exit_meaning
from cluster.loader import load_topology
from sluice.commands import cluster

TOPOLOGY = Path(__file__).resolve().parents[2] / "deploy" / "topologies" / "separated.toml"


@pytest.mark.parametrize(
    ("code", "said"),
    [(0, "exit code 0"), (1, "exit code 1"), (-signal.SIGTERM, "ended by SIGTERM, as asked"),
     (-signal.SIGKILL, "ended by SIGKILL"), (-200, "ended by signal 200")],
)  # fmt: skip
def test_an_exit_reads_as_what_happened(code: int, said: str) -> None:
    assert exit_meaning(code) == said


@pytest.mark.parametrize(("foreground", "stop"), [(True, "stop with Ctrl-C or sluice cluster down"),
                                                  (False, "stop with sluice cluster down")])  # fmt: skip
def test_ready_line_names_a_way_to_stop_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreground: bool, stop: str
) -> None:
    cluster._announce(load_topology(TOPOLOGY, run_dir=tmp_path, port_offset=0), foreground=foreground)
    line = capsys.readouterr().out
    assert f"{stop} --run-dir {tmp_path}" in line, line
