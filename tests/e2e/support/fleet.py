"""A proxy fleet with navigation, started the way an operator starts one: `sluice cluster up` with the
shipped topology (`deploy/topologies/separated.toml`: 1 NameServer, 1 navigation server, brokers
broker-a and broker-b, proxy-a in zone-a and proxy-b in zone-b with 2 workers).

What differs from the shipped file, and why (nothing else is changed):

- `--port-offset N`: N is chosen so that every port of the topology binds on 127.0.0.1 (other
  clusters run on this machine); the candidates come from a `random.Random` seeded with the pid.
- `[cluster] restart_backoff_initial_s = restart_backoff_max_s = RESTART_DELAY_S` (unless
  `start_fleet(restart_delay_s=None)`): a process that exits — a NameServer stopped on purpose, a
  proxy killed — stays down that long before the supervisor starts it again, so a test sees the
  fleet without it and then sees it come back.

The derived topology is written to `<run dir>/topology.toml` (a copy of the shipped one with those
keys; the run dir is `<dir>/run<k>` for start attempt k) and the supervisor runs in the foreground
as a child of the test process, so its PID is ours; it starts each component in its own process
group and restarts what exits. The fleet's processes
are looked up by name in the supervisor's state file (`<run dir>/cluster.json`) and signalled by
the PID (or process group, for a proxy with workers) recorded there. `start_proxy` adds a proxy
the test owns outside the supervisor (so it is not restarted when it exits).

Like the rest of tests/e2e, this imports nothing of Sluice: it reads the state file and talks HTTP.
It does not import the official client either, so tests/bench/fleet_bench.py starts its fleet here too.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers.procs import LOOPBACK, REPO_ROOT, ChildProcess, ProcessStartError, free_port, start_process

SLUICE = [sys.executable, "-m", "sluice"]
SHIPPED_TOPOLOGY = REPO_ROOT / "deploy" / "topologies" / "separated.toml"
RESTART_DELAY_S = 10.0
START_TIMEOUT_S = 60.0
START_ATTEMPTS = 3
STOP_MARGIN_S = 15.0
ADMIN_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 3.0
POLL_S = 0.1
PORT_OFFSET_MIN, PORT_OFFSET_MAX, PORT_OFFSET_TRIES = 10_000, 40_000, 200

T = TypeVar("T")


class AdminError(RuntimeError):
    """`sluice admin` exited non-zero; the message holds its stderr."""


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, interval_s: float = POLL_S) -> T:
    """Poll `probe` until it returns something other than None/False; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


