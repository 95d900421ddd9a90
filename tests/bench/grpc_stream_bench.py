#!/usr/bin/env python3
"""What one round trip costs on bare grpc.aio: a unary call against a message on an open stream.

    .venv/bin/python tests/bench/grpc_stream_bench.py [--calls 4000] [--payload 1400]

Starts an echo server (a unary method and a bidirectional stream, raw bytes, uvloop) as a child
process on 127.0.0.1, makes `--calls` round trips one at a time each way from this process, and
prints the wall time per round trip and the CPU time of the server and of the client per round trip
(from /proc). This is why the proxy sends to a broker on a SendStream (docs/broker-service.md).
The server is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import grpc
import uvloop

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)

from tests.helpers.procs import free_port  # noqa: E402

WARMUP_CALLS = 200
START_WAIT_S = 1.5


def _same(b: bytes) -> bytes:
    return b


async def serve(port: int) -> None:
    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def bidi(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary, _same, _same),
            "Stream": grpc.stream_stream_rpc_method_handler(bidi, _same, _same),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(port: int, server_pid: int, calls: int, payload: bytes) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        unary = channel.unary_unary("/bench.Echo/Unary", _same, _same)
        stream = channel.stream_stream("/bench.Echo/Stream", _same, _same)()

        async def unary_once() -> None:
            await unary(payload)

        async def stream_once() -> None:
            await stream.write(payload)
            await stream.read()

        print(f"{'round trip':<22}{'wall µs':>10}{'server CPU µs':>15}{'client CPU µs':>15}")
        for name, once in (("unary call", unary_once), ("message on a stream", stream_once)):
            for _ in range(WARMUP_CALLS):
                await once()
            s0, c0, t0 = cpu_s(server_pid), cpu_s(os.getpid()), time.perf_counter()
            for _ in range(calls):
                await once()
            s1, c1, t1 = cpu_s(server_pid), cpu_s(os.getpid()), time.perf_counter()
            per = 1e6 / calls
            print(f"{name:<22}{(t1 - t0) * per:>10.0f}{(s1 - s0) * per:>15.0f}{(c1 - c0) * per:>15.0f}")
        await stream.done_writing()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--payload", type=int, default=1400, help="bytes each way")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    uvloop.install()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        time.sleep(START_WAIT_S)
        asyncio.run(measure(port, server.pid, args.calls, b"x" * args.payload))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
