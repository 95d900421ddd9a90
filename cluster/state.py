"""The state file `<run-dir>/cluster.json`: what the supervisor runs, for `status` and `down`.

Only the supervisor writes it, atomically (a temporary file renamed over the old one), whenever a
process starts, turns ready, exits or restarts, and when the cluster's own state changes. `status`
and `down` only read it. Format (version 1):

    {"version": 1, "supervisor_pid": 4242, "state": "running", "topology": "/abs/separated.toml",
     "run_dir": "/abs/run", "port_offset": 0, "started_at": "…Z", "updated_at": "…Z", "stop_bound_s": 64.0,
     "processes": [{"name": "broker-a", "kind": "broker", "pid": 4250, "state": "running", "restarts": 0,
                    "ports": {"port": 10911, "metrics_port": 11011}, "log": "/abs/run/logs/broker-a.log",
                    "probes": ["http://127.0.0.1:11011/readyz"], "last_exit_code": null,
                    "stop_timeout_s": 10.0, "command": ["/usr/bin/python3", "-m", "sluice", "broker", …]}]}

Cluster states: starting, running, stopping, stopped (after a clean stop), failed (the start failed
and everything was stopped). Process states: pending, starting, running, backoff (waiting to be
restarted), failed (given up after too many restarts), stopping, stopped. `stop_bound_s` bounds how
long the supervisor's stop can take (what `down` waits for).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.errors import ClusterError, NoCluster

STATE_FILE = "cluster.json"
FORMAT_VERSION = 1
LIVE_STATES = ("starting", "running", "stopping")


@dataclass
class ProcessState:
    name: str
    kind: str
    ports: dict[str, int]
    log: str
    probes: list[str]
    command: list[str]
    stop_timeout_s: float
    pid: int | None = None
    state: str = "pending"
    restarts: int = 0
    last_exit_code: int | None = None


@dataclass
class ClusterState:
    supervisor_pid: int
    topology: str
    run_dir: str
    port_offset: int = 0
    state: str = "starting"
    started_at: str = ""
    updated_at: str = ""
    stop_bound_s: float = 0.0
    processes: list[ProcessState] = field(default_factory=list)
    version: int = FORMAT_VERSION

    def process(self, name: str) -> ProcessState:
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(name)


def state_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / STATE_FILE


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_state(run_dir: str | Path, state: ClusterState) -> None:
    """Replace the state file atomically: a reader sees the old or the new content, never a mix."""
    state.updated_at = now_iso()
    path = state_path(run_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(state), indent=2) + "\n")
    os.replace(tmp, path)


def read_state(run_dir: str | Path) -> ClusterState:
    """The recorded cluster; NoCluster when there is no state file, ClusterError when it is unreadable."""
    path = state_path(run_dir)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise NoCluster(str(run_dir)) from None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"state file {path} is unreadable: {exc}") from None
    try:
        return _decode(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterError(
            f"state file {path} is not a Sluice cluster state (version {FORMAT_VERSION}): {exc}"
        ) from None


def _decode(raw: Any) -> ClusterState:
    if not isinstance(raw, dict):
        raise TypeError("not a JSON object")
    if raw.get("version") != FORMAT_VERSION:
        raise ValueError(f"version {raw.get('version')!r}")
    processes = [ProcessState(**p) for p in raw.get("processes", [])]
    return ClusterState(**{**raw, "processes": processes})
