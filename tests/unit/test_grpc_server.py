"""Our gRPC server (common/http2/grpcserver.py) against the C-core client (grpcio) — the one the
official Python client uses — and our own client (common/http2/client.py): the three call kinds, metadata both ways,
status details, deadlines, cancellation, messages past every window, compression refused, HTTP
errors, TLS with ALPN h2, and a shutdown that finishes the calls in flight."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.http2.client import Channel, RpcError
from common.http2.grpcserver import Call, GrpcError, GrpcLimits, GrpcServer, Kind, StatusCode, server_ssl_context
from common.http2.limits import Http2Limits
from tests.helpers import h2raw as h
from tests.helpers.procs import LOOPBACK
from tests.helpers.tls import self_signed

MIB = 1 << 20
TIMEOUT_S = 10.0


class Service:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.slow_started = threading.Event()  # read by client threads
        self.release = asyncio.Event()
        self.held_started = asyncio.Event()
        self.seen: dict[str, Any] = {}

    async def echo(self, request: bytes, call: Call) -> bytes:
        self.seen.setdefault("md", call.invocation_metadata())  # the first call's
        self.seen.setdefault("remaining", call.time_remaining())
        self.seen.setdefault("peer", call.peer())
        call.initial_metadata.append(("x-served-by", "test"))
        return request

    async def fail(self, request: bytes, call: Call) -> bytes:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "bad: ✓ 100%", details=b"\x08\x03",
                        trailing=(("x-why", "because"),))  # fmt: skip

    async def slow(self, request: bytes, call: Call) -> bytes:
        self.slow_started.set()
        try:
            await asyncio.sleep(TIMEOUT_S)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return request

    async def held(self, request: bytes, call: Call) -> bytes:
        self.held_started.set()
        await self.release.wait()
        return request

    async def stream(self, request: bytes, call: Call) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield b"%d:" % i + b"x" * 1000

    async def chat(self, requests: AsyncIterator[bytes], call: Call) -> AsyncIterator[bytes]:
        async for r in requests:
            yield r[::-1]


def run(test: Callable[[GrpcServer, str, Service], Awaitable[None]], *, tls: Path | None = None) -> None:
    async def main() -> None:
        server = GrpcServer(GrpcLimits(max_message_bytes=6 * MIB), Http2Limits())
        svc = Service()
        methods: list[tuple[str, Kind, Any]] = [
            ("Echo", Kind.UNARY, svc.echo), ("Fail", Kind.UNARY, svc.fail), ("Slow", Kind.UNARY, svc.slow),
            ("Held", Kind.UNARY, svc.held), ("Stream", Kind.SERVER_STREAMING, svc.stream),
            ("Chat", Kind.BIDI, svc.chat),
        ]  # fmt: skip
        for name, kind, fn in methods:
            server.add(f"/t.T/{name}", kind, fn)
        ctx = None if tls is None else server_ssl_context(str(tls / "cert.pem"), str(tls / "key.pem"))
        port = await server.listen(LOOPBACK, 0, ssl_context=ctx)
        try:
            await test(server, f"{LOOPBACK}:{port}", svc)
        finally:
            svc.release.set()
            await server.shutdown(1.0)

    asyncio.run(main())


def channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1),
                                                  ("grpc.max_receive_message_length", -1)])  # fmt: skip


def test_unary_metadata_both_ways_and_messages_past_the_windows() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        def client() -> tuple[bytes, Any, bytes]:
            with channel(target) as ch:
                reply, call = ch.unary_unary("/t.T/Echo").with_call(
                    b"hello", timeout=TIMEOUT_S, metadata=[("x-a", "1"), ("x-b-bin", b"\x00\xff")]
                )
                big = bytes(range(256)) * (5 * MIB // 256)  # 4 MiB bodies and more: 80x the 64 KiB windows
                assert ch.unary_unary("/t.T/Echo")(big, timeout=TIMEOUT_S) == big
                return reply, call.initial_metadata(), big  # fmt: skip

        reply, initial, _ = await asyncio.to_thread(client)
        assert reply == b"hello"
        assert ("x-served-by", "test") in list(initial)
        assert ("x-a", "1") in svc.seen["md"] and ("x-b-bin", b"\x00\xff") in svc.seen["md"]
        assert 0 < svc.seen["remaining"] <= TIMEOUT_S
        assert svc.seen["peer"].startswith("ipv4:127.0.0.1:")

    run(test)


def test_errors_details_trailing_metadata_unknown_methods_and_oversize_requests() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        def client() -> list[tuple[grpc.StatusCode, str, Any]]:
            out = []
            with channel(target) as ch:
                for path, body in [("/t.T/Fail", b"x"), ("/t.T/Nope", b"x"), ("/t.T/Echo", b"x" * (7 * MIB))]:
                    with pytest.raises(grpc.RpcError) as failed:
                        ch.unary_unary(path)(body, timeout=TIMEOUT_S)
                    e: Any = failed.value
                    out.append((e.code(), e.details(), e.trailing_metadata()))
                assert ch.unary_unary("/t.T/Echo")(b"after", timeout=TIMEOUT_S) == b"after"
            return out

        fail, unknown, big = await asyncio.to_thread(client)
        assert fail[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "bad: ✓ 100%")
        assert ("x-why", "because") in list(fail[2]) and ("grpc-status-details-bin", b"\x08\x03") in list(fail[2])
        assert unknown[0] == grpc.StatusCode.UNIMPLEMENTED
        assert big[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "exceeds the limit" in big[1]

    run(test)


def test_deadlines_and_client_cancellation_cancel_the_handler() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        def late() -> grpc.StatusCode:
            with channel(target) as ch, pytest.raises(grpc.RpcError) as failed:
                ch.unary_unary("/t.T/Slow")(b"x", timeout=0.3)
            return failed.value.code()  # type: ignore[attr-defined,no-any-return]

        assert await asyncio.to_thread(late) == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(svc.cancelled.wait(), TIMEOUT_S)
        svc.cancelled.clear()
        svc.slow_started.clear()

        def cancel() -> None:
            with channel(target) as ch:
                future = ch.unary_unary("/t.T/Slow").future(b"x", timeout=TIMEOUT_S)
                assert svc.slow_started.wait(TIMEOUT_S)
                future.cancel()  # RST_STREAM CANCEL

        await asyncio.to_thread(cancel)
        await asyncio.wait_for(svc.cancelled.wait(), TIMEOUT_S)

    run(test)


def test_server_streaming_and_bidirectional_calls() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        def client() -> tuple[list[bytes], list[bytes]]:
            with channel(target) as ch:
                streamed = list(ch.unary_stream("/t.T/Stream")(b"500", timeout=TIMEOUT_S))
                sent = [b"abc", b"x" * (2 * MIB), b"def"]
                chat = list(ch.stream_stream("/t.T/Chat")(iter(sent), timeout=TIMEOUT_S))
                return streamed, chat

        streamed, chat = await asyncio.to_thread(client)
        assert [m.split(b":")[0] for m in streamed] == [b"%d" % i for i in range(500)]
        assert chat == [b"cba", b"x" * (2 * MIB), b"fed"]

    run(test)


def test_compressed_requests_are_refused_as_unimplemented() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        def client() -> tuple[grpc.StatusCode, str]:
            with grpc.insecure_channel(target, compression=grpc.Compression.Gzip) as ch:
                with pytest.raises(grpc.RpcError) as failed:
                    ch.unary_unary("/t.T/Echo")(b"y" * 1000, timeout=TIMEOUT_S)
                e: Any = failed.value
                return e.code(), e.details()

        code, details = await asyncio.to_thread(client)
        assert code == grpc.StatusCode.UNIMPLEMENTED and "uncompressed" in details

    run(test)


def test_http_errors_for_what_is_not_a_grpc_call() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        host, port = target.rsplit(":", 1)
        client = await h.RawClient.connect(host, int(port))
        get = client.headers_block("/t.T/Echo", method="GET")
        client.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 1, get))
        fields, _ = await client.response(1)
        assert (":status", "405") in fields
        block = client.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/t.T/Echo"),
                                       ("content-type", "text/plain")])  # fmt: skip
        client.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 3, block))
        fields, _ = await client.response(3)
        assert (":status", "415") in fields
        client.request(5, "/t.T/Echo", b"x", ("grpc-timeout", "forever"))
        fields, _ = await client.response(5)
        assert ("grpc-status", "13") in fields
        client.close()

    run(test)


def test_our_client_shares_the_codec_and_talks_to_the_server() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        ch = Channel(target)
        assert await ch.unary("/t.T/Echo", b"hi", timeout_s=TIMEOUT_S) == b"hi"
        assert len(await ch.server_stream("/t.T/Stream", b"50", timeout_s=TIMEOUT_S)) == 50
        await ch.close()

    run(test)


def test_shutdown_finishes_calls_in_flight_and_refuses_new_ones() -> None:
    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        ch = Channel(target)
        in_flight = asyncio.create_task(ch.unary("/t.T/Held", b"kept", timeout_s=TIMEOUT_S))
        await asyncio.wait_for(svc.held_started.wait(), TIMEOUT_S)
        stopping = asyncio.create_task(server.shutdown(TIMEOUT_S))
        await asyncio.sleep(0.1)
        with pytest.raises(RpcError) as refused:  # told at once: the connection takes no new call
            await ch.unary("/t.T/Echo", b"x", timeout_s=TIMEOUT_S)
        assert refused.value.code == StatusCode.UNAVAILABLE
        svc.release.set()
        assert await in_flight == b"kept"
        await stopping
        await ch.close()

    run(test)


def test_tls_with_alpn_h2(tmp_path: Path) -> None:
    self_signed(tmp_path)

    async def test(server: GrpcServer, target: str, svc: Service) -> None:
        def client() -> bytes:
            creds = grpc.ssl_channel_credentials((tmp_path / "cert.pem").read_bytes())
            with grpc.secure_channel(target, creds) as ch:
                return ch.unary_unary("/t.T/Echo")(b"secret", timeout=TIMEOUT_S)  # type: ignore[no-any-return]

        assert await asyncio.to_thread(client) == b"secret"

    run(test, tls=tmp_path)
