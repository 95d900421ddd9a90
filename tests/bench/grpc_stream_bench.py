#!/usr/bin/env python3
"""What one round trip costs on bare grpc.aio: a unary call against a message on an open stream;
and what the frames of a server stream cost against the same bytes in one answer.

    .venv/bin/python tests/bench/grpc_stream_bench.py [--calls 4000] [--payload 1400] [--frames 34]

Starts an echo server (a unary method, a bidirectional stream and a server stream, raw bytes,
uvloop) as a child process on 127.0.0.1, makes `--calls` round trips one at a time each way from
this process, and prints the wall time per round trip and the CPU time of the server and of the
client per round trip (from /proc). This is why the proxy sends to a broker on a SendStream
(docs/broker-service.md).

Then, with 8 callers at once for `--seconds`, a server stream of `--frames` frames of `--payload`
bytes against one unary answer of the same bytes: the server's CPU per call and per frame. A
ReceiveMessage of 32 messages is 34 frames (a status, the messages, a delivery timestamp; the
protocol has one message per frame), so this is what gRPC alone costs a receive, before any of
Sluice's code runs (docs/benchmarks.md). The server is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

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

    async def frames(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        count, size = (int(x) for x in request.split(b","))
        frame = b"x" * size
        for _ in range(count):
            yield frame

    async def whole(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        count, size = (int(x) for x in request.split(b","))
        return b"x" * (size * count)

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary, _same, _same),
            "Stream": grpc.stream_stream_rpc_method_handler(bidi, _same, _same),
            "Frames": grpc.unary_stream_rpc_method_handler(frames, _same, _same),
            "Whole": grpc.unary_unary_rpc_method_handler(whole, _same, _same),
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


async def _calls_until(once: Callable[[], Awaitable[None]], end: float) -> int:
    done = 0
    while time.monotonic() < end:
        await once()
        done += 1
    return done


async def measure_frames(port: int, server_pid: int, frames: int, size: int, seconds: float) -> None:
    """Server CPU per call: `frames` frames of `size` bytes on a server stream, against one answer."""
    request = f"{frames},{size}".encode()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        streamed = channel.unary_stream("/bench.Echo/Frames", _same, _same)
        whole = channel.unary_unary("/bench.Echo/Whole", _same, _same)

        async def stream_once() -> None:
            async for _ in streamed(request):
                pass

        async def whole_once() -> None:
            await whole(request)

        print(f"\n{frames} x {size} B, 8 callers{'':<12}{'calls/s':>10}{'server CPU µs/call':>20}{'µs/frame':>10}")
        for name, once in ((f"{frames} stream frames", stream_once), ("one unary answer", whole_once)):
            for _ in range(WARMUP_CALLS // 8):
                await once()
            end = time.monotonic() + seconds
            s0, t0 = cpu_s(server_pid), time.perf_counter()
            done = sum(await asyncio.gather(*(_calls_until(once, end) for _ in range(8))))
            s1, t1 = cpu_s(server_pid), time.perf_counter()
            per_call = (s1 - s0) * 1e6 / max(done, 1)
            frames_per_call = frames if name.endswith("frames") else 1
            print(f"{name:<34}{done / (t1 - t0):>10,.0f}{per_call:>20.0f}{per_call / frames_per_call:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--payload", type=int, default=1400, help="bytes each way")
    parser.add_argument("--frames", type=int, default=34, help="frames of a server stream (0: skip that part)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds of each frames run")
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
        if args.frames:
            asyncio.run(measure_frames(port, server.pid, args.frames, args.payload, args.seconds))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
