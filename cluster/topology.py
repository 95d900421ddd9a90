"""The model of a topology: which Sluice processes run on this machine, and how each is started and probed.

A `Topology` is what `loader.load_topology` makes of a topology file, and what the supervisor runs.
Invariants (the loader checks them): process names are unique and safe as file names; every port
is fixed (1..65535) and used by one process only; `processes` is in start order — NameServers,
navigation servers, brokers, proxies (a merged topology holds only `up` processes) — and `groups()`
yields the processes that start together; `argv` is a complete `sluice` command line (the
subcommand first), naming `config_path` when `config` is not empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import check_bounds

KINDS = ("etcd", "nameserver", "navigation", "broker", "proxy", "up")
# Dependency order: brokers register with NameServers (and join their groups in etcd), proxies with
# navigation and NameServers.
START_RANK = {"up": 0, "etcd": 0, "nameserver": 0, "navigation": 1, "broker": 2, "proxy": 3}
LOG_LEVELS = ("debug", "info", "warning", "error")
PORT_MAX = 65535
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """The `[cluster]` table: defaults for every process and the supervisor's timings."""

    # Address every process listens on unless its entry says otherwise.
    host: str = "127.0.0.1"
    log_level: str = "info"
    # A process that is not ready this long after it was started is a failed start.
    ready_timeout_s: float = 30.0
    # After SIGTERM a process gets this long (plus a proxy's drain_s) before SIGKILL.
    stop_timeout_s: float = 10.0
    # Restart delays double from the initial one up to the maximum...
    restart_backoff_initial_s: float = 0.5
    restart_backoff_max_s: float = 30.0
    # ...and a process that fails this many times in a row is given up (state "failed").
    restart_limit: int = 10
    # A process that stayed up this long starts a new run of failures (its backoff resets).
    restart_reset_s: float = 60.0

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        check_bounds(
            self,
            positive=("ready_timeout_s", "stop_timeout_s", "restart_backoff_initial_s", "restart_backoff_max_s"),
            not_negative=("restart_limit", "restart_reset_s"),
        )
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise ValueError("restart_backoff_max_s must not be below restart_backoff_initial_s")

    def backoff_s(self, failures: int) -> float:
        """Delay before the restart that follows `failures` (>= 1) consecutive failures."""
        assert failures >= 1, failures
        return min(self.restart_backoff_initial_s * 2 ** min(failures - 1, 32), self.restart_backoff_max_s)


@dataclass(frozen=True)
class Probe:
    """One readiness check: HTTP GET of `path` answering 200, or (no path) a TCP port accepting."""

    host: str
    port: int
    path: str = ""

    @property
    def target(self) -> str:
        where = host_port(self.host, self.port)
        return f"http://{where}{self.path}" if self.path else f"tcp://{where}"

    @classmethod
    def parse(cls, target: str) -> Probe:
        """The inverse of `target` (the state file stores targets)."""
        scheme, sep, rest = target.partition("://")
        if not sep or scheme not in ("http", "tcp"):
            raise ValueError(f"not a probe target: {target!r}")
        where, _, path = rest.partition("/")
        host, _, port = where.rpartition(":")
        return cls(host.strip("[]"), int(port), "/" + path if scheme == "http" else "")


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    kind: str
    host: str  # the address it listens on
    argv: tuple[str, ...]  # after `sluice`: the subcommand and its flags
    ports: Mapping[str, int]  # role (port, http_port, metrics_port, ...) -> port
    config: Mapping[str, Any]  # content of the --config file (component tables); empty: no file
    config_path: Path | None
    data_dir: Path | None
    log_path: Path
    probes: tuple[Probe, ...]  # all must pass for the process to be ready
    stop_timeout_s: float


@dataclass(frozen=True)
class Topology:
    source: Path
    run_dir: Path
    settings: ClusterSettings
    processes: tuple[ProcessSpec, ...]
    port_offset: int = 0

    def groups(self) -> list[tuple[ProcessSpec, ...]]:
        """Processes that start together, in start order (stop order is the reverse)."""
        ranks = sorted({START_RANK[p.kind] for p in self.processes})
        return [tuple(p for p in self.processes if START_RANK[p.kind] == rank) for rank in ranks]

    def process(self, name: str) -> ProcessSpec:
        for spec in self.processes:
            if spec.name == name:
                return spec
        raise KeyError(name)


def connect_host(host: str) -> str:
    """The address another process on this machine uses to reach a server bound to `host`."""
    return WILDCARD_HOSTS.get(host, host)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
