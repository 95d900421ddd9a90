"""Our gRPC client (common/http2/client.py) against our server (common/http2/grpcserver.py) and
against grpc.aio's (C-core, what older brokers and other gRPC servers run): bytes in and out past
every window, server streams, status and trailers, deadlines, cancellation, the server's stream
limit, bounds, GOAWAY, a server that goes away and comes back (backoff), calls the server never
saw tried again, and TLS with ALPN h2."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.http2.client import Channel, RpcError, client_ssl_context
from common.http2.grpcserver import Call, GrpcError, GrpcLimits, GrpcServer, Kind, StatusCode, server_ssl_context
from common.http2.limits import Http2Limits
from tests.helpers.procs import LOOPBACK, free_port
from tests.helpers.tls import self_signed

MIB = 1 << 20
TIMEOUT_S = 10.0
ECHO, STREAM, FAIL, SLOW, HELD = "/t.T/Echo", "/t.T/Stream", "/t.T/Fail", "/t.T/Slow", "/t.T/Held"


class Service:
    """The methods, for both servers (a grpc.aio context is passed where our `Call` is)."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.held = 0
        self.most_held = 0
        self.metadata: list[Any] = []

    async def echo(self, request: bytes, call: Any) -> bytes:
        self.metadata = list(call.invocation_metadata())
        return request

    async def stream(self, request: bytes, call: Any) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield b"%d:" % i + b"x" * 1000

    async def slow(self, request: bytes, call: Any) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(TIMEOUT_S * 2)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return request

    async def held_call(self, request: bytes, call: Any) -> bytes:
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        self.started.set()
        try:
            await self.release.wait()
        finally:
            self.held -= 1
        return request


async def _fail_ours(request: bytes, call: Call) -> bytes:
    raise GrpcError(StatusCode.NOT_FOUND, "no such thing: ✓ 100%", trailing=(("x-why", "because"),))


