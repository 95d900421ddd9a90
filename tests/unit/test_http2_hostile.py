"""Hostile clients against our HTTP/2 server (common/http2/server.py), each bounded and answered with
a clear code while another client's calls go on: rapid reset (CVE-2023-44487), CONTINUATION floods,
an HPACK bomb, SETTINGS / PING / empty DATA floods, oversize frames, a client that stops reading,
idle connections and ones that never speak HTTP/2. Small limits make each attack short."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from common.http2.grpcserver import Call, GrpcLimits, GrpcServer, Kind
from common.http2.limits import Http2Limits
from tests.helpers import h2raw as h
from tests.helpers.procs import LOOPBACK

ECHO, HELD = "/t.T/Echo", "/t.T/Held"
POLL_S = 0.01
LIMITS = Http2Limits(abuse_burst=50, abuse_per_s=1.0, max_concurrent_streams=8, max_header_frames=4,
                     max_header_list_bytes=4096, handshake_timeout_s=0.3, idle_timeout_s=0.3,
                     write_stall_s=0.3, max_granted_bytes=2 << 20)  # fmt: skip


class Held:
    """A method whose work ignores cancellation until released (what a reset cannot stop at once)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0

    async def __call__(self, request: bytes, call: Call) -> bytes:
        self.running += 1
        try:
            await asyncio.shield(self.release.wait())
        finally:
            self.running -= 1
        return request


def run(test: Callable[[GrpcServer, int, Held], Awaitable[None]], limits: Http2Limits = LIMITS) -> None:
    async def main() -> None:
        server = GrpcServer(GrpcLimits(max_message_bytes=8 << 20), limits)
        held = Held()

        async def echo(request: bytes, call: Call) -> bytes:
            return request

        server.add(ECHO, Kind.UNARY, echo)
        server.add(HELD, Kind.UNARY, held)
        port = await server.listen(LOOPBACK, 0)
        try:
            await test(server, port, held)
        finally:
            held.release.set()
            await server.shutdown(1.0)

    asyncio.run(main())


async def still_served(port: int) -> None:
    """Another client's call is answered."""
    other = await h.RawClient.connect(LOOPBACK, port)
    other.request(1, ECHO, b"fine")
    fields, data = await other.response(1)
    assert ("grpc-status", "0") in fields and data == h.grpc_message(b"fine")
    other.close()


async def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / POLL_S)):
        if condition():
            return
        await asyncio.sleep(POLL_S)
    raise AssertionError("the condition did not hold in time")


async def goaway_code(client: h.RawClient) -> int:
    got = await client.until(h.GOAWAY)
    assert got is not None, "closed without GOAWAY"
    assert await client.closed()
    return got.code


def test_rapid_reset_is_refused_and_reset_streams_count_until_their_work_ends() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        client = await h.RawClient.connect(LOOPBACK, port)
        for i in range(8):  # as many as allowed
            client.request(1 + 2 * i, HELD, b"x")
        await eventually(lambda: held.running == 8)
        for i in range(8):  # each reset; its work goes on (shielded)
            client.send(h.frame(h.RST_STREAM, 0, 1 + 2 * i, struct.pack(">I", h.CANCEL)))
        client.request(17, HELD, b"x")  # a ninth: the reset ones still count
        refused = await client.until(h.RST_STREAM, 17)
        assert refused is not None and refused.code == h.REFUSED_STREAM
        held.release.set()
        for i in range(100):  # the attack itself: open and reset, over and over
            sid = 19 + 2 * i
            client.request(sid, ECHO, None)
            client.send(h.frame(h.RST_STREAM, 0, sid, struct.pack(">I", h.CANCEL)))
        assert await goaway_code(client) == h.ENHANCE_YOUR_CALM
        await still_served(port)
        await eventually(lambda: server.connections == 0 and not held.running)

    run(test)


def test_continuation_floods_close_the_connection() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        client = await h.RawClient.connect(LOOPBACK, port)
        client.send(h.frame(h.HEADERS, 0, 1, client.headers_block(ECHO)))
        for _ in range(10):  # empty CONTINUATION frames without END_HEADERS (CVE-2024-27316 class)
            client.send(h.frame(h.CONTINUATION, 0, 1, b""))
        assert await goaway_code(client) == h.ENHANCE_YOUR_CALM
        client = await h.RawClient.connect(LOOPBACK, port)
        client.send(h.frame(h.HEADERS, 0, 1, b"\x00" * 3000) + h.frame(h.CONTINUATION, 0, 1, b"\x00" * 3000))
        assert await goaway_code(client) == h.ENHANCE_YOUR_CALM  # 6000 bytes of block > 4096
        await still_served(port)

    run(test)


