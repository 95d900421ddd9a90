"""Start real child processes for tests, wait until they listen, stop them by PID.

`start_process` launches a command with its stdout and stderr captured to one log file, then waits
(bounded) until a TCP port accepts connections. If the child exits or the port stays closed, it
kills the child and raises `ProcessStartError` whose message ends with the tail of the log. The two
halves, `spawn_process` and `wait_listening`, start several children side by side.
`ChildProcess.stop` sends SIGTERM and, after a timeout, SIGKILL; it returns the exit code.

Children run from the repository root with it on PYTHONPATH, so `python -m sluice ...` works
without installing the package. Every wait here has a timeout.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

# Re-exported for the end-to-end helpers; stdlib only, safe beside the official client's protobufs.
from bench.cpu import process_tree as process_tree

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
DEFAULT_START_TIMEOUT_S = 15.0
DEFAULT_STOP_TIMEOUT_S = 10.0
TAIL_LINES = 40
_POLL_INTERVAL_S = 0.05
_CONNECT_TIMEOUT_S = 0.2


class ProcessStartError(RuntimeError):
    """A child did not come up; the message carries the tail of its output."""


_handed_out: set[int] = set()


# Under pytest-xdist each worker draws ports from a block of its own below the kernel's ephemeral
# range (32768 and up on Linux): ports drawn by port 0 were shared by every worker and by outgoing
# connections, so a port one worker drew could be bound by another before its server started.
# The top WORKER_PORT_SPARE of a block stay undrawn: `sluice up` opens its metrics port at the
# client port + 1000.
WORKER_PORT_BASE = 10_000
WORKER_PORT_BLOCK = 4_000
WORKER_PORT_SPARE = 1_000


def _worker_block() -> range | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    base = WORKER_PORT_BASE + int(worker[2:]) * WORKER_PORT_BLOCK
    return range(base, base + WORKER_PORT_BLOCK - WORKER_PORT_SPARE)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago, and never one this process handed out before: a
    topology draws several ports before any server binds them, and the kernel may offer a
    just-released port again (two servers then collide on one port). Under xdist, from this
    worker's block; otherwise from the kernel (bound to port 0, then released)."""
    block = _worker_block()
    while True:
        if block is not None:
            port = random.choice(block)
            if port in _handed_out or not _bindable(host, port):
                continue
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


@dataclass
class ChildProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig`; a SIGSTOP returns once the process is stopped (the kernel stops it when it is
        next scheduled: a request sent right after `kill` could otherwise still be answered)."""
        if self.running():
            os.kill(self.pid, sig)
            if sig == signal.SIGSTOP:
                self._wait_stopped()

    def _wait_stopped(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{self.pid}/stat").read_text()
            except OSError:
                return  # gone, or no /proc: nothing to wait for
            if stat[stat.rindex(")") + 2] in "Tt":  # the state field follows the command's ")"
                return
            time.sleep(0.005)

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit code (negative if killed)."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(timeout=timeout_s)


def start_process(
    argv: Sequence[str],
    *,
    port: int,
    log_path: Path,
    host: str = LOOPBACK,
    name: str = "",
    env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> ChildProcess:
    """Start `argv` and return once `host:port` accepts connections (or raise ProcessStartError)."""
    child = spawn_process(argv, log_path=log_path, name=name, env=env)
    wait_listening(child, port, host=host, timeout_s=timeout_s)
    return child


def spawn_process(
    argv: Sequence[str], *, log_path: Path, name: str = "", env: Mapping[str, str] | None = None
) -> ChildProcess:
    """Start `argv` (output appended to `log_path`) without waiting for it: several children then
    start side by side, each awaited with `wait_listening`."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), child_env.get("PYTHONPATH", "")) if p)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        popen = subprocess.Popen(
            list(argv),
            cwd=REPO_ROOT,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return ChildProcess(name=name or Path(argv[0]).name, popen=popen, log_path=log_path)


def wait_listening(
    child: ChildProcess, port: int, *, host: str = LOOPBACK, timeout_s: float = DEFAULT_START_TIMEOUT_S
) -> None:
    """Return once `host:port` accepts connections; if `child` exits first or the port stays closed
    for `timeout_s`, stop it and raise ProcessStartError."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not child.running():
            _fail(child, f"exited with code {child.popen.returncode} before listening on {host}:{port}")
        if port_open(host, port):
            return
        if time.monotonic() >= deadline:
            child.stop(timeout_s=DEFAULT_STOP_TIMEOUT_S)
            _fail(child, f"did not listen on {host}:{port} within {timeout_s} s")
        time.sleep(_POLL_INTERVAL_S)


def _fail(child: ChildProcess, what: str) -> NoReturn:
    raise ProcessStartError(f"{child.name} (pid {child.pid}) {what}; log {child.log_path}, last lines:\n{child.tail()}")
