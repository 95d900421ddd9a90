#!/usr/bin/env python3
"""CPU and instructions per request of the official clients' requests through the merged server,
without sockets (issue 41): what the official Python and Node.js clients send, recorded once, then
fed again and again into the server's connections.

    .venv/bin/python tests/bench/edge_replay.py record --out DIR [--seconds 3]
    .venv/bin/python tests/bench/edge_replay.py replay DIR [--target proxy|edge] [--client python|node]
                                                       [--repeat 5] [--limit N]

`record` serves a merged proxy in this process (our HTTP/2 gRPC server, MessagingService, a
`LocalBroker` in a temp dir, the bench topic created) on a loopback port, runs each official
client's send driver against it for `--seconds` (tests/bench/clients/: the Python client's
`Producer.send` from 4 threads, the Node.js client's 4 concurrent `send()`), and writes the bytes
each client connection sent (`python-<n>.h2`, `node-<n>.h2`: HTTP/2 preface, SETTINGS, header
blocks with their HPACK state, messages) to DIR.

`replay` feeds each recorded connection, in 64 KiB reads, into a fresh server connection whose
transport discards what is written (the answers are built and framed, not sent), on uvloop:
- `--target proxy`: the real merged path (MessagingService over a `LocalBroker`, async flush): what
  a merged shard's event loop does per request, except the socket reads and writes;
- `--target edge`: every method answered by a stub with a fixed response: HTTP/2 frames, HPACK,
  header validation, the gRPC call and its task, the response framing.
It prints CPU µs per request (`time.process_time`, every thread; best of `--repeat`). For
instruction counts (load-independent), run `replay` under callgrind twice, with `--limit` at two
request counts, and divide the difference of the totals by the difference of the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import uvloop

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from broker.client.api import GroupSpec, TopicSpec  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.local import LocalBroker  # noqa: E402
from common.http2.grpcserver import Call, GrpcLimits, GrpcServer, Kind  # noqa: E402
from common.http2.server import ServerConnection  # noqa: E402
from proto.apache.rocketmq.v2 import service_pb2 as spb  # noqa: E402
from proxy.app import ProxyApp  # noqa: E402
from proxy.config import ProxyConfig  # noqa: E402
from proxy.directory import LocalDirectory  # noqa: E402
from proxy.grpc.edge import Edge  # noqa: E402
from proxy.grpc.servicer import MessagingServicer  # noqa: E402
from tests.bench.client_bench import BODY_BYTES, PY_GROUP, QUEUES, TOPIC, node_driver, node_modules, py_driver  # noqa: E402
from tests.helpers.procs import LOOPBACK, free_port  # noqa: E402

READ_BYTES = 64 * 1024
SERVICE = "apache.rocketmq.v2.MessagingService"
_STUB_ANSWER = b"\x0a\x02\x08\x00"  # a response whose status is {code: 0}: parsed by no one here


class _Sink:
    """A transport that takes every write and sends nothing."""

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (LOOPBACK, 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


async def _merged(root: Path, port: int) -> tuple[LocalBroker, GrpcServer]:
    broker = LocalBroker(BrokerConfig(data_dir=root / "broker"))
    await broker.start()
    await broker.create_topic(TopicSpec(TOPIC, QUEUES))
    await broker.create_group(GroupSpec(PY_GROUP))
    config = ProxyConfig(host=LOOPBACK, port=port or 1)  # (replayed: routes name a port never listened on)
    server = GrpcServer(GrpcLimits(config.max_message_bytes, config.max_concurrent_rpcs), config.http2)
    app = ProxyApp(config, LocalDirectory(broker))
    Edge(app, MessagingServicer(app)).register(server)
    return broker, server


def _stub_server() -> GrpcServer:
    server = GrpcServer(GrpcLimits(), ProxyConfig().http2)

    async def unary(raw: bytes, call: Call) -> bytes:
        return _STUB_ANSWER

    for method in spb.DESCRIPTOR.services_by_name["MessagingService"].methods:
        if not method.client_streaming and not method.server_streaming:
            server.add(f"/{SERVICE}/{method.name}", Kind.UNARY, unary)
    return server


# -- record ---------------------------------------------------------------------------------------


async def record(seconds: float) -> list[tuple[str, bytearray]]:
    """(client, the bytes it sent) of every connection the clients opened."""
    root = Path(tempfile.mkdtemp(prefix="sluice-edge-replay-"))
    port = free_port()
    broker, server = await _merged(root, port)
    recorded: list[tuple[str, bytearray]] = []
    client = ["python"]
    make = server._connection

    def recording() -> ServerConnection:  # every connection's input, kept
        conn = make()
        data = bytearray()
        recorded.append((client[0], data))
        receive = conn.data_received

        def data_received(chunk: bytes) -> None:
            data.extend(chunk)
            receive(chunk)

        conn.data_received = data_received  # type: ignore[method-assign,assignment]
        return conn

    server._connection = recording  # type: ignore[method-assign]
    try:
        await server.listen(LOOPBACK, port)
        base = {"endpoint": f"{LOOPBACK}:{port}", "topic": TOPIC, "warmup_s": 0.5, "seconds": seconds}
        drivers = {"python": py_driver({**base, "mode": "produce", "threads": 4, "body_bytes": BODY_BYTES})}
        modules = node_modules()
        if modules is not None:
            drivers["node"] = node_driver({**base, "modulesDir": str(modules), "warmupS": 0.5, "mode": "produce",
                                           "bodyBytes": BODY_BYTES, "concurrency": 4})  # fmt: skip
        for name, argv in drivers.items():
            client[0] = name
            proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                                        stderr=subprocess.DEVNULL)  # fmt: skip
            stdout, _ = await asyncio.wait_for(proc.communicate(), seconds + 90)
            events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
            ends = [e for e in events if e.get("event") == "end"]
            print(f"{name}: {ends[-1]['messages'] if ends else 0} sends measured by its driver", file=sys.stderr)
    finally:
        await server.shutdown(1.0)
        await broker.close()
        shutil.rmtree(root, ignore_errors=True)
    return recorded


# -- replay ---------------------------------------------------------------------------------------


async def replay(streams: list[bytes], target: str, client: str, repeat: int, limit: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="sluice-edge-replay-"))
    broker: LocalBroker | None = None
    if target == "proxy":
        broker, server = await _merged(root, 0)
    else:
        server = _stub_server()
    best, calls = float("inf"), 0
    gc.freeze()  # as every server process does once started (common/frozen.py)
    try:
        for _ in range(repeat):
            calls = 0
            started = time.process_time()
            for data in streams:
                calls += await _feed(server, data, limit - calls if limit else 0)
                if limit and calls >= limit:
                    break
            if broker is not None:
                await asyncio.sleep(0.05)  # the writer's last round
            best = min(best, (time.process_time() - started) / max(calls, 1))
    finally:
        await server.shutdown(0)
        if broker is not None:
            await broker.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{client} -> {target}: {calls} requests per pass, best of {repeat}: {best * 1e6:.1f} CPU µs per request")


async def _feed(server: GrpcServer, data: bytes, limit: int) -> int:
    """One recorded connection into a new server connection; the calls that ended."""
    conn = server._connection()
    conn.connection_made(cast(asyncio.BaseTransport, _Sink()))
    done = [0]
    ended = server.call_ended

    def stop_at_limit(call: Call) -> None:
        done[0] += 1
        ended(call)

    server.call_ended = stop_at_limit  # type: ignore[method-assign]
    try:
        for at in range(0, len(data), READ_BYTES):
            if limit and done[0] >= limit:
                break
            conn.data_received(data[at : at + READ_BYTES])
            for _ in range(3):  # the calls' tasks run, their answers are written
                await asyncio.sleep(0)
    finally:
        server.call_ended = ended  # type: ignore[method-assign]
        for _ in range(3):
            await asyncio.sleep(0)
        conn.connection_lost(None)
    return done[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--seconds", type=float, default=3.0)
    rep = sub.add_parser("replay")
    rep.add_argument("dir", type=Path)
    rep.add_argument("--target", choices=("proxy", "edge"), default="proxy")
    rep.add_argument("--client", choices=("python", "node"), default="python")
    rep.add_argument("--repeat", type=int, default=5)
    rep.add_argument("--limit", type=int, default=0, help="stop after this many requests per pass (0: all)")
    args = ap.parse_args()
    if args.command == "record":
        args.out.mkdir(parents=True, exist_ok=True)
        counts: dict[str, int] = {}
        for name, data in uvloop.run(record(args.seconds)):
            if len(data) > 1024:  # a connection that carried requests
                counts[name] = counts.get(name, 0) + 1
                (args.out / f"{name}-{counts[name]}.h2").write_bytes(data)
        print(f"written to {args.out}: {counts}", file=sys.stderr)
        return 0
    streams = [p.read_bytes() for p in sorted(args.dir.glob(f"{args.client}-*.h2"))]
    if not streams:
        raise SystemExit(f"no {args.client}-*.h2 in {args.dir}: run `record` first")
    uvloop.run(replay(streams, args.target, args.client, args.repeat, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
