"""`sluice cluster` end to end: the shipped separated topology as real processes on loopback.

`sluice cluster up --topology deploy/topologies/separated.toml` runs as a child process, with
`--port-offset` moving every port of the file onto ports found free (below the ephemeral range,
so no test's `free_port()` can take one meanwhile). The test waits until `sluice cluster status
--json` shows every process ready, SIGKILLs one broker by its pid and sees the supervisor restart
it (restarts 1, a new pid, ready again; nothing else restarted), then `sluice cluster down` stops
everything: the supervisor exits 0, no pid from the state file is left, nor any process whose
command line names the run dir (proxy workers included). Bounded well under 60 s;
teardown stops the supervisor and any recorded process by pid if the test failed half-way.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.probe import is_sluice_process

REPO_ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO_ROOT / "deploy" / "topologies" / "separated.toml"
SLUICE = [sys.executable, "-m", "sluice"]
LOOPBACK = "127.0.0.1"
READY_WAIT_S = 50.0
RESTART_WAIT_S = 20.0
COMMAND_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.3
OFFSET_MIN, OFFSET_MAX = 2_000, 20_000  # topology ports are 8081..11012: shifted, they stay below 32768
OFFSET_TRIES = 50


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def topology_ports() -> set[int]:
    """Every port of the topology file: each entry's *port keys (a proxy's workers share its ports)."""
    with TOPOLOGY.open("rb") as fh:
        data = tomllib.load(fh)
    ports: set[int] = set()
    for kind in ("nameserver", "navigation", "broker", "proxy", "up"):
        for entry in data.get(kind, []):
            ports.update(v for k, v in entry.items() if k == "port" or k.endswith("_port"))
    ports.discard(0)
    return ports


def free_port_offset() -> int:
    ports = topology_ports()
    rng = random.Random()
    for _ in range(OFFSET_TRIES):
        offset = rng.randrange(OFFSET_MIN, OFFSET_MAX)
        if all(port_free(port + offset) for port in ports):
            return offset
    pytest.fail(f"no port offset in {OFFSET_MIN}..{OFFSET_MAX} leaves all {len(ports)} topology ports free")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, *args], cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip


def status(run_dir: Path) -> dict[str, Any] | None:
    """`sluice cluster status --json`, or None while there is no state file yet."""
    done = sluice("cluster", "status", "--json", "--run-dir", str(run_dir))
    if not done.stdout.strip():
        return None
    parsed: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == (0 if parsed["healthy"] else 1), done.stderr
    return parsed


def process(state: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in state["processes"] if p["name"] == name)
    return found


Check = Callable[[dict[str, Any]], bool]


def wait_status(
    run_dir: Path, up: subprocess.Popen[bytes], log: Path, what: str, ok: Check, wait_s: float
) -> dict[str, Any]:
    """Poll until `sluice cluster status --json` satisfies `ok`.

    Each status run is a whole `sluice` process; on a small loaded machine polling with it would
    slow the cluster's own start. So the state file (a cheap read, the same fields) is watched
    first, and `status --json` is run once it looks right.
    """
    deadline = time.monotonic() + wait_s
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        assert up.poll() is None, f"sluice cluster up exited {up.returncode}:\n{log.read_text()[-3000:]}"
        if state_looks_ready(run_dir):
            last = status(run_dir)
            if last is not None and ok(last):
                return last
        time.sleep(POLL_S)
    pytest.fail(f"not {what} within {wait_s} s; last status: {json.dumps(last, indent=1)}\n{log.read_text()[-3000:]}")


def state_looks_ready(run_dir: Path) -> bool:
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((run_dir / "cluster.json").read_text())
        return bool(state["state"] == "running" and all(p["state"] == "running" for p in state["processes"]))
    return False


def recorded_pids(run_dir: Path) -> dict[str, int]:
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((run_dir / "cluster.json").read_text())
        return {p["name"]: p["pid"] for p in state["processes"] if p["pid"]}
    return {}


def processes_of(run_dir: Path) -> dict[int, str]:
    """Every process whose command line names the run dir (each child's --config does): workers too."""
    found: dict[int, str] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(run_dir) in command and int(entry.name) != os.getpid():
                found[int(entry.name)] = command
    return found


@pytest.fixture
def cluster_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    run_dir, log = tmp_path / "run", tmp_path / "up.log"
    argv = [*SLUICE, "cluster", "up", "--topology", str(TOPOLOGY), "--run-dir", str(run_dir),
            "--port-offset", str(free_port_offset())]  # fmt: skip
    with log.open("wb") as out:
        up = subprocess.Popen(argv, cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield up, run_dir, log
    finally:
        recorded = recorded_pids(run_dir)
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait(timeout=STOP_TIMEOUT_S)
        for pid in {*recorded.values(), *recorded_pids(run_dir).values(), *processes_of(run_dir)}:
            if is_sluice_process(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cluster_up_status_restart_down(cluster_up: tuple[subprocess.Popen[bytes], Path, Path]) -> None:
    up, run_dir, log = cluster_up
    ready = wait_status(run_dir, up, log, "every process ready", lambda s: s["healthy"], READY_WAIT_S)
    names = [p["name"] for p in ready["processes"]]
    assert names == ["nameserver-1", "navigation-1", "broker-a", "broker-b", "proxy-a", "proxy-b"]
    assert ready["supervisor_alive"] and ready["state"] == "running"
    assert all(p["restarts"] == 0 and p["state"] == "running" and p["alive"] for p in ready["processes"])

    victim = process(ready, "broker-a")["pid"]
    os.kill(victim, signal.SIGKILL)

    def restarted(s: dict[str, Any]) -> bool:
        broker = process(s, "broker-a")
        return bool(broker["restarts"] == 1 and broker["pid"] not in (None, victim) and s["healthy"])

    after = wait_status(run_dir, up, log, "broker-a restarted and ready", restarted, RESTART_WAIT_S)
    assert process(after, "broker-a")["last_exit_code"] == -signal.SIGKILL
    assert all(p["restarts"] == 0 for p in after["processes"] if p["name"] != "broker-a")
    supervisor_log = log.read_text()
    assert "process exited; restarting name=broker-a" in supervisor_log
    assert "code -9 (SIGKILL)" in supervisor_log

    pids = recorded_pids(run_dir)
    assert len(pids) == len(names)
    down = sluice("cluster", "down", "--run-dir", str(run_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped the cluster" in down.stdout
    assert up.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()[-3000:]
    left = [f"{name} ({pid})" for name, pid in pids.items() if is_sluice_process(pid)]
    assert not left, f"still running after down: {left}"
    assert not processes_of(run_dir), "no worker or other child of the cluster is left"

    gone = sluice("cluster", "status", "--run-dir", str(run_dir))
    assert gone.returncode == 1
    assert "no cluster is running in" in gone.stderr
