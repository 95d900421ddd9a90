"""`status` and `down`: read the state file, probe what it lists, signal the supervisor.

Neither writes the state file while its supervisor lives (the supervisor is its only writer); once
the supervisor is gone, `down` stops what is left by pid and records the cluster as stopped.
A pid is signalled only while its command line still shows a Sluice process (`sluice.main` for
children, `cluster` for the supervisor), so a pid reused by another program is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cluster import probe
from cluster.errors import NoCluster
from cluster.state import LIVE_STATES, ClusterState, ProcessState, read_state, write_state
from cluster.topology import Probe

SUPERVISOR_MARKER = "cluster"
CHILD_MARKER = "sluice"
POLL_S = 0.1
KILL_WAIT_S = 5.0
DOWN_MARGIN_S = 10.0


@dataclass
class ProcessStatus:
    name: str
    kind: str
    pid: int | None
    alive: bool
    ports: dict[str, int]
    state: str
    health: str
    restarts: int
    last_exit_code: int | None
    log: str
    probes: list[str]


@dataclass
class ClusterStatus:
    run_dir: str
    topology: str
    supervisor_pid: int
    supervisor_alive: bool
    state: str
    processes: list[ProcessStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.supervisor_alive and all(p.health == probe.READY for p in self.processes)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "healthy": self.healthy}


def supervisor_alive(state: ClusterState) -> bool:
    return probe.is_sluice_process(state.supervisor_pid, SUPERVISOR_MARKER)


def running_state(run_dir: str | Path) -> ClusterState:
    """The recorded cluster if it may still run anything; NoCluster when none does."""
    state = read_state(run_dir)
    if state.state not in LIVE_STATES and not supervisor_alive(state):
        raise NoCluster(str(run_dir))
    return state


def cluster_status(run_dir: str | Path, *, probe_timeout_s: float = probe.PROBE_TIMEOUT_S) -> ClusterStatus:
    state = running_state(run_dir)
    status = ClusterStatus(str(run_dir), state.topology, state.supervisor_pid, supervisor_alive(state), state.state)
    for proc in state.processes:
        alive = probe.is_sluice_process(proc.pid, CHILD_MARKER)
        health = probe.health([Probe.parse(t) for t in proc.probes], probe_timeout_s) if alive else probe.DOWN
        status.processes.append(
            ProcessStatus(
                proc.name,
                proc.kind,
                proc.pid if alive else None,
                alive,
                proc.ports,
                proc.state,
                health,
                proc.restarts,
                proc.last_exit_code,
                proc.log,
                proc.probes,
            )
        )
    return status


@dataclass
class Stopped:
    name: str
    kind: str
    pid: int | None
    how: str  # "stopped by the supervisor (code 0)", "killed by down", "was not running", ...


@dataclass
class DownReport:
    supervisor_pid: int
    supervisor: str  # what happened to the supervisor
    processes: list[Stopped]
    survivors: list[str]  # names still alive afterwards (an error)


def cluster_down(run_dir: str | Path, *, timeout_s: float | None = None) -> DownReport:
    """SIGTERM the supervisor and wait (bounded) until it exited; stop by pid whatever it left behind."""
    state = running_state(run_dir)
    bound_s = timeout_s if timeout_s is not None else state.stop_bound_s + DOWN_MARGIN_S
    recorded = {p.name: p.pid for p in state.processes}
    if supervisor_alive(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, signal.SIGTERM)
        gone = _wait_gone(state.supervisor_pid, bound_s, SUPERVISOR_MARKER)
        what = "stopped" if gone else f"did not exit within {bound_s:g} s"
    else:
        what = "was already gone"
    final = _read_final(run_dir, state)
    report = DownReport(state.supervisor_pid, what, [], [])
    for proc in final.processes:
        pid = proc.pid if proc.pid is not None else recorded.get(proc.name)
        if probe.is_sluice_process(pid, CHILD_MARKER):
            assert pid is not None
            how = _stop_orphan(pid, proc.stop_timeout_s)
        else:
            how = _how_it_ended(proc, pid)
        if probe.is_sluice_process(pid, CHILD_MARKER):
            report.survivors.append(proc.name)
        report.processes.append(Stopped(proc.name, proc.kind, pid, how))
    if not supervisor_alive(final) and final.state in LIVE_STATES:
        final.state = "stopped"  # the supervisor is gone: nobody else writes the file now
        write_state(run_dir, final)
    return report


def _read_final(run_dir: str | Path, fallback: ClusterState) -> ClusterState:
    try:
        return read_state(run_dir)
    except (NoCluster, RuntimeError):
        return fallback


def _how_it_ended(proc: ProcessState, pid: int | None) -> str:
    if pid is None:
        return f"was not running ({proc.state})"
    return "stopped" if proc.last_exit_code is None else f"stopped ({exit_meaning(proc.last_exit_code)})"


def exit_meaning(code: int) -> str:
    """A child's exit as a person reads it: a negative code is the signal that ended it, and SIGTERM
    is the supervisor's own stop request (etcd, for one, ends by SIGTERM after a clean shutdown)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"ended by signal {-code}"
    return "ended by SIGTERM, as asked" if name == "SIGTERM" else f"ended by {name}"


def _stop_orphan(pid: int, stop_timeout_s: float) -> str:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, stop_timeout_s, CHILD_MARKER):
        return "stopped by down (SIGTERM)"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # it leads its own process group (see supervisor.py)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return "killed by down (SIGKILL)" if _wait_gone(pid, KILL_WAIT_S, CHILD_MARKER) else "survived SIGKILL"


def _wait_gone(pid: int, timeout_s: float, marker: str) -> bool:
    deadline = time.monotonic() + timeout_s
    while probe.is_sluice_process(pid, marker):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True