async def _fail_aio(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: ✓ 100%", trailing_metadata=(("x-why", "because"),))
    raise AssertionError("abort returns no more")


async def _ours(svc: Service, port: int = 0, *, limits: Http2Limits | None = None,
                tls: Path | None = None) -> tuple[GrpcServer, int]:  # fmt: skip
    server = GrpcServer(GrpcLimits(max_message_bytes=8 * MIB), limits or Http2Limits())
    server.add(ECHO, Kind.UNARY, svc.echo)
    server.add(STREAM, Kind.SERVER_STREAMING, svc.stream)
    server.add(FAIL, Kind.UNARY, _fail_ours)
    server.add(SLOW, Kind.UNARY, svc.slow)
    server.add(HELD, Kind.UNARY, svc.held_call)
    ctx = None if tls is None else server_ssl_context(str(tls / "cert.pem"), str(tls / "key.pem"))
    return server, await server.listen(LOOPBACK, port, ssl_context=ctx)


async def _aio(svc: Service, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(svc.echo),
        "Stream": grpc.unary_stream_rpc_method_handler(svc.stream),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail_aio),
        "Slow": grpc.unary_unary_rpc_method_handler(svc.slow),
        "Held": grpc.unary_unary_rpc_method_handler(svc.held_call),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", methods),))
    port = server.add_insecure_port(f"{LOOPBACK}:{port}")
    await server.start()
    return server, port


async def _stop(server: GrpcServer | grpc.aio.Server) -> None:
    if isinstance(server, GrpcServer):
        await server.shutdown(0.5)
    else:
        await server.stop(None)


def both(test: Callable[[Channel, Service], Awaitable[None]]) -> Callable[[str], None]:
    """Run `test` with a channel to each kind of server."""

    def run(kind: str) -> None:
        async def main() -> None:
            svc = Service()
            server, port = await (_ours(svc) if kind == "ours" else _aio(svc))
            ch = Channel(f"{LOOPBACK}:{port}", max_message_bytes=8 * MIB)
            try:
                await asyncio.wait_for(test(ch, svc), TIMEOUT_S * 2)
            finally:
                svc.release.set()
                await ch.close()
                await _stop(server)

        asyncio.run(main())

    return pytest.mark.parametrize("kind", ["ours", "grpc.aio"])(run)


@both
async def test_unary_calls_past_the_windows_concurrent_and_with_metadata(ch: Channel, svc: Service) -> None:
    big = bytes(range(256)) * (5 * MIB // 256)  # 80x the default 64 KiB windows, both ways
    assert await ch.unary(ECHO, big, timeout_s=TIMEOUT_S) == big
    bodies = [b"%d" % i * (i * 997) for i in range(1, 41)]
    answers = await asyncio.gather(*(ch.unary(ECHO, b, timeout_s=TIMEOUT_S) for b in bodies))
    assert answers == bodies
    assert await ch.unary(ECHO, b"", timeout_s=TIMEOUT_S) == b""
    method = ch.method(ECHO, [("x-fixed", "1")])
    assert await ch.unary(method, b"md", timeout_s=TIMEOUT_S, metadata=[("x-per-call", "2")]) == b"md"
    assert ("x-fixed", "1") in svc.metadata and ("x-per-call", "2") in svc.metadata


@both
async def test_a_server_stream_returns_every_message_in_order(ch: Channel, svc: Service) -> None:
    messages = await ch.server_stream(STREAM, b"500", timeout_s=TIMEOUT_S)
    assert [m.split(b":")[0] for m in messages] == [b"%d" % i for i in range(500)]
    assert await ch.server_stream(STREAM, b"0", timeout_s=TIMEOUT_S) == []


@both
async def test_status_message_and_trailers_and_the_connection_stays_usable(ch: Channel, svc: Service) -> None:
    with pytest.raises(RpcError) as failed:
        await ch.unary(FAIL, b"x", timeout_s=TIMEOUT_S)
    assert failed.value.code == StatusCode.NOT_FOUND and failed.value.message == "no such thing: ✓ 100%"
    assert failed.value.trailers.get("x-why") == "because" and failed.value.sent
    with pytest.raises(RpcError) as unknown:
        await ch.unary("/t.T/Nothing", b"x", timeout_s=TIMEOUT_S)
    assert unknown.value.code == StatusCode.UNIMPLEMENTED
    assert await ch.unary(ECHO, b"still here", timeout_s=TIMEOUT_S) == b"still here"


@both
async def test_deadlines_and_cancellation_reset_the_stream_and_cancel_the_handler(ch: Channel, svc: Service) -> None:
    with pytest.raises(RpcError) as late:
        await ch.unary(SLOW, b"x", timeout_s=0.3)
    assert late.value.code == StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(svc.cancelled.wait(), TIMEOUT_S)
    svc.cancelled.clear()
    svc.started.clear()
    task = asyncio.create_task(ch.unary(SLOW, b"x", timeout_s=TIMEOUT_S))
    await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(svc.cancelled.wait(), TIMEOUT_S)
    assert await ch.unary(ECHO, b"after", timeout_s=TIMEOUT_S) == b"after"


@both
async def test_a_response_over_the_limit_is_refused_and_the_connection_goes_on(ch: Channel, svc: Service) -> None:
    small = Channel(ch.target, max_message_bytes=1000)
    try:
        with pytest.raises(RpcError) as big:
            await small.unary(ECHO, b"y" * 5000, timeout_s=TIMEOUT_S)
        assert big.value.code == StatusCode.RESOURCE_EXHAUSTED and "max_message_bytes" in big.value.message
        assert await small.unary(ECHO, b"fits", timeout_s=TIMEOUT_S) == b"fits"
    finally:
        await small.close()


def test_calls_beyond_the_servers_stream_limit_wait_for_a_stream() -> None:
    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc, limits=Http2Limits(max_concurrent_streams=2))
        ch = Channel(f"{LOOPBACK}:{port}")
        try:
            calls = [asyncio.create_task(ch.unary(HELD, b"%d" % i, timeout_s=TIMEOUT_S)) for i in range(6)]
            await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
            await asyncio.sleep(0.2)
            assert svc.held == 2  # the other four wait on our side: none was refused
            svc.release.set()
            assert await asyncio.gather(*calls) == [b"%d" % i for i in range(6)]
            assert svc.most_held == 2
        finally:
            await ch.close()
            await server.shutdown(0.5)

    asyncio.run(main())


def test_pending_calls_are_bounded() -> None:
    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc)
        ch = Channel(f"{LOOPBACK}:{port}", max_pending_calls=2)
        try:
            held = [asyncio.create_task(ch.unary(HELD, b"h", timeout_s=TIMEOUT_S)) for _ in range(2)]
            await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
            with pytest.raises(RpcError) as refused:
                await ch.unary(ECHO, b"x", timeout_s=TIMEOUT_S)
            assert refused.value.code == StatusCode.RESOURCE_EXHAUSTED and not refused.value.sent
            svc.release.set()
            assert await asyncio.gather(*held) == [b"h", b"h"]
            assert await ch.unary(ECHO, b"x", timeout_s=TIMEOUT_S) == b"x"
        finally:
            await ch.close()
            await server.shutdown(0.5)

    asyncio.run(main())