@dataclass
class Fleet:
    run_dir: Path
    port_offset: int
    supervisor: ChildProcess
    extra: dict[str, ChildProcess] = field(default_factory=dict)  # processes the test started itself

    # -- what runs where -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "cluster.json").read_text())
        return data

    def record(self, name: str) -> dict[str, Any]:
        for proc in self.state()["processes"]:
            if proc["name"] == name:
                return dict(proc)
        raise KeyError(f"no process {name!r} in {self.run_dir / 'cluster.json'}")

    def port(self, name: str, role: str = "port") -> int:
        return int(self.record(name)["ports"][role])

    def endpoint(self, name: str) -> str:
        return f"{LOOPBACK}:{self.port(name)}"

    @property
    def namesrv(self) -> str:
        return self.endpoint("nameserver-1")

    @property
    def navigation(self) -> str:
        return self.endpoint("navigation-1")

    @property
    def navigation_http(self) -> str:
        return f"http://{LOOPBACK}:{self.port('navigation-1', 'http_port')}"

    def pid(self, name: str) -> int:
        proc = self.record(name)
        if proc["pid"] is None or proc["state"] != "running":
            raise AssertionError(f"{name} is not running: {proc['state']} (pid {proc['pid']})")
        return int(proc["pid"])

    def wait_running(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every supervised process is running (after a restart, for instance)."""

        def all_running() -> bool:
            return all(p["state"] == "running" and p["pid"] for p in self.state()["processes"])

        wait_for(f"every process of {self.run_dir} running", all_running, timeout_s)

    def wait_brokers_registered(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every broker of the fleet is registered with the NameServer: after a NameServer restart
        they come back with their next heartbeat, and until then it knows no broker to create a
        topic on."""
        wanted = {p["name"] for p in self.state()["processes"] if p["kind"] == "broker"}

        def registered() -> bool:
            try:
                listing = self.admin("broker", "list")
            except AdminError:
                return False
            rows = listing["rows"] if isinstance(listing, dict) else listing or []
            return wanted <= {row.get("name") for row in rows}

        wait_for(f"brokers {sorted(wanted)} registered with the NameServer", registered, timeout_s)

    def wait_exited(self, name: str, pid: int, timeout_s: float) -> None:
        """The supervisor saw process `pid` of `name` exit (and scheduled its restart)."""
        wait_for(f"{name} (pid {pid}) exited", lambda: self.record(name)["pid"] != pid, timeout_s)

    def wait_respawned(self, name: str, old_pid: int, timeout_s: float) -> int:
        """The supervisor started `name` again (a new pid, not necessarily ready yet); the new pid."""

        def again() -> int | None:
            pid = self.record(name)["pid"]
            return int(pid) if pid not in (None, old_pid) else None

        return wait_for(f"{name} started again", again, timeout_s, interval_s=0.05)

    # -- signals ---------------------------------------------------------------------------------

    def signal(self, name: str, sig: signal.Signals) -> int:
        """Signal one supervised process by the pid the supervisor recorded; returns that pid."""
        pid = self.pid(name)
        os.kill(pid, sig)
        return pid

    def kill_group(self, name: str) -> int:
        """SIGKILL a supervised process and whatever runs in its process group (a proxy's workers):
        a crash of the whole proxy. The supervisor starts each child in a session of its own, so the
        process group id is the child's pid."""
        pid = self.pid(name)
        os.killpg(pid, signal.SIGKILL)
        return pid

    # -- navigation ------------------------------------------------------------------------------

    def http_get(self, path: str, **params: str | int) -> tuple[int, str, str]:
        """(status, content type, body) of GET `path` on the navigation HTTP API."""
        query = urllib.parse.urlencode(params)
        url = f"{self.navigation_http}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
                return answer.status, answer.headers.get("Content-Type", ""), answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()

    def endpoints_json(self, **params: str | int) -> dict[str, Any]:
        status, _, body = self.http_get("/v1/endpoints", **params)
        assert status == 200, f"GET /v1/endpoints {params}: {status} {body}"
        data: dict[str, Any] = json.loads(body)
        return data

    def endpoints_text(self, **params: str | int) -> str:
        status, _, body = self.http_get("/v1/endpoints", format="text", **params)
        assert status == 200, f"GET /v1/endpoints?format=text {params}: {status} {body}"
        return body

    def listed_proxies(self) -> list[dict[str, Any]]:
        status, _, body = self.http_get("/v1/proxies")
        assert status == 200, f"GET /v1/proxies: {status} {body}"
        proxies: list[dict[str, Any]] = json.loads(body)["proxies"]
        return proxies

    # -- admin -----------------------------------------------------------------------------------

    def admin(self, *args: str) -> Any:
        argv = [*SLUICE, "admin", "--namesrv", self.namesrv, *args, "--json"]
        proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S,
                              check=False)  # fmt: skip
        if proc.returncode != 0:
            raise AdminError(f"sluice admin {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    def create_topic(self, name: str, queues: int = 4) -> str:
        self.admin("topic", "create", name, "--type", "normal", "--queues", str(queues))
        return name

    def create_group(self, name: str) -> str:
        self.admin("group", "create", name)
        return name

    # -- a proxy of the test's own -----------------------------------------------------------------

    def start_proxy(self, name: str, *, zone: str, drain_s: float) -> str:
        """`sluice proxy` joined to this fleet (NameServer, navigation, zone) as the topology would
        start it, but owned by the test (`extra[name]`): not supervised, so it stays gone once it
        exits. Returns its endpoint once navigation lists it."""
        port, metrics_port = free_port(), free_port()
        argv = [*SLUICE, "proxy", "--host", LOOPBACK, "--port", str(port), "--namesrv", self.namesrv,
                "--navigation", self.navigation, "--zone", zone, "--proxy-id", name, "--drain-s", f"{drain_s:g}",
                "--metrics-port", str(metrics_port), "--workers", "1"]  # fmt: skip
        child = start_process(argv, port=port, log_path=self.run_dir / "logs" / f"{name}.log", name=name,
                              timeout_s=START_TIMEOUT_S)  # fmt: skip
        self.extra[name] = child
        wait_for(f"navigation lists {name}", lambda: any(p["id"] == name for p in self.listed_proxies()), 15.0)
        return f"{LOOPBACK}:{port}"

    # -- teardown --------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop the test's own processes, then the supervisor (which stops the fleet in reverse
        order); returns problems: non-zero exits, anything left running."""
        problems: list[str] = []
        for name, child in self.extra.items():
            code = child.stop(timeout_s=STOP_MARGIN_S)
            if code != 0:
                problems.append(f"{name} (pid {child.pid}) exited {code}; log {child.log_path}:\n{child.tail(15)}")
        try:
            records = self.state()["processes"]
            bound_s = float(self.state()["stop_bound_s"]) + STOP_MARGIN_S
        except (OSError, ValueError, KeyError):
            records, bound_s = [], 120.0
        code = self.supervisor.stop(timeout_s=bound_s)
        if code != 0:
            problems.append(f"supervisor (pid {self.supervisor.pid}) exited {code}:\n{self.supervisor.tail(15)}")
        for proc in records:
            if proc.get("pid") and _alive(int(proc["pid"])):
                problems.append(f"{proc['name']} (pid {proc['pid']}) still runs after the supervisor stopped")
                os.killpg(int(proc["pid"]), signal.SIGKILL)
        return problems


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- starting ------------------------------------------------------------------------------------


def derived_topology(shipped: Mapping[str, Any], restart_delay_s: float | None) -> dict[str, Any]:
    """The shipped topology, with the supervisor's restart delay set to `restart_delay_s` if given."""
    topology: dict[str, Any] = json.loads(json.dumps(shipped))  # a deep copy of plain TOML data
    if restart_delay_s is not None:
        cluster = topology.setdefault("cluster", {})
        cluster["restart_backoff_initial_s"] = restart_delay_s
        cluster["restart_backoff_max_s"] = restart_delay_s
    return topology


