"""The load generator's own HTTP/2 client (bench/http2.py) against a real grpc.aio server: bytes in
and out, flow control past the default windows, streams, gRPC errors, deadlines, a lost server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from bench.client import Http2Transport
from bench.errors import CallError
from bench.http2 import Http2Connection, connect, request_headers
from tests.helpers.procs import LOOPBACK, free_port

ECHO, STREAM, FAIL, SLOW = "/t.T/Echo", "/t.T/Stream", "/t.T/Fail", "/t.T/Slow"
MIB = 1 << 20


async def _echo(request: bytes, _: grpc.aio.ServicerContext) -> bytes:
    return request


async def _stream(request: bytes, _: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(int(request)):
        yield b"m%d" % i + b"x" * 1000


async def _fail(_: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
    raise AssertionError("abort returns no more")


async def _slow(request: bytes, _: grpc.aio.ServicerContext) -> bytes:
    await asyncio.sleep(2)
    return request


def _handler() -> grpc.GenericRpcHandler:
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
        "Slow": grpc.unary_unary_rpc_method_handler(_slow),
    }
    return grpc.method_handlers_generic_handler("t.T", methods)


def run_with_server(test: Callable[[str, grpc.aio.Server], Awaitable[None]]) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(),))
        port = server.add_insecure_port(f"{LOOPBACK}:{free_port()}")
        await server.start()
        try:
            await test(f"{LOOPBACK}:{port}", server)
        finally:
            await server.stop(None)

    asyncio.run(main())


async def call(conn: Http2Connection, path: str, request: bytes, timeout_s: float = 5.0) -> list[bytes]:
    block = request_headers(conn.authority, path, timeout_s, [("x-mq-request-id", "1")])
    messages, _ = await conn.call(block, request, timeout_s)
    return messages


def test_unary_calls_past_the_windows_and_concurrent_on_one_connection() -> None:
    async def test(endpoint: str, _: Any) -> None:
        conn = await connect(endpoint, 5.0)
        big = bytes(range(256)) * (4 * MIB // 256)  # 64x the default 64 KiB windows
        assert await call(conn, ECHO, big) == [big]
        bodies = [b"%d" % i * (i * 997) for i in range(1, 41)]
        answers = await asyncio.gather(*(call(conn, ECHO, b) for b in bodies))
        assert answers == [[b] for b in bodies]
        assert await call(conn, ECHO, b"") == [b""]
        conn.close()

    run_with_server(test)


def test_a_server_stream_returns_every_message_in_order() -> None:
    async def test(endpoint: str, _: Any) -> None:
        conn = await connect(endpoint, 5.0)
        messages = await call(conn, STREAM, b"500")
        assert len(messages) == 500
        assert all(m.startswith(b"m%d" % i) and len(m) == len(b"m%d" % i) + 1000 for i, m in enumerate(messages))
        assert await call(conn, STREAM, b"0") == []
        conn.close()

    run_with_server(test)


def test_grpc_errors_and_deadlines_are_call_errors_and_leave_the_connection_usable() -> None:
    async def test(endpoint: str, _: Any) -> None:
        conn = await connect(endpoint, 5.0)
        with pytest.raises(CallError) as failed:
            await call(conn, FAIL, b"x")
        assert failed.value.code == "grpc.NOT_FOUND"
        assert "no such thing" in str(failed.value)
        with pytest.raises(CallError) as unknown:
            await call(conn, "/t.T/Nothing", b"x")
        assert unknown.value.code == "grpc.UNIMPLEMENTED"
        with pytest.raises(CallError) as late:
            await call(conn, SLOW, b"x", timeout_s=0.2)
        assert late.value.code == "grpc.DEADLINE_EXCEEDED"
        assert await call(conn, ECHO, b"still here") == [b"still here"]
        conn.close()
        with pytest.raises(CallError) as closed:
            await call(conn, ECHO, b"x")
        assert closed.value.code == "grpc.UNAVAILABLE"

    run_with_server(test)


def test_no_server_and_a_server_that_goes_away_are_unavailable() -> None:
    async def no_server() -> None:
        with pytest.raises(CallError) as refused:
            await connect(f"{LOOPBACK}:{free_port()}", 2.0)
        assert refused.value.code == "grpc.UNAVAILABLE"

    asyncio.run(no_server())

    async def test(endpoint: str, server: grpc.aio.Server) -> None:
        conn = await connect(endpoint, 5.0)
        pending = asyncio.create_task(call(conn, SLOW, b"x"))
        await asyncio.sleep(0.2)
        await server.stop(None)
        with pytest.raises(CallError) as gone:
            await pending
        assert gone.value.code in ("grpc.UNAVAILABLE", "grpc.CANCELLED", "grpc.INTERNAL")

    run_with_server(test)


def test_the_transport_reconnects_after_the_server_came_back() -> None:
    async def main() -> None:
        port = free_port()
        endpoint = f"{LOOPBACK}:{port}"

        async def start() -> grpc.aio.Server:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((_handler(),))
            server.add_insecure_port(endpoint)
            await server.start()
            return server

        server = await start()
        transport = Http2Transport(endpoint)
        try:
            await transport.wait_ready(5.0)
            assert await transport.unary(ECHO, b"one", (), 5.0) == b"one"
            await server.stop(None)
            with pytest.raises(CallError) as down:
                await transport.unary(ECHO, b"two", (), 2.0)
            assert down.value.code == "grpc.UNAVAILABLE"
            server = await start()
            assert await transport.unary(ECHO, b"three", (), 5.0) == b"three"
        finally:
            await transport.close()
            await server.stop(None)

    asyncio.run(main())
