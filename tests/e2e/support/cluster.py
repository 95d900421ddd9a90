"""Sluice clusters as real child processes, for the end-to-end tests.

Two topologies, one `Cluster` object:

- **merged**: one `sluice up` command (NameServer + broker + proxy in one process with `shards=1`;
  N merged nodes `shard-<i>` with `shards=N`; `shards=None`: `sluice up`'s own default, one shard
  per core), free ports, its own data dir.
  Started with `--no-auto-create` by default, so both topologies behave alike: every topic and
  group a test uses is created with `sluice admin`, and an unknown topic is TOPIC_NOT_FOUND.
- **separated**: `sluice nameserver`, two `sluice broker` (broker-a, broker-b, own data dirs) and two
  `sluice proxy --namesrv ...` (the first with its default workers, the second `--workers 1`); the
  brokers start side by side, then the proxies. The client endpoint string names both proxies
  (`"127.0.0.1:P1;127.0.0.1:P2"`); the Python client connects pick-first.

Every process serves its ops endpoint (`--metrics-port`, /metrics, /loglevel) on a free port of its
own, listed in `Cluster.ops` by process name. Topics and groups are created through `sluice admin`
subprocesses in both. `Cluster.stop()` stops
every process it started by PID (SIGTERM, SIGKILL after a timeout) and reports any that is left.

This module imports nothing of Sluice: the end-to-end process holds the official client's
protobuf modules, which cannot coexist with Sluice's own `apache.rocketmq.v2` modules.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.procs import (
    LOOPBACK,
    REPO_ROOT,
    ChildProcess,
    ProcessStartError,
    free_port,
    process_tree,
    spawn_process,
    wait_listening,
)

SLUICE = [sys.executable, "-m", "sluice"]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
ADMIN_TIMEOUT_S = 30.0
BROKER_NAMES = ("broker-a", "broker-b")


class AdminError(RuntimeError):
    """`sluice admin` exited non-zero; the message holds its stderr line."""


@dataclass
class Cluster:
    kind: str  # "merged" or "separated"
    root: Path
    namesrv: str
    proxies: list[str]  # proxy addresses, host:port, in start order
    brokers: list[str]  # broker names
    processes: dict[str, ChildProcess] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)  # processes a test killed on purpose
    # How each process was started (argv, port, ready line), so a test can restart it.
    launches: dict[str, tuple[list[str], int, str]] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)  # process name -> host:port of its ops endpoint
    console: str = ""  # merged: the operator's console, http://host:port
    amqp: list[str] = field(default_factory=list)  # AMQP endpoints (host:port) when started with amqp=True
    # MQTT endpoints (host:port) and MQTT over WebSocket ones when started with mqtt=True: one per
    # proxy process (the merged shards share one port, docs/mqtt.md "Placement").
    mqtt: list[str] = field(default_factory=list)
    mqtt_ws: list[str] = field(default_factory=list)

    @property
    def endpoints(self) -> str:
        """The access point for the Python client: every proxy, `;`-separated."""
        return ";".join(self.proxies)

    @property
    def first_proxy(self) -> str:
        return self.proxies[0]

    def proxy_process(self, address: str) -> str:
        """The name of the proxy process listening on `address` (separated topology)."""
        name = f"proxy-{address.rsplit(':', 1)[1]}"
        if name not in self.processes:
            raise KeyError(f"no proxy process listens on {address} in this {self.kind} cluster")
        return name

    # -- admin ---------------------------------------------------------------------------------

    def admin(self, *args: str, timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
        """Run `sluice admin --namesrv ... ARGS --json`; returns the parsed JSON, raises AdminError."""
        argv = [*SLUICE, "admin", "--namesrv", self.namesrv, *args, "--json"]
        proc = subprocess.run(argv, cwd=REPO_ROOT, env=_child_env(), capture_output=True, text=True,
                              timeout=timeout_s, check=False)  # fmt: skip
        if proc.returncode != 0:
            raise AdminError(f"sluice admin {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    def admin_text(self, *args: str, timeout_s: float = ADMIN_TIMEOUT_S) -> str:
        """Run `sluice admin --namesrv ... ARGS` (a table); returns stdout, raises AdminError."""
        argv = [*SLUICE, "admin", "--namesrv", self.namesrv, *args]
        proc = subprocess.run(argv, cwd=REPO_ROOT, env=_child_env(), capture_output=True, text=True,
                              timeout=timeout_s, check=False)  # fmt: skip
        if proc.returncode != 0:
            raise AdminError(f"sluice admin {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def create_topic(self, name: str, message_type: str = "normal", queues: int = 4) -> str:
        self.admin("topic", "create", name, "--type", message_type, "--queues", str(queues))
        return name

    def create_group(
        self, name: str, *, fifo: bool = False, max_attempts: int | None = None, retry_policy: str | None = None,
        consume_from: str | None = None,
    ) -> str:  # fmt: skip
        args = ["group", "create", name]
        if fifo:
            args.append("--fifo")
        if max_attempts is not None:
            args += ["--max-attempts", str(max_attempts)]
        if retry_policy is not None:
            args += ["--retry-policy", retry_policy]
        if consume_from is not None:
            args += ["--consume-from", consume_from]
        self.admin(*args)
        return name

    # -- lifecycle -----------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL one process (a crash), remembered so that teardown expects it dead. Returns once
        its children (proxy workers, which die with it) are gone too: they hold its port."""
        self.killed.add(name)
        child = self.processes[name]
        children = process_tree(child.pid)[1:]
        child.signal(signal.SIGKILL)
        child.popen.wait(timeout=STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> list[str]:
        """Stop every process, newest first; returns problems (non-zero exits, survivors)."""
        problems = []
        for name, child in reversed(list(self.processes.items())):
            code = child.stop(timeout_s=STOP_TIMEOUT_S)
            if name not in self.killed and code != 0:
                problems.append(f"{name} (pid {child.pid}) exited {code}; log {child.log_path}:\n{child.tail(15)}")
            if _alive(child.pid):
                problems.append(f"{name} (pid {child.pid}) is still alive after stop")
        return problems

    def restart(self, name: str) -> None:
        """Crash one process (SIGKILL) and start it again with the same arguments and port."""
        self.kill(name)
        argv, port, ready_line = self.launches[name]
        restarts = len(list(self.root.glob(f"{name}*.log")))
        _start(self, name, argv, port, ready_line, log_name=f"{name}-restart{restarts}")
        self.killed.discard(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class _Launch:
    """A child started by `_launch`, not yet known to be ready."""

    name: str
    child: ChildProcess
    port: int
    ready_line: str
    logged: int  # the log's size before this start (a restart appends to the same log)


def _launch(
    cluster: Cluster, name: str, argv: Sequence[str], port: int, ready_line: str, *, log_name: str = ""
) -> _Launch:
    cluster.launches[name] = (list(argv), port, ready_line)
    log_path = cluster.root / f"{log_name or name}.log"
    logged = log_path.stat().st_size if log_path.exists() else 0
    ops_port = free_port()
    cluster.ops[name] = f"{LOOPBACK}:{ops_port}"
    child = spawn_process([*argv, "--metrics-port", str(ops_port)], log_path=log_path, name=name)
    cluster.processes[name] = child
    return _Launch(name, child, port, ready_line, logged)


def _await_ready(launch: _Launch) -> None:
    """Until the child listens on its port and printed its ready line (this start's, not an earlier one's)."""
    child = launch.child
    wait_listening(child, launch.port, timeout_s=START_TIMEOUT_S)
    deadline = time.monotonic() + START_TIMEOUT_S
    while launch.ready_line not in child.output()[launch.logged :]:
        if not child.running() or time.monotonic() >= deadline:
            raise ProcessStartError(f"{launch.name} did not print {launch.ready_line!r}; last lines:\n{child.tail()}")
        time.sleep(0.05)


def _start(
    cluster: Cluster, name: str, argv: Sequence[str], port: int, ready_line: str, *, log_name: str = ""
) -> ChildProcess:
    launch = _launch(cluster, name, argv, port, ready_line, log_name=log_name)
    _await_ready(launch)
    return launch.child


def _start_together(cluster: Cluster, starts: Sequence[tuple[str, Sequence[str], int, str]]) -> None:
    """Start processes that do not need each other (name, argv, port, ready line) side by side and
    return once all are ready: a topology's brokers, its proxies."""
    launches = [_launch(cluster, *start) for start in starts]
    for launch in launches:
        _await_ready(launch)


def start_merged(
    root: Path,
    *,
    auto_create: bool = False,
    extra_args: Sequence[str] = (),
    shards: int | None = 1,
    amqp: bool = False,
    mqtt: bool = False,
) -> Cluster:
    """`sluice up --shards N` (N > 1: brokers shard-0.., docs/shards.md; 1: broker-a, one process);
    `shards=None` gives no `--shards`: the default of the machine, its brokers read back once registered.
    `amqp`: serve AMQP on a free port (`Cluster.amqp`), else AMQP is off (never the shared 5672); `mqtt`
    the same for MQTT and MQTT over WebSocket (`Cluster.mqtt`, `Cluster.mqtt_ws`; never the shared 1883)."""
    root.mkdir(parents=True, exist_ok=True)
    port, ns_port, broker_port, console_port = free_port(), free_port(), free_port(), free_port()
    amqp_port = free_port() if amqp else -1
    mqtt_port, ws_port = (free_port(), free_port()) if mqtt else (-1, -1)
    brokers = ["broker-a"] if shards == 1 else [f"shard-{i}" for i in range(shards or 0)]
    cluster = Cluster("merged", root, f"{LOOPBACK}:{ns_port}", [f"{LOOPBACK}:{port}"], brokers,
                      console=f"http://{LOOPBACK}:{console_port}",
                      amqp=[f"{LOOPBACK}:{amqp_port}"] if amqp else [],
                      mqtt=[f"{LOOPBACK}:{mqtt_port}"] if mqtt else [],
                      mqtt_ws=[f"{LOOPBACK}:{ws_port}"] if mqtt else [])  # fmt: skip
    if shards is not None:
        extra_args = ["--shards", str(shards), *extra_args]
    argv = [
        *SLUICE, "up", "--data-dir", str(root / "data"), "--port", str(port), "--namesrv-port", str(ns_port),
        "--broker-port", str(broker_port), "--console-port", str(console_port),
        *([] if auto_create else ["--no-auto-create"]),
        *([] if "--amqp-port" in extra_args else ["--amqp-port", str(amqp_port)]),
        *([] if "--mqtt-port" in extra_args else ["--mqtt-port", str(mqtt_port), "--mqtt-ws-port", str(ws_port)]),
        *extra_args,
    ]  # fmt: skip
    try:
        _start(cluster, f"up-{port}", argv, port, f"proxy listening on {LOOPBACK}:{port}")
        if shards is None:  # every shard registered before the client port opened (docs/shards.md)
            cluster.brokers = sorted(row["broker"] for row in cluster.admin("broker", "list") or [])
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_separated(
    root: Path, *, config: Path | None = None, broker_args: Sequence[str] = (), proxy_args: Sequence[str] = (),
    proxy_ports: Sequence[int] = (), amqp: bool = False, broker_configs: Mapping[str, Path] | None = None,
    mqtt: bool = False,
) -> Cluster:  # fmt: skip
    """`config`: a TOML file given to the brokers and proxies (`--config`); `broker_args`, `proxy_args`: extra
    flags; `proxy_ports`: the two proxies' ports (default: free ones); `amqp`: each proxy serves AMQP on a free
    port of its own (`Cluster.amqp`); `mqtt`: MQTT and MQTT over WebSocket likewise (`Cluster.mqtt`,
    `Cluster.mqtt_ws`); `broker_configs`: a broker's own TOML file instead of `config`, by name."""
    root.mkdir(parents=True, exist_ok=True)
    ns_port = free_port()
    cluster = Cluster("separated", root, f"{LOOPBACK}:{ns_port}", [], list(BROKER_NAMES))
    try:
        _start(cluster, "nameserver", [*SLUICE, "nameserver", "--port", str(ns_port)], ns_port,
               f"nameserver listening on {cluster.namesrv}")  # fmt: skip
        brokers = []
        for name in BROKER_NAMES:
            port = free_port()
            argv = [*SLUICE, "broker", "--name", name, "--port", str(port), "--data-dir", str(root / name),
                    "--namesrv", cluster.namesrv, *_config_args((broker_configs or {}).get(name, config)),
                    *broker_args]  # fmt: skip
            brokers.append((name, argv, port, f"broker {name} listening on {LOOPBACK}:{port}"))
        _start_together(cluster, brokers)
        _wait_for_brokers(cluster, len(BROKER_NAMES))
        proxies = []
        for i in range(2):
            port = proxy_ports[i] if proxy_ports else free_port()
            # The first proxy runs its default worker processes (one per core), the second one process.
            workers = ["--workers", "1"] if i == 1 and "--workers" not in proxy_args else []
            amqp_args = ["--amqp-port", str(free_port())] if amqp else []
            mqtt_args = ["--mqtt-port", str(free_port()), "--mqtt-ws-port", str(free_port())] if mqtt else []
            argv = [*SLUICE, "proxy", "--namesrv", cluster.namesrv, "--port", str(port), *_config_args(config),
                    *workers, *amqp_args, *mqtt_args, *proxy_args]  # fmt: skip
            proxies.append((f"proxy-{port}", argv, port, f"proxy listening on {LOOPBACK}:{port}"))
            cluster.proxies.append(f"{LOOPBACK}:{port}")
            if amqp_args:
                cluster.amqp.append(f"{LOOPBACK}:{amqp_args[1]}")
            if mqtt_args:
                cluster.mqtt.append(f"{LOOPBACK}:{mqtt_args[1]}")
                cluster.mqtt_ws.append(f"{LOOPBACK}:{mqtt_args[3]}")
        _start_together(cluster, proxies)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _config_args(config: Path | None) -> list[str]:
    return [] if config is None else ["--config", str(config)]


def _wait_for_brokers(cluster: Cluster, count: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            rows = cluster.admin("broker", "list") or []
        except AdminError:  # none registered yet (a replicated group registers once it elected a primary)
            rows = []
        if len(rows) >= count:
            return
        if time.monotonic() >= deadline:
            raise ProcessStartError(f"only {len(rows)} of {count} brokers registered with {cluster.namesrv}")
        time.sleep(0.2)
