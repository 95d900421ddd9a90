"""`sluice cluster`: run a topology on this machine as supervised child processes, inspect it, stop it.

    sluice cluster up --topology FILE [--run-dir DIR] [--port-offset N] [--detach] [--log-level L] [--log-json]
    sluice cluster status [--run-dir DIR] [--json]
    sluice cluster down [--run-dir DIR] [--timeout-s S]

`up` starts the processes of the topology in dependency order, waits until each is ready, restarts
any that crashes (with backoff), and stops them all in reverse order on SIGTERM/SIGINT; it runs in
the foreground unless `--detach`. It keeps `<run-dir>/cluster.json` (the state) and
`<run-dir>/logs/<name>.log`. `status` probes what the state file lists; `down` stops the supervisor
and waits until it has exited. See docs/deployment.md.

Exit codes: `up` 0 after a clean stop, 1 when the cluster could not start (or one already runs in
the run dir), 2 for a bad topology or argument; `status` 0 when every process is ready, 1 otherwise
(no cluster included); `down` 0 when everything stopped, 1 when there was no cluster or a process
survived. Errors are one line on stderr, `sluice cluster ACTION: message`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from admin.output import Report, render_table
from cluster import control, probe
from cluster.errors import ClusterError, TopologyError
from cluster.loader import load_topology
from cluster.state import LIVE_STATES, read_state, state_path
from cluster.supervisor import Supervisor, child_env
from cluster.topology import Topology, connect_host, host_port
from common.logs import setup_logging

NAME = "cluster"
HELP = "Run a whole topology on this machine as supervised processes (up, status, down)."
DEFAULT_RUN_DIR = "sluice-cluster"
LOCK_FILE = ".lock"
SUPERVISOR_LOG = "supervisor.log"
EXIT_FAILED = 1
EXIT_BAD_ARGUMENT = 2
DETACH_MARGIN_S = 10.0
_POLL_S = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start a topology and supervise it until SIGTERM/SIGINT")
    up.add_argument("--topology", required=True, metavar="FILE", help="topology file (TOML; see deploy/topologies)")
    _add_run_dir(up)
    up.add_argument(
        "--port-offset",
        type=int,
        default=0,
        metavar="N",
        help="add N to every port of the topology (run a second cluster next to the first)",
    )
    up.add_argument("--detach", action="store_true", help="run the supervisor in the background; return once ready")
    up.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="supervisor log level")
    up.add_argument("--log-json", action="store_true", help="supervisor logs JSON lines instead of text")
    status = actions.add_parser("status", help="probe every process of the running cluster")
    _add_run_dir(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    down = actions.add_parser("down", help="stop the running cluster and wait until it has stopped")
    _add_run_dir(down)
    down.add_argument(
        "--timeout-s",
        type=float,
        metavar="S",
        help="wait this long for the supervisor to exit (default: the bound it recorded)",
    )


def _add_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        default=DEFAULT_RUN_DIR,
        metavar="DIR",
        help=f"state file, logs, configs and data dirs (default ./{DEFAULT_RUN_DIR})",
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "up":
            return _up(args)
        if args.action == "status":
            return _status(args)
        return _down(args)
    except TopologyError as exc:
        return _fail(args.action, str(exc), EXIT_BAD_ARGUMENT)
    except ClusterError as exc:
        return _fail(args.action, str(exc), EXIT_FAILED)


def _fail(action: str, message: str, code: int) -> int:
    first, _, rest = message.partition("\n")  # one line, then (for a failed start) the log tail
    print(f"sluice cluster {action}: {first}", file=sys.stderr, flush=True)
    if rest:
        print(rest, file=sys.stderr, flush=True)
    return code


# -- up -------------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).resolve()
    topology = load_topology(args.topology, run_dir=run_dir, port_offset=args.port_offset)
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.detach:
        _refuse_if_running(run_dir)
        return _detach(args, topology)
    setup_logging(args.log_level or topology.settings.log_level, args.log_json)
    _refuse_if_running(run_dir)
    with _run_dir_lock(run_dir):
        supervisor = Supervisor(topology, on_ready=lambda: _announce(topology, foreground=True))
        rc = supervisor.run()
    if rc != 0:
        return _fail("up", f"the cluster did not start: {supervisor.failure}", EXIT_FAILED)
    return rc


@contextlib.contextmanager
def _run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Held by the supervisor for its whole life: one cluster per run dir."""
    with (run_dir / LOCK_FILE).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            message = f"a cluster is already running in {run_dir} (stop it with sluice cluster down)"
            raise ClusterError(message) from None
        yield