def test_an_hpack_bomb_refuses_its_stream_and_the_connection_goes_on() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        client = await h.RawClient.connect(LOOPBACK, port)
        # One 3 KiB entry in the table (literal with incremental indexing), then a block referring
        # to it 60 times: ~190 KiB of headers from 60 bytes.
        name, value = b"x-bomb", b"b" * 3000
        insert = b"\x40" + bytes([len(name)]) + name + b"\x7f" + _int7(len(value) - 127) + value
        client.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 1, client.headers_block(ECHO) + insert))
        await client.response(1)
        bomb = client.headers_block(ECHO) + b"\xbe" * 60  # index 62: the newest entry
        client.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 3, bomb))
        fields, _ = await client.response(3)
        assert ("grpc-status", "8") in fields  # RESOURCE_EXHAUSTED
        assert any(n == "grpc-message" and "header list" in v for n, v in fields)
        client.encoder = type(client.encoder)()  # the server's table still holds the entry: new encoder,
        client.encoder.header_table_size = 4096  # same table size, indices from 62 up: still in step
        client.request(5, ECHO, b"after")
        fields, _ = await client.response(5)
        assert ("grpc-status", "0") in fields

    run(test)


def _int7(rest: int) -> bytes:
    out = bytearray()
    while rest >= 128:
        out.append((rest & 0x7F) | 0x80)
        rest >>= 7
    out.append(rest)
    return bytes(out)


def test_settings_ping_and_empty_data_floods_close_the_connection() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        floods = [
            h.settings((4, 65535)),
            h.frame(h.PING, 0, 0, b"\x00" * 8),
            h.frame(h.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
        ]
        for flood in floods:
            client = await h.RawClient.connect(LOOPBACK, port)
            client.send(flood * 200)
            assert await goaway_code(client) == h.ENHANCE_YOUR_CALM
        client = await h.RawClient.connect(LOOPBACK, port)
        client.request(1, ECHO, None)
        client.send(h.frame(h.DATA, 0, 1, b"") * 200)
        assert await goaway_code(client) == h.ENHANCE_YOUR_CALM
        await still_served(port)

    run(test)


def test_pings_between_requests_are_not_abuse() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        client = await h.RawClient.connect(LOOPBACK, port)
        for i in range(120):  # more than the burst, each with a call (as BDP probing clients do)
            client.send(h.frame(h.PING, 0, 0, b"\x00" * 8))
            client.request(1 + 2 * i, ECHO, b"x")
            fields, _ = await client.response(1 + 2 * i)
            assert ("grpc-status", "0") in fields

    run(test)


def test_a_client_that_stops_reading_is_disconnected() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        client = await h.RawClient.connect(LOOPBACK, port)
        client.send(h.settings((4, 0)))  # no stream window: the answer cannot be sent
        client.request(1, ECHO, b"x" * 100)
        assert await client.closed(timeout_s=5.0)
        await still_served(port)

    run(test)


def test_idle_and_silent_connections_are_closed() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        idle = await h.RawClient.connect(LOOPBACK, port)
        assert await goaway_code(idle) == h.NO_ERROR
        silent = await h.RawClient.connect(LOOPBACK, port, handshake=False)
        assert await silent.closed(timeout_s=5.0)

    run(test)


def test_large_requests_beyond_the_grant_budget_are_refused() -> None:
    async def test(server: GrpcServer, port: int, held: Held) -> None:
        client = await h.RawClient.connect(LOOPBACK, port)
        client.request(1, ECHO, None)
        client.send(h.frame(h.DATA, 0, 1, b"\x00" + struct.pack(">I", 3 << 20)))  # 3 MiB > the 2 MiB budget
        fields, _ = await client.response(1)
        assert ("grpc-status", "8") in fields
        client.request(3, ECHO, None)
        client.send(h.frame(h.DATA, 0, 3, b"\x00" + struct.pack(">I", 9 << 20)))  # over max_message_bytes
        fields, _ = await client.response(3)
        assert ("grpc-status", "8") in fields
        assert any(n == "grpc-message" and "exceeds the limit" in v for n, v in fields)
        await still_served(port)

    run(test)
