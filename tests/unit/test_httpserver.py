"""`common.httpserver` (aiohttp plus Sluice's middlewares) driven with raw bytes over loopback.

Each test starts a server on 127.0.0.1 port 0 inside its own event loop and talks to it with
asyncio streams, so any byte sequence can be sent. Every read has a timeout. aiohttp's own parser
is not retested here; these check what Sluice adds and relies on: JSON errors, query rules, limits,
keep-alive, and a graceful close.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.web import Request, StreamResponse

from common.httplimits import HttpLimits
from common.httpserver import HttpError, HttpServer, Routes, json_response, serve_http, text_response

HOST = "127.0.0.1"
READ_TIMEOUT_S = 5.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Seen:
    requests: list[tuple[dict[str, str], str]] = field(default_factory=list)  # (headers, remote)


def make_routes(seen: Seen) -> Routes:
    async def echo(request: Request) -> StreamResponse:
        seen.requests.append(({k.lower(): v for k, v in request.headers.items()}, request.remote or ""))
        body = (await request.read()).decode()
        return json_response({"path": request.path, "query": dict(request.query), "body": body})

    async def hello(request: Request) -> StreamResponse:
        return text_response("hello")

    async def boom(request: Request) -> StreamResponse:
        raise RuntimeError("handler bug")

    async def teapot(request: Request) -> StreamResponse:
        raise HttpError(418, "short and stout", (("X-Why", "tea"),))

    async def slow(request: Request) -> StreamResponse:
        await asyncio.sleep(float(request.query.get("s", "10")))
        return text_response("late")

    return {
        ("GET", "/echo"): echo,
        ("POST", "/echo"): echo,
        ("GET", "/hello"): hello,
        ("GET", "/boom"): boom,
        ("GET", "/teapot"): teapot,
        ("GET", "/slow"): slow,
    }


def run(body: Callable[[HttpServer, Seen], Awaitable[None]], limits: HttpLimits | None = None) -> Seen:
    seen = Seen()

    async def main() -> None:
        server = HttpServer(make_routes(seen), limits=limits, grace_s=1.0)
        await server.start(HOST, 0)
        try:
            await body(server, seen)
        finally:
            await server.close()

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
            try:
                return await self.reader.read(1) == b""
            except ConnectionResetError:
                return True

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


# -- routing and errors -------------------------------------------------------------------------


def test_routing_query_headers_and_json_errors() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, _ = await ask(server, get("/echo?a=1&b=x%20y&empty=", "X-Thing: Value"))
        assert answer.status == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"path": "/echo", "query": {"a": "1", "b": "x y", "empty": ""}, "body": ""}
        assert seen.requests[-1][0]["x-thing"] == "Value"
        assert seen.requests[-1][1] == "127.0.0.1"
        answer, _ = await ask(server, get("/hello"))
        assert (answer.headers["content-type"], answer.body) == ("text/plain; charset=utf-8", b"hello")
        answer, _ = await ask(server, get("/nope"))
        assert (answer.status, answer.json()) == (404, {"error": "no such path"})
        answer, _ = await ask(server, b"DELETE /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (answer.status, answer.json()) == (405, {"error": "method DELETE not allowed"})
        assert sorted(answer.headers["allow"].split(",")) == ["GET", "HEAD"]
        answer, _ = await ask(server, get("/boom"))
        assert (answer.status, answer.json()) == (500, {"error": "internal error"})
        answer, _ = await ask(server, get("/teapot"))
        assert (answer.status, answer.json(), answer.headers["x-why"]) == (418, {"error": "short and stout"}, "tea")

    run(body)


def test_head_has_length_but_no_body() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        await conn.send(b"HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await conn.answer(head_only=True)
        assert (head.status, head.headers["content-length"], head.body) == (200, "5", b"")
        # The next answer starts right after the head: no body bytes were sent for HEAD.
        assert (await conn.answer()).body == b"hello"
        await conn.close()

    run(body)


def test_post_body() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
        answer, _ = await ask(server, raw)
        assert answer.json() == {"path": "/echo", "query": {}, "body": "hello"}

    run(body)


@pytest.mark.parametrize("target", ["/echo?a=1&a=2", "/echo?a=1&b=2&c=3&d=4"])
def test_bad_query_is_400_and_keeps_the_connection(target: str) -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        await conn.send(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = await conn.answer()
        assert answer.status == 400 and "error" in answer.json()
        await conn.send(get("/hello"))
        assert (await conn.answer()).body == b"hello"
        await conn.close()
        assert seen.requests == []

    run(body, HttpLimits(max_query_params=3))


@pytest.mark.parametrize(
    "raw",
    [
        b"garbage\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    ],
)
def test_malformed_requests_get_400_and_a_closed_connection(raw: bytes) -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, raw)
        assert (answer.status, closed) == (400, True)
        answer, _ = await ask(server, get("/hello"))  # the server is unharmed
        assert answer.body == b"hello"

    run(body)


def test_client_that_hangs_up_mid_request_is_harmless() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        for partial in (
            b"GET /hel",
            b"GET /hello HTTP/1.1\r\nHost: x\r\nA: b",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab",
        ):
            conn = await Conn.open(server)
            await conn.send(partial)
            await conn.close()
        await asyncio.sleep(0.05)
        answer, _ = await ask(server, get("/hello"))
        assert answer.body == b"hello"

    run(body)


# -- limits -------------------------------------------------------------------------------------

SMALL = HttpLimits(max_request_line_bytes=64, max_header_bytes=128, max_headers=4, max_body_bytes=10)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /" + b"a" * 100 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\nX: " + b"v" * 200 + b"\r\n\r\n", 400),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(5)) + b"\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nConnection: close\r\n\r\n" + b"x" * 11, 413),
    ],
)
def test_over_limit_requests_are_refused(raw: bytes, status: int) -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, raw)
        assert (answer.status, closed) == (status, True)
        answer, _ = await ask(
            server, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789"
        )
        assert answer.json()["body"] == "0123456789"  # within the limits is served

    run(body, SMALL)


def test_too_many_connections_get_503() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        first = await Conn.open(server)
        await first.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await first.answer()).status == 200  # first connection is held open (keep-alive)
        answer, closed = await ask(server, get("/hello"))
        assert (answer.status, closed) == (503, True)
        await first.close()
        await asyncio.sleep(0.1)
        answer, _ = await ask(server, get("/hello"))
        assert answer.status == 200

    run(body, HttpLimits(max_connections=1))


def test_idle_connection_and_slow_handler_time_out() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        idle = await Conn.open(server)
        await idle.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await idle.answer()).status == 200
        assert await idle.closed_by_server()  # nothing more sent: closed after idle_timeout_s
        answer, _ = await ask(server, get("/slow?s=5"))
        assert (answer.status, answer.json()) == (503, {"error": "the request took too long; retry later"})

    run(body, HttpLimits(idle_timeout_s=0.2, handler_timeout_s=0.2))


# -- keep-alive ---------------------------------------------------------------------------------


def test_keep_alive_and_pipelining() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        conn = await Conn.open(server)
        for _ in range(3):
            await conn.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await conn.answer()
            assert answer.body == b"hello" and answer.headers.get("connection", "keep-alive") == "keep-alive"
        await conn.send(
            b"GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert (await conn.answer()).json()["query"] == {"n": "1"}
        last = await conn.answer()
        assert last.json()["query"] == {"n": "2"}
        assert await conn.closed_by_server()

    run(body)


def test_http10_closes_unless_asked_and_keep_alive_can_be_disabled() -> None:
    async def body(server: HttpServer, seen: Seen) -> None:
        _, closed = await ask(server, b"GET /hello HTTP/1.0\r\n\r\n")
        assert closed
        conn = await Conn.open(server)
        await conn.send(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert (await conn.answer()).headers["connection"].lower() == "keep-alive"
        await conn.close()

    run(body)

    async def disabled(server: HttpServer, seen: Seen) -> None:
        answer, closed = await ask(server, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (answer.headers["connection"].lower(), closed) == ("close", True)

    run(disabled, HttpLimits(keep_alive=False))


# -- lifecycle ----------------------------------------------------------------------------------


def test_close_ends_idle_connections_and_lets_a_request_finish() -> None:
    async def main() -> None:
        server = HttpServer(make_routes(Seen()), grace_s=5.0)
        await server.start(HOST, 0)
        idle = await Conn.open(server)
        busy = await Conn.open(server)
        await busy.send(b"GET /slow?s=0.3 HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.1)
        await server.close()
        assert (await busy.answer()).body == b"late"
        assert await idle.closed_by_server()
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, server.port)

    asyncio.run(main())


def test_close_cancels_requests_past_the_grace() -> None:
    async def main() -> None:
        server = HttpServer(make_routes(Seen()), grace_s=0.1)
        await server.start(HOST, 0)
        busy = await Conn.open(server)
        await busy.send(b"GET /slow?s=10 HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.1)
        async with asyncio.timeout(3):
            await server.close()
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
    for bad in ({"max_headers": 0}, {"max_body_bytes": -1}, {"idle_timeout_s": 0}, {"max_connections": 0}):
        with pytest.raises(ValueError):
            HttpLimits(**bad)  # type: ignore[arg-type]
