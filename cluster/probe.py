"""Is a process alive, does it answer: the checks behind readiness waits and `sluice cluster status`.

Every check is bounded by its timeout and reports an unreachable target as a result, never by
raising. HTTP goes through `http.client` directly, so an `http_proxy` in the environment cannot
divert a probe of a loopback port.
"""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Iterable
from pathlib import Path

from cluster.topology import Probe

READY = "ready"
NOT_READY = "not ready"
UNREACHABLE = "unreachable"
DOWN = "down"
_WORST_FIRST = (UNREACHABLE, NOT_READY, READY)
PROBE_TIMEOUT_S = 1.0


def pid_alive(pid: int | None) -> bool:
    """True while `pid` exists and is not a zombie (exited, not yet reaped by its parent)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs here, or it just exited: kill(0) said it existed
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def pid_command(pid: int) -> list[str] | None:
    """The command line of `pid` (Linux procfs), or None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_sluice_process(pid: int | None, marker: str = "sluice") -> bool:
    """Alive and, where the command line is readable, running `marker`: guards against reused pids."""
    if not pid_alive(pid):
        return False
    assert pid is not None
    command = pid_command(pid)
    return command is None or any(marker in part for part in command)


def check(probe: Probe, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    if not probe.path:
        try:
            with socket.create_connection((probe.host, probe.port), timeout=timeout_s):
                return READY
        except OSError:
            return UNREACHABLE
    conn = http.client.HTTPConnection(probe.host, probe.port, timeout=timeout_s)
    try:
        conn.request("GET", probe.path, headers={"Connection": "close"})
        response = conn.getresponse()
        response.read()
        return READY if response.status == 200 else NOT_READY
    except (OSError, http.client.HTTPException):
        return UNREACHABLE
    finally:
        conn.close()


def health(probes: Iterable[Probe], timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """The worst result over `probes` (every worker of a proxy must be ready)."""
    results = {check(p, timeout_s) for p in probes}
    return next((r for r in _WORST_FIRST if r in results), READY)