def topology_ports(topology: Mapping[str, Any]) -> list[int]:
    """Every port the topology binds (before an offset): ports, HTTP ports, metrics ports (a proxy's
    workers share its ports)."""
    ports: list[int] = []
    for kind in ("nameserver", "navigation", "broker", "proxy", "up"):
        for entry in topology.get(kind, []):
            ports += [int(v) for k, v in entry.items() if (k == "port" or k.endswith("_port")) and v]
    return ports


def pick_port_offset(ports: list[int], rng: random.Random) -> int:
    """An offset that moves every port onto one that binds on 127.0.0.1 right now."""
    for _ in range(PORT_OFFSET_TRIES):
        offset = rng.randrange(PORT_OFFSET_MIN, PORT_OFFSET_MAX)
        if max(ports) + offset <= 65535 and all(_bindable(p + offset) for p in ports):
            return offset
    raise ProcessStartError(f"no port offset in {PORT_OFFSET_TRIES} tries frees all of {ports}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML for a topology: top-level tables and arrays of tables of scalars, lists and sub-tables."""
    lines: list[str] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            _toml_table(lines, key, value, "[{}]")
        elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
            for entry in value:
                _toml_table(lines, key, entry, "[[{}]]")
        else:
            raise TypeError(f"top-level key {key!r} must be a table or an array of tables")
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != data:
        raise AssertionError("the TOML written for the derived topology does not read back the same")
    return text


def _toml_table(lines: list[str], path: str, table: Mapping[str, Any], header: str) -> None:
    lines += ["", header.format(path)]
    lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, Mapping)]
    for key, sub in table.items():
        if isinstance(sub, Mapping):
            _toml_table(lines, f"{path}.{key}", sub, "[{}]")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def start_fleet(run_dir: Path, *, restart_delay_s: float | None = RESTART_DELAY_S, seed: int | None = None) -> Fleet:
    """`sluice cluster up` on the derived topology (`restart_delay_s=None`: the shipped one, unchanged
    but for the port offset), in the foreground as our child; returns once the supervisor says every
    process is ready. A start that fails (a port taken between our check and the child's bind, on a
    shared machine) is retried with another offset, in a fresh run dir `<run_dir>/run<k>`."""
    topology = derived_topology(tomllib.loads(SHIPPED_TOPOLOGY.read_text()), restart_delay_s)
    rng = random.Random(os.getpid() if seed is None else seed)
    failures: list[str] = []
    for attempt in range(START_ATTEMPTS):
        offset = pick_port_offset(topology_ports(topology), rng)
        try:
            return _start_once(run_dir / f"run{attempt}", topology, offset)
        except ProcessStartError as exc:
            failures.append(str(exc))
    raise ProcessStartError(f"the fleet did not start in {START_ATTEMPTS} attempts:\n" + "\n".join(failures))


def _start_once(run_dir: Path, topology: Mapping[str, Any], offset: int) -> Fleet:
    run_dir.mkdir(parents=True, exist_ok=True)
    topology_path = run_dir / "topology.toml"
    topology_path.write_text(dump_toml(topology))
    argv = [*SLUICE, "cluster", "up", "--topology", str(topology_path), "--run-dir", str(run_dir),
            "--port-offset", str(offset)]  # fmt: skip
    log_path = run_dir / "supervisor.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
                                                       if p), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    with log_path.open("ab") as out:
        popen = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT)  # fmt: skip
    fleet = Fleet(run_dir, offset, ChildProcess("sluice-cluster-up", popen, log_path))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "cluster ready:" not in fleet.supervisor.output():
            if not fleet.supervisor.running() or time.monotonic() >= deadline:
                raise ProcessStartError(
                    f"sluice cluster up (pid {popen.pid}, port offset {offset}) did not get ready:\n"
                    f"{fleet.supervisor.tail()}"
                )
            time.sleep(POLL_S)
        fleet.wait_running()
    except BaseException:
        fleet.stop()
        raise
    return fleet