def _refuse_if_running(run_dir: Path) -> None:
    if not state_path(run_dir).exists():
        return
    state = read_state(run_dir)
    if control.supervisor_alive(state):
        raise ClusterError(
            f"a cluster is already running in {run_dir} (supervisor pid {state.supervisor_pid}); "
            f"stop it with sluice cluster down --run-dir {run_dir}"
        )
    if state.state in LIVE_STATES:
        left = [f"{p.name} ({p.pid})" for p in state.processes if probe.is_sluice_process(p.pid)]
        if left:
            raise ClusterError(
                f"processes of an unsupervised cluster still run in {run_dir}: {', '.join(left)}; "
                f"stop them with sluice cluster down --run-dir {run_dir}"
            )


def _announce(topology: Topology, *, foreground: bool) -> None:
    names = ", ".join(p.name for p in topology.processes)
    access = ";".join(
        host_port(connect_host(p.host), p.ports["port"]) for p in topology.processes if p.kind in ("proxy", "up")
    )
    print(
        f"cluster ready: {_count(len(topology.processes), 'process')} ({names}); clients connect to {access}; "
        f"state in {state_path(topology.run_dir)}, logs in {topology.run_dir / 'logs'}; "
        f"stop with {'Ctrl-C or ' if foreground else ''}sluice cluster down --run-dir {topology.run_dir}",
        flush=True,
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def _detach(args: argparse.Namespace, topology: Topology) -> int:
    """Start the supervisor as a background process; return once the cluster is ready (or failed)."""
    run_dir = topology.run_dir
    argv = [
        sys.executable, "-m", "sluice", "cluster", "up", "--topology", str(topology.source),
        "--run-dir", str(run_dir), "--port-offset", str(topology.port_offset),
        *(["--log-level", args.log_level] if args.log_level else []), *(["--log-json"] if args.log_json else []),
    ]  # fmt: skip
    log_path = run_dir / SUPERVISOR_LOG
    with log_path.open("ab") as out:
        popen = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    bound_s = topology.settings.ready_timeout_s * len(topology.groups()) + DETACH_MARGIN_S
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            return _fail("up", f"the cluster did not start; see {log_path}:\n{_tail(log_path)}", EXIT_FAILED)
        with contextlib.suppress(ClusterError):
            state = read_state(run_dir)
            if state.supervisor_pid == popen.pid and state.state == "running":
                _announce(topology, foreground=False)
                print(f"supervisor pid {popen.pid}, its log in {log_path}", flush=True)
                return 0
        time.sleep(_POLL_S)
    return _fail(
        "up", f"the cluster is still starting after {bound_s:g} s (supervisor pid {popen.pid}); see {log_path}",
        EXIT_FAILED,
    )  # fmt: skip


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# -- status and down ------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    status = control.cluster_status(Path(args.run_dir))
    if args.json:
        print(json.dumps(status.to_json(), indent=2), flush=True)
    else:
        _print_status(status, sys.stdout)
    return 0 if status.healthy else EXIT_FAILED


def _print_status(status: control.ClusterStatus, out: IO[str]) -> None:
    who = "running" if status.supervisor_alive else "GONE: its processes are not supervised (run sluice cluster down)"
    print(f"cluster in {status.run_dir} ({status.state}); supervisor pid {status.supervisor_pid} {who}", file=out)
    columns = ["name", "kind", "pid", "ports", "state", "health", "restarts"]
    rows = [{c: getattr(p, c) for c in columns} for p in status.processes]
    print(render_table(Report(columns=columns, rows=rows)), file=out, flush=True)


def _down(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    report = control.cluster_down(run_dir, timeout_s=args.timeout_s)
    columns = ["name", "kind", "pid", "how"]
    rows = [{"name": p.name, "kind": p.kind, "pid": p.pid, "how": p.how} for p in report.processes]
    print(f"supervisor pid {report.supervisor_pid} {report.supervisor}", flush=True)
    print(render_table(Report(columns=columns, rows=rows)), flush=True)
    if report.survivors:
        return _fail("down", f"still running after down: {', '.join(report.survivors)}", EXIT_FAILED)
    print(f"stopped the cluster in {run_dir} ({_count(len(report.processes), 'process')})", flush=True)
    return 0
