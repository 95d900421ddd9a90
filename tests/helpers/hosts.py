"""Machines for tests: Linux network namespaces, each with its own address on a bridge (issue 43).

A `Lab` makes subnets (a bridge each, `10.43.<n>.0/24`) and hosts (a network namespace each,
joined to its subnet by a veth pair, with its own address and loopback); with several subnets a
router namespace joins them, as two zones of one network. Every Sluice process of a host runs in it
(`Host.spawn`: `ip netns exec`), so what it advertises is what other hosts dial, and 127.0.0.1 on
one host is not another's. `Host.cut()` takes the host off the network as a pulled cable would
(its link on the bridge down: its packets and those sent to it are lost, no error comes back at
once) and `Host.heal()` plugs it back.

The root namespace gets no address on these bridges: the test process reaches the hosts only
through processes it starts in them (`Host.run`), never by routing, so a route handing out
127.0.0.1 reaches nothing of another test run. Names carry a tag unique to this run (other runs may
make labs at the same time); `close()` stops the processes it started (by PID) and deletes exactly
the namespaces, links and bridges it made, also after a failure half-way. `unavailable()` says
why labs cannot be made here (not root, no `ip`, no namespaces): tests skip with that reason.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tests.helpers.procs import DEFAULT_STOP_TIMEOUT_S, ChildProcess, ProcessStartError, spawn_process

IP = shutil.which("ip") or "/usr/sbin/ip"
SUBNET_PREFIX = "10.43"  # subnet n is 10.43.<n>.0/24 (n from 1); its router is .1, hosts from .10
FIRST_HOST = 10
MAX_HOSTS = 200
COMMAND_TIMEOUT_S = 10.0
LISTEN_TIMEOUT_S = 30.0
POLL_S = 0.05
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=check)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (tried with one)."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if not Path(IP).exists():
        return "the `ip` command (iproute2) is not installed"
    probe = f"sluice-probe-{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    lab: Lab
    name: str
    netns: str
    address: str
    subnet: int
    link: str  # the root-namespace end of its veth pair, on the subnet's bridge
    children: list[ChildProcess] = field(default_factory=list)

    def argv(self, argv: Sequence[str]) -> list[str]:
        return [IP, "netns", "exec", self.netns, *argv]

    def spawn(self, argv: Sequence[str], *, log_path: Path, name: str = "",
              env: Mapping[str, str] | None = None) -> ChildProcess:  # fmt: skip
        """Start `argv` in this host (output to `log_path`); it is stopped by `Lab.close()`. The PID
        is the program's own (`ip netns exec` execs it)."""
        child = spawn_process(self.argv(argv), log_path=log_path, name=name or f"{self.name}:{argv[0]}", env=env)
        self.children.append(child)
        return child

    def sluice(self, *args: str, log_path: Path, name: str = "") -> ChildProcess:
        return self.spawn([sys.executable, "-m", "sluice", *args], log_path=log_path, name=name)

    def run(
        self, argv: Sequence[str], *, timeout_s: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in this host to its end (bounded); its output as text."""
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        done = subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=Path(__file__).resolve().parents[2])  # fmt: skip
        if check and done.returncode:
            what = f"{' '.join(argv)} in {self.name} exited {done.returncode}"
            raise AssertionError(f"{what}:\n{done.stdout}\n{done.stderr}")
        return done

    def listening(self, port: int) -> bool:
        """Whether a TCP socket listens on `port` in this host (read from the host's own /proc view)."""
        alive = [c for c in self.children if c.running()]
        if not alive:
            return False
        for table in ("tcp", "tcp6"):  # gRPC may listen on an IPv6 socket taking IPv4 too
            try:
                rows = Path(f"/proc/{alive[0].pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                if state == _TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
        return False

    def wait_listening(self, child: ChildProcess, port: int, timeout_s: float = LISTEN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.listening(port):
            if not child.running():
                raise ProcessStartError(f"{child.name} exited with {child.popen.returncode} before listening on "
                                        f"{port}; log {child.log_path}:\n{child.tail()}")  # fmt: skip
            if time.monotonic() >= deadline:
                raise ProcessStartError(f"{child.name} did not listen on {port} within {timeout_s} s; log "
                                        f"{child.log_path}:\n{child.tail()}")  # fmt: skip
            time.sleep(POLL_S)

    def endpoint(self, port: int) -> str:
        return f"{self.address}:{port}"

    def cut(self) -> None:
        """Off the network: its link on the bridge down (nothing in or out; no error at once)."""
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")


@dataclass
class Lab:
    """Subnets and hosts of one test run; a context manager that always cleans up what it made."""

    subnets: int = 1
    tag: str = field(default_factory=lambda: f"s{secrets.token_hex(3)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    _bridges: list[str] = field(default_factory=list)
    _netns: list[str] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)

    def __enter__(self) -> Lab:
        try:
            for n in range(1, self.subnets + 1):
                bridge = f"{self.tag}b{n}"
                _ip("link", "add", bridge, "type", "bridge")
                self._bridges.append(bridge)
                _ip("link", "set", bridge, "up")
            if self.subnets > 1:
                self._router()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: BaseException | TracebackType | None) -> None:
        problems = self.close()
        if problems and kind is None:  # an error in flight says more than what its cleanup left
            raise AssertionError("lab teardown:\n" + "\n".join(problems))

    def _namespace(self, name: str) -> str:
        netns = f"sluice-{self.tag}-{name}"
        _ip("netns", "add", netns)
        self._netns.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        return netns

    def _plug(self, netns: str, index: int, subnet: int, address: str, inner: str = "eth0") -> str:
        """A veth pair from `netns` (as `inner`, with `address`/24) to subnet `subnet`'s bridge; the
        root end's name."""
        outer, temp = f"{self.tag}v{index}s{subnet}", f"{self.tag}p{index}s{subnet}"
        _ip("link", "add", outer, "type", "veth", "peer", "name", temp)
        self._links.append(outer)
        _ip("link", "set", temp, "netns", netns)
        _ip("-n", netns, "link", "set", temp, "name", inner)
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", inner)
        _ip("-n", netns, "link", "set", inner, "up")
        _ip("link", "set", outer, "master", f"{self.tag}b{subnet}", "up")
        return outer

    def _router(self) -> None:
        netns = self._namespace("router")
        for n in range(1, self.subnets + 1):
            self._plug(netns, 0, n, f"{SUBNET_PREFIX}.{n}.1", inner=f"eth{n}")
        subprocess.run([IP, "netns", "exec", netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True,
                       timeout=COMMAND_TIMEOUT_S)  # fmt: skip

    def add_host(self, name: str, subnet: int = 1) -> Host:
        """A new host on subnet `subnet` (1-based), with the next free address there."""
        assert name not in self.hosts and 1 <= subnet <= self.subnets, (name, subnet)
        index = len(self.hosts) + 1
        assert index <= MAX_HOSTS
        try:
            netns = self._namespace(name)
            address = f"{SUBNET_PREFIX}.{subnet}.{FIRST_HOST + index}"
            link = self._plug(netns, index, subnet, address)
            if self.subnets > 1:
                _ip("-n", netns, "route", "add", "default", "via", f"{SUBNET_PREFIX}.{subnet}.1")
        except BaseException:
            self.close()
            raise
        host = Host(self, name, netns, address, subnet, link)
        self.hosts[name] = host
        return host

    def close(self) -> list[str]:
        """Stop every process started in a host (SIGTERM, then SIGKILL; the last host's first), then
        delete the namespaces, links and bridges this lab made; what could not be undone, as text."""
        problems: list[str] = []
        for host in reversed(self.hosts.values()):  # clients and proxies before brokers, as an operator stops them
            for child in reversed(host.children):
                if child.running():
                    try:
                        child.stop(timeout_s=DEFAULT_STOP_TIMEOUT_S)
                    except Exception as exc:  # keep going: the namespaces must go too
                        problems.append(f"{child.name}: {exc}")
        for name in self._links:
            _ip("link", "del", name, check=False)  # its peer goes with it
        for netns in self._netns:
            done = _ip("netns", "del", netns, check=False)
            if done.returncode:
                problems.append(f"netns {netns}: {done.stderr.strip()}")
        for bridge in self._bridges:
            _ip("link", "del", bridge, check=False)
        self._links.clear()
        self._netns.clear()
        self._bridges.clear()
        return problems
