"""`common.httpserver` driven with raw bytes over loopback: routing, malformed input, limits, keep-alive.

Each test starts a server on 127.0.0.1 port 0 inside its own event loop and talks to it with
asyncio streams, so any byte sequence can be sent. Every read has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from common.httpserver import (
    HttpError,
    HttpLimits,
    HttpServer,
    Request,
    Response,
    Routes,
    json_response,
    serve_http,
    text_response,
)

HOST = "127.0.0.1"
READ_TIMEOUT_S = 5.0


@pytest.fixture(autouse=True)
def no_connection_crash(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Malformed input must be answered on purpose, never reach the server's catch-all."""
    with caplog.at_level(logging.ERROR, logger="sluice.http"):
        yield
    crashes = [r.getMessage() for r in caplog.records if "connection from" in r.getMessage()]
    assert not crashes, crashes


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Seen:
    requests: list[Request] = field(default_factory=list)


def make_routes(seen: Seen) -> Routes:
    async def echo(request: Request) -> Response:
        seen.requests.append(request)
        return json_response({"path": request.path, "query": dict(request.query), "body": request.body.decode()})

    async def hello(request: Request) -> Response:
        return text_response("hello")

    async def boom(request: Request) -> Response:
        raise RuntimeError("handler bug")

    async def teapot(request: Request) -> Response:
        raise HttpError(418, "short and stout")

    async def slow(request: Request) -> Response:
        await asyncio.sleep(float(request.query.get("s", "10")))
        return text_response("late")

    async def bad_header(request: Request) -> Response:
        return Response(200, headers=(("X-Evil", "a\r\nSet-Cookie: x"),))

    return {
        ("GET", "/echo"): echo,
        ("POST", "/echo"): echo,
        ("GET", "/hello"): hello,
        ("GET", "/boom"): boom,
        ("GET", "/teapot"): teapot,
        ("GET", "/slow"): slow,
        ("GET", "/bad-header"): bad_header,
    }


