"""Broker (and NameServer) child processes for tests, and a `RemoteBroker` connected to one.

Synchronous, for fixtures:
- `start_nameserver_process(root)` → `ServerProcess` of `sluice nameserver` on a free port.
- `start_broker_process(root, settings=..., namesrv=...)` → `ServerProcess` of `sluice broker` on a
  free port, data in `root/<name>`. `settings` is a `[broker]` table (nested dicts allowed) written
  to a TOML file and passed with `--config`; flags set name, port, data dir and NameServers.
Both return once the process printed its "listening on" line; `stop()` sends SIGTERM and returns
the exit code (SIGKILL after a timeout).

Asynchronous, for async tests:
- `async with running_broker(root, with_nameserver=True) as handle:` starts the processes (in a
  thread, so the loop stays free), yields a `BrokerHandle` whose `remote` is a `RemoteBroker`
  connected from the current loop, and on exit closes it and stops every process it started.

Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.client.remote import RemoteBroker
from tests.helpers.procs import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    LOOPBACK,
    ChildProcess,
    ProcessStartError,
    free_port,
    start_process,
)

SLUICE_ARGV = [sys.executable, "-m", "sluice"]
DEFAULT_BROKER_NAME = "broker-a"
DEFAULT_RPC_TIMEOUT_S = 5.0
_READY_POLL_INTERVAL_S = 0.05


@dataclass
class ServerProcess:
    """A `sluice nameserver` or `sluice broker` child serving on LOOPBACK:port."""

    name: str
    port: int
    child: ChildProcess

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def running(self) -> bool:
        return self.child.running()

    def output(self) -> str:
        return self.child.output()

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> int:
        return self.child.stop(timeout_s)


def start_nameserver_process(root: Path, *extra_args: str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> ServerProcess:
    port = free_port()
    argv = [*SLUICE_ARGV, "nameserver", "--port", str(port), *extra_args]
    child = start_process(argv, port=port, log_path=root / f"nameserver-{port}.log", name=f"nameserver:{port}")
    proc = ServerProcess("nameserver", port, child)
    _wait_for_line(proc, f"nameserver listening on {proc.address}", timeout_s)
    return proc


def start_broker_process(
    root: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    name: str | None = None,
    namesrv: str | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
) -> ServerProcess:
    """`sluice broker` with data in `root/<name>`; name from `name`, else `settings["name"]`, else broker-a."""
    broker_name = name or str((settings or {}).get("name", DEFAULT_BROKER_NAME))
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    argv = [
        *SLUICE_ARGV, "broker", "--name", broker_name, "--port", str(port),
        "--data-dir", str(root / broker_name), *extra_args,
    ]  # fmt: skip
    if settings:
        config_path = root / f"{broker_name}-{port}.toml"
        config_path.write_text(to_toml({"broker": dict(settings)}))
        argv += ["--config", str(config_path)]
    if namesrv:
        argv += ["--namesrv", namesrv]
    child = start_process(argv, port=port, log_path=root / f"{broker_name}-{port}.log", name=f"broker:{broker_name}")
    proc = ServerProcess(broker_name, port, child)
    _wait_for_line(proc, f"broker {broker_name} listening on {proc.address}", timeout_s)
    return proc


@dataclass
class BrokerHandle:
    remote: RemoteBroker
    broker: ServerProcess
    nameserver: ServerProcess | None


@asynccontextmanager
async def running_broker(
    root: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    with_nameserver: bool = False,
    rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
) -> AsyncIterator[BrokerHandle]:
    """A broker process (plus a NameServer it registers with, if asked) and a RemoteBroker to it."""
    nameserver: ServerProcess | None = None
    broker: ServerProcess | None = None
    try:
        if with_nameserver:
            nameserver = await asyncio.to_thread(start_nameserver_process, root)
        namesrv = nameserver.address if nameserver else None
        broker = await asyncio.to_thread(start_broker_process, root, settings=settings, namesrv=namesrv)
        remote = RemoteBroker(broker.name, broker.address, timeout_s=rpc_timeout_s)
        try:
            yield BrokerHandle(remote, broker, nameserver)
        finally:
            await remote.close()
    finally:
        for proc in (broker, nameserver):
            if proc is not None:
                await asyncio.to_thread(proc.stop)


def to_toml(table: Mapping[str, Any], prefix: str = "") -> str:
    """A nested mapping of scalars and lists as TOML text (enough for config tables in tests)."""
    scalars = [f"{key} = {_toml_value(value)}" for key, value in table.items() if not isinstance(value, Mapping)]
    lines = [f"[{prefix}]", *scalars] if prefix and scalars else scalars
    text = "\n".join(lines) + ("\n" if lines else "")
    for key, value in table.items():
        if isinstance(value, Mapping):
            text += "\n" + to_toml(value, f"{prefix}.{key}" if prefix else key)
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _wait_for_line(proc: ServerProcess, line: str, timeout_s: float) -> None:
    """The port is open once gRPC binds; the line says the component behind it is serving."""
    deadline = time.monotonic() + timeout_s
    while line not in proc.output():
        if not proc.running() or time.monotonic() >= deadline:
            proc.stop()
            raise ProcessStartError(f"{proc.child.name} did not print {line!r}; last lines:\n{proc.child.tail()}")
        time.sleep(_READY_POLL_INTERVAL_S)


async def serve_in_process(servicer: Any, port: int = 0) -> tuple[Any, int]:
    """A `BrokerServicer` served as the broker process serves it (our HTTP/2 gRPC server, the
    broker's limits) on loopback in this process: (the `GrpcServer`, its port). Stop it with
    `await server.shutdown(0)`."""
    from broker import service
    from broker.client.grpc_convert import MAX_MESSAGE_BYTES
    from broker.server import MAX_CONCURRENT_RPCS, SERVICE_HTTP2
    from common.http2.grpcserver import GrpcLimits, GrpcServer

    server = GrpcServer(GrpcLimits(MAX_MESSAGE_BYTES, MAX_CONCURRENT_RPCS), SERVICE_HTTP2)
    service.serve(server, servicer)
    return server, await server.listen(LOOPBACK, port)
