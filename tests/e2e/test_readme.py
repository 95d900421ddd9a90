"""README.md's commands, run as written, on a cluster of each topology.

The test reads README.md: every ```sh block whose commands are all `sluice admin ...` is a sequence
a newcomer types in order, and the ```python block with the client snippet is a program they run.
Each sequence runs command by command, each must exit 0; the only rewrites are the ports (the
cluster's free ports for the README's defaults 9876 and 8081) and `sluice` (this worktree's
`python -m sluice`, which `. .venv/bin/activate` puts on PATH as `sluice`). The README's sixth
admin command failed on its FIFO topic and its last waited forever: this catches both.

The tiering walkthrough runs too, on a merged cluster of its own: its moto server on a free port,
its `sluice up` flags, the client snippet (producing to `demo`), then its `sluice admin tier` commands.

The snippet runs on the merged topology, started as `make up` starts it (topics and groups created
on first use); the admin sequences on both topologies, each on a cluster of its own (the README's
names, `orders` and `billing`, must be new there).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.support.cluster import SLUICE, Cluster, start_merged, start_separated
from tests.helpers.procs import LOOPBACK, REPO_ROOT, free_port, start_process

README = REPO_ROOT / "README.md"
README_NAMESRV = "127.0.0.1:9876"
README_ENDPOINT = "127.0.0.1:8081"
README_S3_PORT = "5000"  # the moto server of the tiering walkthrough
COMMAND_TIMEOUT_S = 60.0
SNIPPET_TIMEOUT_S = 120.0
ADMIN_COMMANDS_MIN = 7  # the README's admin walkthrough: topic, group, offsets, clients, send, tail
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def fenced_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def commands(block: str) -> list[list[str]]:
    """The block's commands as argv lists: continuation lines joined, comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def admin_sequences(text: str) -> list[list[list[str]]]:
    """Every sh block made only of `sluice admin` commands (a walkthrough of the admin tool)."""
    found = []
    for block in fenced_blocks(text, "sh"):
        argvs = commands(block)
        if argvs and all(argv[:2] == ["sluice", "admin"] for argv in argvs):
            found.append(argvs)
    return found


def words(argv: list[str]) -> list[str]:
    """`sluice admin`'s words after its shared `--namesrv HOST:PORT`: area, action, arguments."""
    rest = argv[2:]
    return rest[2:] if rest[:1] == ["--namesrv"] else rest


def as_run_here(argv: list[str], cluster: Cluster) -> list[str]:
    return [*SLUICE, *(cluster.namesrv if word == README_NAMESRV else word for word in argv[1:])]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def _run_sequence(cluster: Cluster, sequence: list[list[str]]) -> dict[str, str]:
    """Runs each command; returns stdout by command (`topic create`, `message tail`, ...)."""
    outputs = {}
    for argv in sequence:
        proc = subprocess.run(as_run_here(argv, cluster), cwd=REPO_ROOT, env=_env(), capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S, check=False)  # fmt: skip
        assert proc.returncode == 0, f"README command failed on {cluster.kind}: {shlex.join(argv)}\n{proc.stderr}"
        outputs[" ".join(words(argv)[:2])] = proc.stdout
    return outputs


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text()


@pytest.fixture(scope="module", params=["merged", "separated"])
def fresh_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp(f"readme-{request.param}")
    # Merged as `make up` runs it: topics and groups created on first use, one shard per core.
    started = start_merged(root, auto_create=True, shards=None) if request.param == "merged" else start_separated(root)
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def test_the_readme_has_its_admin_walkthrough(readme: str) -> None:
    sequences = admin_sequences(readme)
    assert any(len(s) >= ADMIN_COMMANDS_MIN for s in sequences), sequences
    said = {" ".join(words(argv)[:2]) for s in sequences for argv in s}
    assert {"topic create", "message send", "message tail"} <= said, said


def test_the_readme_admin_sequences_run_as_written(fresh_cluster: Cluster, readme: str) -> None:
    for sequence in admin_sequences(readme):
        outputs = _run_sequence(fresh_cluster, sequence)
        if "message tail" in outputs:  # the walkthrough's tail shows what its send stored, then stops
            body = next(words(argv)[3] for argv in sequence if words(argv)[:2] == ["message", "send"])
            assert body in outputs["message tail"], outputs["message tail"]


def test_the_readme_client_snippet_runs_as_written(fresh_cluster: Cluster, readme: str, tmp_path: Path) -> None:
    if fresh_cluster.kind != "merged":
        pytest.skip("the snippet is the merged topology's (`make up`): it relies on topics created on first use")
    _run_snippet(readme, fresh_cluster.endpoints, tmp_path)


def _run_snippet(readme: str, endpoints: str, tmp_path: Path) -> None:
    """README's client snippet against `endpoints`: it must print what it sent and received."""
    (snippet,) = [b for b in fenced_blocks(readme, "python") if "ClientConfiguration(" in b]
    assert README_ENDPOINT in snippet
    program = tmp_path / "snippet.py"
    program.write_text(snippet.replace(README_ENDPOINT, endpoints))
    proc = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=SNIPPET_TIMEOUT_S, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sent " in proc.stdout and "received b'hello, sluice'" in proc.stdout, proc.stdout + proc.stderr


def test_the_readme_tiering_walkthrough_runs_as_written(
    readme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = [b for b in fenced_blocks(readme, "sh") if "moto.server" in b]
    s3_port = str(free_port())
    argvs = [[w.replace(f"127.0.0.1:{README_S3_PORT}", f"{LOOPBACK}:{s3_port}") if w != README_S3_PORT else s3_port
              for w in argv] for argv in commands(block)]  # fmt: skip
    kinds = [argv[0] if argv[0] != "sluice" else f"sluice {argv[1]}" for argv in argvs]
    assert kinds[:4] == ["python", "export", "python", "sluice up"] and set(kinds[4:]) == {"sluice admin"}, kinds
    moto, _, bucket, up, *admin = argvs
    assert moto[-1] == "&"  # a server in the background: started here, stopped at the end
    server = start_process([sys.executable, *moto[1:-1]], port=int(s3_port), log_path=tmp_path / "moto.log",
                           name="moto")  # fmt: skip
    cluster = None
    try:
        for pair in argvs[1][1:]:
            key, _, value = pair.partition("=")
            monkeypatch.setenv(key, value)
        made = subprocess.run([sys.executable, *bucket[1:]], env=_env(), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False)  # fmt: skip
        assert made.returncode == 0, made.stderr
        # One shard: `tier status` below expects the topic's one row (with shards it has one per shard).
        cluster = start_merged(tmp_path / "cluster", auto_create=True, extra_args=up[2:])
        _run_snippet(readme, cluster.endpoints, tmp_path)  # "after producing to demo as above"
        outputs = _run_sequence(cluster, admin)
        assert "demo" in outputs["tier evict-local"], outputs
        (status,) = [r for broker in cluster.admin("tier", "status") for r in broker["topics"] if r["topic"] == "demo"]
        assert status["objects"] >= 1 and status["lag_messages"] == 0, status  # it is in the bucket
    finally:
        problems = cluster.stop() if cluster is not None else []
        server.stop()
    assert not problems, "cluster teardown:\n" + "\n".join(problems)