def test_goaway_lets_calls_in_flight_finish_and_later_calls_use_a_new_connection() -> None:
    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc)
        ch = Channel(f"{LOOPBACK}:{port}", backoff_initial_s=0.1)
        try:
            in_flight = asyncio.create_task(ch.unary(HELD, b"kept", timeout_s=TIMEOUT_S))
            await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
            stopping = asyncio.create_task(server.shutdown(TIMEOUT_S))
            await asyncio.sleep(0.1)
            with pytest.raises(RpcError) as refused:  # the old connection takes no call; no server is listening
                await ch.unary(ECHO, b"x", timeout_s=TIMEOUT_S)
            assert refused.value.code == StatusCode.UNAVAILABLE and not refused.value.sent
            svc.release.set()
            assert await in_flight == b"kept"
            await stopping
            server, _ = await _ours(svc, port)  # back on the same port
            await asyncio.sleep(0.3)  # past the backoff
            assert await ch.unary(ECHO, b"new", timeout_s=TIMEOUT_S) == b"new"
        finally:
            await ch.close()
            await server.shutdown(0.5)

    asyncio.run(main())


def test_a_server_that_goes_away_fails_calls_and_the_channel_reconnects_after_its_backoff() -> None:
    async def main() -> None:
        svc = Service()
        port = free_port()
        server: Any = None
        ch = Channel(f"{LOOPBACK}:{port}", backoff_initial_s=0.5, backoff_max_s=1.0)
        try:
            with pytest.raises(RpcError) as nobody:
                await ch.unary(ECHO, b"x", timeout_s=TIMEOUT_S)
            assert nobody.value.code == StatusCode.UNAVAILABLE and "cannot connect" in nobody.value.message
            server, _ = await _aio(svc, port)
            with pytest.raises(RpcError) as backing_off:  # at once, without trying: in backoff
                await ch.unary(ECHO, b"x", timeout_s=TIMEOUT_S)
            assert "next attempt in" in backing_off.value.message
            await asyncio.sleep(0.7)
            assert await ch.unary(ECHO, b"up", timeout_s=TIMEOUT_S) == b"up"
            pending = asyncio.create_task(ch.unary(SLOW, b"x", timeout_s=TIMEOUT_S))
            await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
            await server.stop(None)
            with pytest.raises(RpcError) as gone:
                await pending
            assert gone.value.code in (StatusCode.UNAVAILABLE, StatusCode.CANCELLED)
        finally:
            await ch.close()
            if server is not None:
                await server.stop(None)

    asyncio.run(main())


def test_a_call_the_server_refused_is_made_again_on_a_new_connection() -> None:
    """A server that answers GOAWAY (last stream 0) to a connection's first request: the client was
    told the call was never seen, and makes it once more on a new connection, which serves it."""

    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc)
        front_port = free_port()
        connections = 0

        async def front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            if connections == 1:  # refuses: SETTINGS, then GOAWAY once the request arrives
                writer.write(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                await reader.read(1024)
                writer.write(b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + bytes(8))
                await writer.drain()
                writer.close()
                return
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, port)  # passes through

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        relay = await asyncio.start_server(front, LOOPBACK, front_port)
        ch = Channel(f"{LOOPBACK}:{front_port}")
        try:
            assert await ch.unary(ECHO, b"once", timeout_s=TIMEOUT_S) == b"once"
            assert connections == 2
        finally:
            await ch.close()
            relay.close()
            await server.shutdown(0.5)

    asyncio.run(main())


