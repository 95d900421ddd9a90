"""`--workers N`: run N copies of a server process sharing one listening port (SO_REUSEPORT).

One Python process uses one core; N workers use N cores without a load balancer in front: the
kernel spreads incoming connections over the sockets. The parent only supervises: it starts each
worker with `--reuse-port` and a worker index, forwards SIGTERM/SIGINT, restarts a worker that
crashed (with backoff, bounded), and exits when all workers have exited after a stop.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from common.logs import kv

log = logging.getLogger("sluice.workers")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
MAX_RESTARTS = 20
STOP_TIMEOUT_S = 120.0


def strip_option(argv: Sequence[str], option: str) -> list[str]:
    """argv without `option VALUE` / `option=VALUE`."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == option:
            skip = True
            continue
        if arg.startswith(option + "="):
            continue
        out.append(arg)
    return out


def run_workers(command: str, argv: Sequence[str], count: int) -> int:
    """Supervise `count` workers of `sluice <command> <argv>`; returns 0 after a clean stop."""
    base = [sys.executable, "-m", "deploy.cli", command, *strip_option(argv, "--workers")]

    def start(index: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*base, "--reuse-port", "--worker-index", str(index)])

    workers = {i: start(i) for i in range(count)}
    restarts = {i: 0 for i in range(count)}
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("workers started", extra=kv(command=command, workers=count, pids=[p.pid for p in workers.values()]))
    deadline: float | None = None
    while True:
        alive = {i: p for i, p in workers.items() if p.poll() is None}
        if stopping:
            deadline = deadline or time.monotonic() + STOP_TIMEOUT_S
            if not alive:
                return 0
            if time.monotonic() > deadline:
                for p in alive.values():
                    p.kill()
                return 1
        else:
            for i, p in workers.items():
                if p.poll() is not None and restarts[i] < MAX_RESTARTS:
                    delay = RESTART_BACKOFF_S[min(restarts[i], len(RESTART_BACKOFF_S) - 1)]
                    log.warning("worker exited; restarting", extra=kv(worker=i, code=p.returncode, delay_s=delay))
                    time.sleep(delay)
                    if stopping:  # stopped while waiting: start nothing (the others were signalled)
                        break
                    restarts[i] += 1
                    workers[i] = start(i)
                    if stopping:  # stopped while it was being started, before on_signal could see it
                        workers[i].send_signal(signal.SIGTERM)
            if not stopping and all(p.poll() is not None for p in workers.values()):
                return 1
        time.sleep(0.2)