def run(body: Callable[[HttpServer, Seen], Awaitable[None]], limits: HttpLimits | None = None) -> Seen:
    seen = Seen()

    async def main() -> None:
        server = HttpServer(make_routes(seen), limits=limits)
        await server.start(HOST, 0)
        try:
            await body(server, seen)
        finally:
            await server.close(grace_s=1.0)

    asyncio.run(main())
    return seen


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, server: HttpServer) -> Conn:
        return cls(*await asyncio.open_connection(HOST, server.port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, *, head_only: bool = False) -> Answer:
        async with asyncio.timeout(READ_TIMEOUT_S):
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            length = 0 if head_only else int(headers.get("content-length", "0"))
            body = await self.reader.readexactly(length)
        return Answer(int(status_line.split(" ")[1]), headers, body)

    async def closed_by_server(self) -> bool:
        async with asyncio.timeout(READ_TIMEOUT_S):
            return await self.reader.read(1) == b""

    async def close(self) -> None:
        self.writer.close()


async def ask(server: HttpServer, raw: bytes) -> tuple[Answer, bool]:
    """Send raw bytes on a new connection; the answer and whether the server then closed."""
    conn = await Conn.open(server)
    try:
        await conn.send(raw)
        answer = await conn.answer()
        return answer, await conn.closed_by_server()
    finally:
        await conn.close()


def get(path: str, *headers: str, version: str = "HTTP/1.1") -> bytes:
    lines = [f"GET {path} {version}", "Host: x", *headers, "Connection: close", "", ""]
    return "\r\n".join(lines).encode()


# -- routing ------------------------------------------------------------------------------------


def test_routing_query_headers_and_errors() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, _ = await ask(server, get("/echo?a=1&b=x%20y&empty=", "X-Thing: Value"))
        assert answer.status == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"path": "/echo", "query": {"a": "1", "b": "x y", "empty": ""}, "body": ""}
        assert seen.requests[-1].headers["x-thing"] == "Value"
        assert seen.requests[-1].remote.startswith("127.0.0.1:")
        answer, _ = await ask(server, get("/nope"))
        assert (answer.status, answer.json()) == (404, {"error": "no such path: /nope"})
        answer, _ = await ask(server, b"DELETE /hello HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert (answer.status, answer.headers["allow"]) == (405, "GET, HEAD")
        answer, _ = await ask(server, get("/boom"))
        assert (answer.status, answer.json()) == (500, {"error": "internal error"})
        answer, _ = await ask(server, get("/teapot"))
        assert (answer.status, answer.json()) == (418, {"error": "short and stout"})
        answer, _ = await ask(server, get("/bad-header"))
        assert answer.status == 500
        answer, _ = await ask(server, get("http://x/echo?z=1"))  # absolute-form target
        assert answer.json() == {"path": "/echo", "query": {"z": "1"}, "body": ""}

    run(body)


def test_head_has_length_but_no_body() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        await conn.send(b"HEAD /hello HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n")
        head = await conn.answer(head_only=True)
        assert (head.status, head.headers["content-length"], head.body) == (200, "5", b"")
        # The next answer starts right after the head: no body bytes were sent for HEAD.
        assert (await conn.answer()).body == b"hello"
        await conn.close()

    run(body)


def test_post_body_and_expect_continue() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, _ = await ask(server, b"POST /echo HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        assert answer.json() == {"path": "/echo", "query": {}, "body": "hello"}
        conn = await Conn.open(server)
        await conn.send(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        async with asyncio.timeout(READ_TIMEOUT_S):
            assert await conn.reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        await conn.send(b"ok")
        assert (await conn.answer()).json() == {"path": "/echo", "query": {}, "body": "ok"}
        await conn.close()

    run(body)


# -- malformed input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"garbage\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),
        (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\n\r\n", 400),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTX/1.1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET /hello HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\nExpect: magic\r\n\r\nx", 417),
        (b"\r\n" * 10 + b"GET /hello HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_malformed_requests_get_an_answer_and_a_closed_connection(raw: bytes, status: int) -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, raw)
        assert answer.status == status
        assert answer.headers["connection"] == "close" and closed
        assert "error" in answer.json()
        # The server is unharmed.
        answer, _ = await ask(server, get("/hello"))
        assert answer.body == b"hello"

    run(body)


@pytest.mark.parametrize(
    "target",
    ["/echo?a=1&a=2", "/echo?a=%ff", "/echo%00", "/%ff", "nopath", "*"],
)
def test_bad_target_is_400_and_keeps_the_connection(target: str) -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        await conn.send(f"GET {target} HTTP/1.1\r\n\r\n".encode())
        answer = await conn.answer()
        assert (answer.status, answer.headers["connection"]) == (400, "keep-alive")
        await conn.send(get("/hello"))
        assert (await conn.answer()).body == b"hello"
        await conn.close()

    run(body)


def test_bare_lf_and_leading_empty_line_are_accepted() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, _ = await ask(server, b"\r\nGET /hello HTTP/1.1\nConnection: close\n\n")
        assert answer.body == b"hello"

    run(body)


def test_client_that_hangs_up_mid_request_is_harmless() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        for partial in (
            b"GET /hel",
            b"GET /hello HTTP/1.1\r\nA: b",
            b"POST /echo HTTP/1.1\r\nContent-Length: 9\r\n\r\nab",
        ):
            conn = await Conn.open(server)
            await conn.send(partial)
            await conn.close()
        await asyncio.sleep(0.05)
        answer, _ = await ask(server, get("/hello"))
        assert answer.body == b"hello"

    run(body)


# -- limits -------------------------------------------------------------------------------------

SMALL = HttpLimits(
    max_request_line_bytes=64,
    max_header_bytes=128,
    max_headers=4,
    max_body_bytes=10,
    max_query_params=3,
)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /" + b"a" * 100 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /" + b"a" * 1000 + b" HTTP/1.1\r\n\r\n", 414),  # beyond the stream buffer as well
        (b"GET /hello HTTP/1.1\r\nX: " + b"v" * 200 + b"\r\n\r\n", 431),
        (b"GET /hello HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(5)) + b"\r\n", 431),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 11\r\n\r\n" + b"x" * 11, 413),
    ],
)
def test_over_limit_requests_are_refused(raw: bytes, status: int) -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, raw)
        assert (answer.status, closed) == (status, True)
        assert seen.requests == []

    run(body, SMALL)


def test_within_limits_is_served_and_too_many_params_is_400() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, _ = await ask(
            server, b"POST /echo?a=1&b=2&c=3 HTTP/1.1\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789"
        )
        assert answer.status == 200
        answer, _ = await ask(server, get("/echo?a=1&b=2&c=3&d=4"))
        assert answer.status == 400

    run(body, SMALL)


def test_too_many_connections_get_503() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        first = await Conn.open(server)
        await first.send(b"GET /hello HTTP/1.1\r\n\r\n")
        assert (await first.answer()).status == 200  # first connection is held open (keep-alive)
        answer, closed = await ask(server, get("/hello"))
        assert (answer.status, closed) == (503, True)
        await first.close()
        await asyncio.sleep(0.1)
        answer, _ = await ask(server, get("/hello"))
        assert answer.status == 200

    run(body, HttpLimits(max_connections=1))


