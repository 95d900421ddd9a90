"""The supervisor behind `sluice cluster up`: start a topology, keep it running, stop it in reverse order.

One thread and one loop, no asyncio: every `TICK_S` it reaps children that exited, starts those
whose restart is due, and probes those that are starting. A child runs `sys.executable -m
sluice.main <argv>` in the run dir, its stdout and stderr appended to `<run-dir>/logs/<name>.log`,
in a session of its own (a Ctrl-C in the terminal reaches only the supervisor, which then stops the
children in order) and, on Linux, with SIGTERM as its parent-death signal (should the supervisor
be killed, its children are told to stop rather than left behind).

1. Start: group by group in dependency order (NameServers, navigation, brokers, proxies), each
   group started at once and then awaited until every member is ready (all its probes pass) within
   `ready_timeout_s`. If a child exits or is not ready in time, everything started is stopped and
   `run` returns 1 with `failure` saying why: a broken topology fails loudly, it does not loop.
2. Watch: a child that exits is restarted after a backoff doubling from `restart_backoff_initial_s`
   to `restart_backoff_max_s`, and the restart is logged with the exit code. A restarted child not
   ready within `ready_timeout_s` is killed and counts as a failure. After `restart_limit`
   consecutive failures it is given up (state "failed"); one that stayed up `restart_reset_s`
   starts a new run of failures. Whatever a dead child left in its process group (proxy workers) is
   killed before the restart.
3. Stop, on SIGTERM or SIGINT: groups in reverse order; SIGTERM to each child of the group, SIGKILL
   to the process group of any still running after its `stop_timeout_s`. A second signal kills at once.

Invariants: a child is signalled only through the pid the supervisor started (or the process group
it leads); every wait is bounded; the state file is rewritten after every change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import sluice
from cluster import probe, tomlwrite
from cluster.errors import ClusterError
from cluster.state import ClusterState, ProcessState, now_iso, write_state
from cluster.topology import ProcessSpec, Topology
from common.logs import kv
from processes.runtime import set_parent_death_signal

log = logging.getLogger("sluice.cluster")

TICK_S = 0.1
PROBE_INTERVAL_S = 0.25
KILL_WAIT_S = 5.0
TAIL_LINES = 20


@dataclass
class _Child:
    spec: ProcessSpec
    record: ProcessState
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready_deadline: float = 0.0
    next_start_at: float = 0.0
    next_probe_at: float = 0.0
    failures: int = 0  # consecutive


@dataclass
class Supervisor:
    topology: Topology
    on_ready: Callable[[], None] | None = None
    clock: Callable[[], float] = time.monotonic
    failure: str = ""  # why the start failed, when run() returned 1
    _children: list[_Child] = field(default_factory=list)
    _state: ClusterState | None = None
    _signals: int = 0

    def run(self) -> int:
        """Start, watch until SIGTERM/SIGINT, stop; 0 after a clean run, 1 when the start failed."""
        self._prepare()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._set_cluster("starting")
            if not self._start_all():
                self._stop_all()
                self._set_cluster("failed")
                return 1
            self._set_cluster("running")
            log.info("cluster ready", extra=kv(processes=len(self._children), run_dir=self.topology.run_dir))
            if self.on_ready is not None:
                self.on_ready()
            self._watch()
            self._stop_all()
            self._set_cluster("stopped")
            return 0
        except BaseException:
            self._stop_all()
            self._set_cluster("failed")
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # -- preparation ----------------------------------------------------------------------------

    def _prepare(self) -> None:
        run_dir = self.topology.run_dir
        for spec in self.topology.processes:
            _check_ports_free(spec)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        for spec in self.topology.processes:
            if spec.config_path is not None:
                spec.config_path.parent.mkdir(parents=True, exist_ok=True)
                spec.config_path.write_text(tomlwrite.dumps(spec.config))
            if spec.data_dir is not None:
                spec.data_dir.mkdir(parents=True, exist_ok=True)
            record = ProcessState(
                name=spec.name, kind=spec.kind, ports=dict(spec.ports), log=str(spec.log_path),
                probes=[p.target for p in spec.probes], command=_command(spec), stop_timeout_s=spec.stop_timeout_s,
            )  # fmt: skip
            self._children.append(_Child(spec, record))
        self._state = ClusterState(
            supervisor_pid=os.getpid(), topology=str(self.topology.source), run_dir=str(run_dir),
            port_offset=self.topology.port_offset, started_at=now_iso(), stop_bound_s=self._stop_bound_s(),
            processes=[c.record for c in self._children],
        )  # fmt: skip

    def _stop_bound_s(self) -> float:
        groups = self.topology.groups()
        return sum(max(s.stop_timeout_s for s in g) + KILL_WAIT_S for g in groups) + KILL_WAIT_S

    # -- start ----------------------------------------------------------------------------------

    def _start_all(self) -> bool:
        for group in self.topology.groups():
            children = [c for c in self._children if c.spec in group]
            for child in children:
                self._spawn(child)
            self._save()
            if not self._await_ready(children):
                return False
        return True

    def _await_ready(self, children: list[_Child]) -> bool:
        while True:
            if self._signals:
                self.failure = "stopped by a signal before every process was ready"
                return False
            now = self.clock()
            for child in children:
                if child.record.state != "starting":
                    continue
                assert child.popen is not None
                code = child.popen.poll()
                if code is not None:
                    self._note_exit(child, code)
                    child.record.state = "failed"
                    self.failure = f"{child.spec.name} exited with {_describe(code)} before it was ready"
                    self.failure += _tail(child.spec.log_path)
                    return False
                if self._probe(child, now):
                    continue
                if now >= child.ready_deadline:
                    child.record.state = "failed"  # _stop_group still stops it: it is running
                    self.failure = (
                        f"{child.spec.name} was not ready within {self.topology.settings.ready_timeout_s:g} s "
                        f"(probes: {', '.join(child.record.probes)})" + _tail(child.spec.log_path)
                    )
                    return False
            if all(c.record.state == "running" for c in children):
                return True
            time.sleep(TICK_S)

    def _probe(self, child: _Child, now: float) -> bool:
        """Probe a starting child (rate-limited); True once it is ready (it is then running)."""
        if now < child.next_probe_at:
            return False
        child.next_probe_at = now + PROBE_INTERVAL_S
        if probe.health(child.spec.probes, timeout_s=PROBE_INTERVAL_S * 2) != probe.READY:
            return False
        child.record.state = "running"
        log.info("process ready", extra=kv(name=child.spec.name, pid=child.record.pid, restarts=child.record.restarts))
        self._save()
        return True

    def _spawn(self, child: _Child) -> None:
        spec = child.spec
        command = _command(spec)
        with spec.log_path.open("ab") as out:
            again = f" (restart {child.record.restarts})" if child.record.restarts else ""
            out.write(f"--- sluice cluster {now_iso()}: starting {spec.name}{again}\n".encode())
            out.flush()
            try:
                popen = subprocess.Popen(
                    command, cwd=self.topology.run_dir, env=child_env(), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )  # fmt: skip
            except OSError as exc:
                raise ClusterError(f"cannot start {spec.name}: {exc}") from None
        now = self.clock()
        child.popen, child.started_at = popen, now
        child.ready_deadline = now + self.topology.settings.ready_timeout_s
        child.next_probe_at = now
        child.record.pid, child.record.state = popen.pid, "starting"
        log.info("process started", extra=kv(name=spec.name, kind=spec.kind, pid=popen.pid, log=spec.log_path))

    # -- watch ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._signals:
            now = self.clock()
            for child in self._children:
                self._tick(child, now)
            time.sleep(TICK_S)

    def _tick(self, child: _Child, now: float) -> None:
        state = child.record.state
        if state == "backoff" and now >= child.next_start_at:
            child.record.restarts += 1
            self._spawn(child)
            self._save()
            return
        if state not in ("starting", "running"):
            return
        assert child.popen is not None
        code = child.popen.poll()
        if code is None and state == "starting" and not self._probe(child, now) and now >= child.ready_deadline:
            timeout_s = self.topology.settings.ready_timeout_s
            log.warning(
                "process not ready in time; killing it",
                extra=kv(name=child.spec.name, pid=child.popen.pid, ready_timeout_s=timeout_s),
            )
            code = _kill(child.popen)
        if code is not None:
            self._on_exit(child, code, now)

    def _on_exit(self, child: _Child, code: int, now: float) -> None:
        settings = self.topology.settings
        stayed_up = child.record.state == "running" and now - child.started_at >= settings.restart_reset_s
        pid = child.record.pid
        self._note_exit(child, code)
        child.failures = 1 if stayed_up else child.failures + 1
        if child.failures > settings.restart_limit:
            child.record.state = "failed"
            log.error(
                "process exited; giving up",
                extra=kv(name=child.spec.name, pid=pid, exit=_describe(code), consecutive_failures=child.failures,
                         log=child.spec.log_path),
            )  # fmt: skip
        else:
            delay_s = settings.backoff_s(child.failures)
            child.record.state, child.next_start_at = "backoff", now + delay_s
            log.warning(
                "process exited; restarting",
                extra=kv(name=child.spec.name, pid=pid, exit=_describe(code), restart=child.record.restarts + 1,
                         delay_s=round(delay_s, 3), log=child.spec.log_path),
            )  # fmt: skip
        self._save()

    def _note_exit(self, child: _Child, code: int) -> None:
        assert child.popen is not None
        _kill_group(child.popen.pid)  # whatever it left behind (proxy workers) goes with it
        child.record.last_exit_code = code
        child.record.pid = None

    # -- stop -----------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        if self._state is None or self._state.state in ("stopping", "stopped", "failed"):
            return
        self._set_cluster("stopping")
        signals_at_stop = self._signals
        for group in reversed(self.topology.groups()):
            children = [c for c in self._children if c.spec in group]
            self._stop_group(children, signals_at_stop)
        for child in self._children:
            if child.record.state in ("backoff", "pending"):
                child.record.state = "stopped"
        self._save()

    def _stop_group(self, children: list[_Child], signals_at_stop: int) -> None:
        running = [c for c in children if c.popen is not None and c.popen.poll() is None]
        failed = {c.spec.name for c in children if c.record.state == "failed"}
        start = self.clock()
        for child in running:
            assert child.popen is not None
            child.record.state = "stopping"
            log.info("stopping process", extra=kv(name=child.spec.name, pid=child.popen.pid))
            with contextlib.suppress(ProcessLookupError):
                child.popen.send_signal(signal.SIGTERM)
        self._save()
        while running:
            hurry = self._signals > signals_at_stop
            for child in list(running):
                assert child.popen is not None
                code = child.popen.poll()
                if code is None and not hurry and self.clock() - start < child.spec.stop_timeout_s:
                    continue
                running.remove(child)
                if code is None:
                    log.warning("process did not stop in time; killing it", extra=kv(name=child.spec.name,
                                pid=child.popen.pid, stop_timeout_s=child.spec.stop_timeout_s))  # fmt: skip
                    code = _kill(child.popen)  # bounded; None if even SIGKILL did not end it
                _kill_group(child.popen.pid)
                child.record.last_exit_code = code
                child.record.state = "failed" if child.spec.name in failed else "stopped"
                fields = kv(name=child.spec.name, pid=child.popen.pid, exit=_describe(code))
                log.info("process stopped", extra=fields)
            time.sleep(TICK_S if running else 0)
        for child in children:
            if child.record.state in ("starting", "running"):
                child.record.state = "stopped"

    # -- state ----------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("received %s, stopping the cluster", signal.Signals(signum).name)
        else:
            log.warning("received %s again, killing what is left", signal.Signals(signum).name)

    def _set_cluster(self, state: str) -> None:
        assert self._state is not None
        self._state.state = state
        self._save()

    def _save(self) -> None:
        if self._state is not None:
            write_state(self.topology.run_dir, self._state)


def _command(spec: ProcessSpec) -> list[str]:
    return [sys.executable, "-m", "sluice", *spec.argv]


def child_env() -> dict[str, str]:
    # `-m sluice` must find this very installation, whatever the child's working directory.
    package_root = str(Path(sluice.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies."""
    set_parent_death_signal(signal.SIGTERM)


def _kill(popen: subprocess.Popen[bytes]) -> int | None:
    """SIGKILL the child's process group; its exit code, or None if it is somehow still there."""
    _kill_group(popen.pid)
    with contextlib.suppress(ProcessLookupError):
        popen.kill()
    try:
        return popen.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.error("process survived SIGKILL", extra=kv(pid=popen.pid))
        return None


def _kill_group(pgid: int) -> None:
    # Each child leads its own process group (start_new_session), so its pgid is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _check_ports_free(spec: ProcessSpec) -> None:
    ports = {*spec.ports.values(), *(p.port for p in spec.probes)}
    for port in sorted(ports):
        family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((spec.host, port))
            except OSError as exc:
                raise ClusterError(
                    f"port {port} of {spec.name} on {spec.host} is not free ({exc.strerror or exc}); is another "
                    "cluster running? (sluice cluster up --port-offset N shifts every port)"
                ) from None


def _describe(code: int | None) -> str:
    if code is None:
        return "no exit code (it survived SIGKILL)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"code {code} ({signal.Signals(-code).name})"
    return f"code {code}"


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return f"; last lines of {path}:\n" + "\n".join(text.splitlines()[-lines:])
