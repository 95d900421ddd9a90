"""Proxy workers: N processes serving one client port (SO_REUSEPORT), supervised from asyncio.

One Python process uses one core; N workers use N cores without a load balancer in front: the
kernel spreads incoming connections over the N listening sockets. `sluice up` runs its proxy this
way (the broker and NameServer stay in the parent, reached over their internal gRPC ports), and so
does `sluice proxy --workers N`. The parent:

- starts each worker as `sluice proxy --config <run dir>/proxy.toml --reuse-port --worker-index I
  --supervisor-pid <parent> --ops-file <run dir>/worker-I.ops` (the config file is the parent's
  resolved `ProxyConfig`, so every worker serves exactly the parent's settings);
- learns each worker's operations endpoint from its ops file (the worker binds an ephemeral
  loopback port and writes it there), polls its /readyz, and reports the pool ready once every
  worker is (`on_ready`, once);
- restarts a worker that exits on its own, with backoff, at most `MAX_RESTARTS` times;
- on stop sends SIGTERM to every worker, waits for them (SIGKILL after `stop_timeout_s`).

A worker dies with its parent (Linux `PR_SET_PDEATHSIG`, set by the worker itself): a parent killed
by SIGKILL leaves no orphan holding the client port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from cluster.tomlwrite import dumps
from common.config import ConfigError, to_dict
from common.logs import kv
from proxy.config import ProxyConfig

log = logging.getLogger("sluice.workers")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
MAX_RESTARTS = 20
STOP_TIMEOUT_S = 120.0
POLL_S = 0.5
PROBE_TIMEOUT_S = 2.0
UNANSWERED_NOT_READY = 3  # probes in a row without an answer before a worker counts as not ready


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota
    (`cpu.max`, as a container's CPU limit sets it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    return max(1, cores)


def worker_count(flag: int | None, *, default: int | None = None) -> int:
    """`--workers`, else `default`, else the cores this process may use."""
    if flag is None:
        return default if default is not None else available_cores()
    if flag < 1:
        raise ConfigError(f"--workers must be at least 1, got {flag}")
    return flag


def log_flags(level: str, json_lines: bool) -> list[str]:
    """The logging flags a parent passes on to its workers."""
    return ["--log-level", level, *(["--log-json"] if json_lines else [])]


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool = False
    ops: str = ""  # host:port of its operations endpoint, once it wrote its ops file
    unanswered: int = 0  # probes in a row that got no answer


@dataclass
class WorkerPool:
    """`count` proxy workers serving `config` (its host and port) on one port."""

    config: ProxyConfig
    count: int
    log_args: Sequence[str] = ()  # --log-level / --log-json, as the parent was given
    stop_timeout_s: float = STOP_TIMEOUT_S
    _workers: list[_Worker] = field(default_factory=list)
    _run_dir: Path | None = None
    # The label that tells the children apart in the parent's /metrics (ops/merge.py).
    label = "worker"

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, on_ready: Callable[[], None] | None = None) -> int:
        """Start the workers, supervise them until `stop` is set, then stop them. Returns 0 after a
        clean stop, 1 when the workers could not be kept running."""
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"sluice-{self.label}s-"))
        self._write_configs(self._run_dir)
        self._workers = [_Worker(i) for i in range(self.count)]
        try:
            for w in self._workers:
                self._start(w)
            log.info("workers started", extra=kv(workers=self.count, pids=self.pids()))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as http:
                return await self._supervise(stop, http, on_ready)
        finally:
            await self._stop_all()
            shutil.rmtree(self._run_dir, ignore_errors=True)

    def _write_configs(self, run_dir: Path) -> None:
        config = to_dict(self.config)
        config.update(reuse_port=True, metrics_port=0)
        (run_dir / "proxy.toml").write_text(dumps({"proxy": config}))

    def _argv(self, index: int, run_dir: Path, ops_file: Path) -> list[str]:
        """The command line of child `index`."""
        return [sys.executable, "-m", "sluice", "proxy", "--config", str(run_dir / "proxy.toml"),
                "--reuse-port", "--worker-index", str(index), "--supervisor-pid", str(os.getpid()),
                "--ops-file", str(ops_file), *self.log_args]  # fmt: skip

    def _ops_file(self, w: _Worker) -> Path:
        """Where worker `w` writes the address of its operations endpoint."""
        assert self._run_dir is not None
        return self._run_dir / f"worker-{w.index}.ops"

    def _start(self, w: _Worker) -> None:
        assert self._run_dir is not None
        ops_file = self._ops_file(w)
        ops_file.unlink(missing_ok=True)
        w.ready, w.ops, w.unanswered = False, "", 0
        argv = self._argv(w.index, self._run_dir, ops_file)
        # With close_fds=False, subprocess starts the child with posix_spawn, not fork: gRPC's fork
        # handlers do not run in this process, which has gRPC threads. Python's descriptors are
        # not inheritable anyway (PEP 446). Not asyncio's subprocesses: uvloop forks.
        w.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, close_fds=False)

    async def _supervise(
        self, stop: asyncio.Event, http: aiohttp.ClientSession, on_ready: Callable[[], None] | None
    ) -> int:
        announced = False
        while not stop.is_set():
            for w in self._workers:
                assert w.proc is not None
                if w.proc.poll() is None:
                    continue
                if w.restarts >= MAX_RESTARTS:
                    log.error(f"{self.label} keeps exiting; giving up", extra=kv(index=w.index, code=w.proc.returncode))
                    return 1
                delay = RESTART_BACKOFF_S[min(w.restarts, len(RESTART_BACKOFF_S) - 1)]
                log.warning(f"{self.label} exited; restarting", extra=kv(index=w.index, code=w.proc.returncode,
                                                                         delay_s=delay))  # fmt: skip
                w.restarts += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return 0
                self._start(w)
            await asyncio.gather(*(self._probe(w, http) for w in self._workers))
            if not announced and self.ready():
                announced = True
                if on_ready is not None:
                    on_ready()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
        return 0

    async def _probe(self, w: _Worker, http: aiohttp.ClientSession) -> None:
        if not w.ops:
            with contextlib.suppress(OSError):
                w.ops = self._ops_file(w).read_text().strip()
            if not w.ops:
                return
        try:
            async with http.get(f"http://{w.ops}/readyz") as response:
                w.ready = response.status == 200
                w.unanswered = 0
        except (aiohttp.ClientError, TimeoutError):
            # A worker busy for a moment (a loaded machine) stays as it was; one that does not
            # answer several probes in a row is not ready. A worker that answers 503 is not ready at once.
            w.unanswered += 1
            if w.unanswered >= UNANSWERED_NOT_READY:
                w.ready = False

    async def _stop_all(self) -> None:
        running = [w.proc for w in self._workers if w.proc is not None and w.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(_wait_all, running, self.stop_timeout_s)
        for proc in running:
            if proc.poll() is None:
                log.error("worker did not stop in time; killing it", extra=kv(pid=proc.pid))
                proc.kill()
                proc.wait()
        codes = [p.returncode for p in running]
        if any(codes):
            log.warning("workers stopped", extra=kv(codes=codes))

    # -- what the parent's operations endpoint reads --------------------------------------------

    def ready(self) -> bool:
        return bool(self._workers) and all(w.ready for w in self._workers)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.proc is not None]

    def endpoints(self) -> list[tuple[int, str]]:
        """(worker index, host:port of its operations endpoint) of every worker that has one."""
        return [(w.index, w.ops) for w in self._workers if w.ops]


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait until every process has exited or `timeout_s` has passed (a thread: blocking waits)."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