def test_timeouts_idle_slow_request_and_slow_handler() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        idle = await Conn.open(server)
        assert await idle.closed_by_server()  # nothing sent: closed after idle_timeout_s, no answer
        slow = await Conn.open(server)
        await slow.send(b"GET /hello HTTP/1.1\r\nX: a\r\n")  # headers never finished
        answer = await slow.answer()
        assert answer.status == 408 and await slow.closed_by_server()
        answer, _ = await ask(server, get("/slow?s=5"))
        assert answer.status == 503

    run(body, HttpLimits(idle_timeout_s=0.2, request_timeout_s=0.2, handler_timeout_s=0.2))


# -- keep-alive ---------------------------------------------------------------------------------


def test_keep_alive_and_pipelining() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        for _ in range(3):
            await conn.send(b"GET /hello HTTP/1.1\r\n\r\n")
            answer = await conn.answer()
            assert (answer.body, answer.headers["connection"]) == (b"hello", "keep-alive")
        await conn.send(b"GET /echo?n=1 HTTP/1.1\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert (await conn.answer()).json()["query"] == {"n": "1"}
        last = await conn.answer()
        assert last.json()["query"] == {"n": "2"}
        assert last.headers["connection"] == "close" and await conn.closed_by_server()

    run(body)


def test_http10_closes_unless_asked_and_keep_alive_can_be_disabled() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, b"GET /hello HTTP/1.0\r\n\r\n")
        assert (answer.headers["connection"], closed) == ("close", True)
        conn = await Conn.open(server)
        await conn.send(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert (await conn.answer()).headers["connection"] == "keep-alive"
        await conn.close()

    run(body)

    async def disabled(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, b"GET /hello HTTP/1.1\r\n\r\n")
        assert (answer.headers["connection"], closed) == ("close", True)

    run(disabled, HttpLimits(keep_alive=False))


def test_max_requests_per_connection() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        await conn.send(b"GET /hello HTTP/1.1\r\n\r\n" * 2)
        assert (await conn.answer()).headers["connection"] == "keep-alive"
        assert (await conn.answer()).headers["connection"] == "close"
        assert await conn.closed_by_server()

    run(body, HttpLimits(max_requests_per_connection=2))


# -- lifecycle ----------------------------------------------------------------------------------


def test_close_ends_idle_connections_and_lets_a_request_finish() -> None:
    async def main() -> None:
        server = HttpServer(make_routes(Seen()))
        await server.start(HOST, 0)
        idle = await Conn.open(server)
        busy = await Conn.open(server)
        await busy.send(b"GET /slow?s=0.3 HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.1)
        await server.close(grace_s=5.0)
        answer = await busy.answer()
        assert (answer.body, answer.headers["connection"]) == (b"late", "close")
        assert await idle.closed_by_server()
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, server.port)

    asyncio.run(main())


def test_close_cancels_requests_past_the_grace() -> None:
    async def main() -> None:
        server = HttpServer(make_routes(Seen()))
        await server.start(HOST, 0)
        busy = await Conn.open(server)
        await busy.send(b"GET /slow?s=10 HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.1)
        async with asyncio.timeout(3):
            await server.close(grace_s=0.1)
        assert await busy.closed_by_server()

    asyncio.run(main())


def test_serve_http_reports_port_and_stops() -> None:
    async def main() -> None:
        stop = asyncio.Event()
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve_http(make_routes(Seen()), HOST, 0, stop, on_ready=ready.set_result))
        async with asyncio.timeout(READ_TIMEOUT_S):
            port = await ready
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(get("/hello"))
        async with asyncio.timeout(READ_TIMEOUT_S):
            assert (await reader.read()).endswith(b"\r\n\r\nhello")
        writer.close()
        stop.set()
        async with asyncio.timeout(READ_TIMEOUT_S):
            await task

    asyncio.run(main())


def test_bind_failure_raises_oserror() -> None:
    async def main() -> None:
        first = HttpServer({})
        port = await first.start(HOST, 0)
        try:
            with pytest.raises(OSError):
                await HttpServer({}).start(HOST, port)
        finally:
            await first.close()

    asyncio.run(main())


def test_limits_refuse_nonsense() -> None:
    for bad in ({"max_headers": 0}, {"max_body_bytes": -1}, {"idle_timeout_s": 0}):
        with pytest.raises(ValueError):
            HttpLimits(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Response(200, headers=(("Content-Length", "1"),))
    with pytest.raises(ValueError):
        Response(99)