class _CuttableRelay:
    """A relay in front of our server whose first connection can be cut: bytes dropped both ways,
    sockets left open, as a host that dropped off the network."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cut = asyncio.Event()
        self.connections = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._front, LOOPBACK, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _front(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        mine = self.connections
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if not (self.cut.is_set() and mine == 1):
                    dst.write(data)
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)


def test_keepalive_keeps_a_quiet_connection_and_cuts_one_whose_server_went_silent() -> None:
    """A connection quiet for several keepalive intervals is kept (its PINGs answered); once cut, a
    call in flight fails with UNAVAILABLE from the keepalive long before its deadline, the channel
    backs off as after a failed connect (a new connection to a cut host would wait for its connect
    timeout), the channel's `on_silent` is told why, and after the backoff a call goes on a new
    connection."""

    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc)
        relay = _CuttableRelay(port)
        silences: list[str] = []
        ch = Channel(f"{LOOPBACK}:{await relay.start()}", keepalive_s=0.2, keepalive_timeout_s=0.2,
                     backoff_initial_s=0.3, on_silent=silences.append)  # fmt: skip
        try:
            assert await ch.unary(ECHO, b"a", timeout_s=TIMEOUT_S) == b"a"
            await asyncio.sleep(1.0)  # five intervals without a call: pinged, answered, kept
            assert await ch.unary(ECHO, b"b", timeout_s=TIMEOUT_S) == b"b"
            assert relay.connections == 1
            held = asyncio.create_task(ch.unary(HELD, b"h", timeout_s=TIMEOUT_S * 6))
            await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
            relay.cut.set()
            with pytest.raises(RpcError) as lost:
                await asyncio.wait_for(held, TIMEOUT_S)
            assert lost.value.code == StatusCode.UNAVAILABLE and "keepalive" in lost.value.message
            assert len(silences) == 1 and "keepalive" in silences[0]
            with pytest.raises(RpcError) as backing_off:
                await ch.unary(ECHO, b"c", timeout_s=TIMEOUT_S)
            assert backing_off.value.code == StatusCode.UNAVAILABLE and not backing_off.value.sent
            assert "next attempt in" in backing_off.value.message
            await asyncio.sleep(0.4)  # the backoff, jittered by a fifth
            assert await ch.unary(ECHO, b"c", timeout_s=TIMEOUT_S) == b"c"
            assert relay.connections == 2
        finally:
            svc.release.set()
            await ch.close()
            relay.server.close()
            await server.shutdown(0.5)

    asyncio.run(main())


def test_a_connection_with_calls_in_flight_is_pinged_sooner_than_an_idle_one() -> None:
    """Issue 43: a proxy's call to a broker whose host was cut must fail before the official
    client's own send timeout (3 s), so that its retry goes elsewhere. With calls in flight a
    connection is pinged after a quarter of `keepalive_s` of silence: keepalive 4 s, a call with a
    3 s deadline fails UNAVAILABLE from the keepalive (an idle-only PING would come after 4 s, and
    the call would end on its deadline instead)."""

    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc)
        relay = _CuttableRelay(port)
        ch = Channel(f"{LOOPBACK}:{await relay.start()}", keepalive_s=4.0, keepalive_timeout_s=0.3)
        try:
            assert await ch.unary(ECHO, b"a", timeout_s=TIMEOUT_S) == b"a"
            held = asyncio.create_task(ch.unary(HELD, b"h", timeout_s=3.0))
            await asyncio.wait_for(svc.started.wait(), TIMEOUT_S)
            relay.cut.set()
            with pytest.raises(RpcError) as lost:
                await asyncio.wait_for(held, TIMEOUT_S)
            assert lost.value.code == StatusCode.UNAVAILABLE and "keepalive" in lost.value.message
        finally:
            svc.release.set()
            await ch.close()
            relay.server.close()
            await server.shutdown(0.5)

    asyncio.run(main())


def test_closed_channels_refuse_calls() -> None:
    async def main() -> None:
        ch = Channel(f"{LOOPBACK}:{free_port()}")
        await ch.close()
        with pytest.raises(RpcError) as closed:
            await ch.unary(ECHO, b"x", timeout_s=TIMEOUT_S)
        assert closed.value.code == StatusCode.UNAVAILABLE and "closed" in closed.value.message

    asyncio.run(main())


def test_tls_with_alpn_h2(tmp_path: Path) -> None:
    self_signed(tmp_path)

    async def main() -> None:
        svc = Service()
        server, port = await _ours(svc, tls=tmp_path)
        ch = Channel(f"{LOOPBACK}:{port}", ssl_context=client_ssl_context(str(tmp_path / "cert.pem")))
        try:
            assert await ch.unary(ECHO, b"secret", timeout_s=TIMEOUT_S) == b"secret"
        finally:
            await ch.close()
            await server.shutdown(0.5)

    asyncio.run(main())
