"""CPU time used during the measured window: by the generator, by watched server processes (with their
child processes, such as proxy workers), by the machine.

On a small shared machine the generator and the servers compete for the same cores, and other work
may run too. CPU seconds per message are steadier than messages per second under such contention,
and the share of the machine used by everything else says how much to trust a run. Linux only
(`/proc`); elsewhere only the generator's own CPU time is reported.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROC = Path("/proc")


def _ticks_s() -> float:
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 0.01


_TICK_S = _ticks_s()


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a `sluice up` and its proxy workers); [] once it is gone."""
    try:
        children = (_PROC / str(pid) / "task" / str(pid) / "children").read_text().split()
    except OSError:
        return [pid] if (_PROC / str(pid)).exists() else []
    return [pid, *(p for child in children for p in process_tree(int(child)))]


def pid_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of the process `pid` alone (0 once it is gone)."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def process_cpu_s(pids: tuple[int, ...]) -> float:
    """User + system CPU seconds of every thread of `pids` and their descendants, as they are now
    (processes that vanished count 0)."""
    return sum(pid_cpu_s(pid) for pid in {p for root in pids for p in process_tree(root)})


def machine_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (0 without /proc)."""
    try:
        values = [int(v) for v in (_PROC / "stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, IndexError, ValueError):
        return 0.0
    return (sum(values) - values[3] - values[4]) * _TICK_S  # minus idle and iowait


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    own_s: float
    watched_s: float
    machine_s: float

    @classmethod
    def take(cls, pids: tuple[int, ...]) -> CpuSample:
        return cls(time.monotonic(), time.process_time(), process_cpu_s(pids), machine_busy_s())


def cpu_between(first: CpuSample, last: CpuSample, messages: int) -> dict[str, Any]:
    """CPU used between two samples, in seconds, µs per message and cores (seconds per wall second)."""
    wall = max(last.wall_s - first.wall_s, 1e-9)
    own, watched = last.own_s - first.own_s, last.watched_s - first.watched_s
    other = max(0.0, (last.machine_s - first.machine_s) - own - watched)
    per_msg = 1e6 / messages if messages else 0.0
    return {
        "generator_s": round(own, 3),
        "watched_s": round(watched, 3),
        "generator_us_per_message": round(own * per_msg, 1),
        "watched_us_per_message": round(watched * per_msg, 1),
        "generator_cores": round(own / wall, 2),
        "watched_cores": round(watched / wall, 2),
        "other_cores": round(other / wall, 2),
    }
