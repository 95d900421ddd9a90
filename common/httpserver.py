"""A small HTTP/1.1 server on asyncio streams for Sluice's plain-HTTP surfaces (stdlib only).

Used for navigation's endpoint API and, later, every process's `/metrics` and health endpoints.
Handlers are generic: `async def handler(request: Request) -> Response`, routed by exact
(method, path); a HEAD request is served by the GET handler without its body.

Contract:
- Every request is answered or its connection closed; malformed input never raises out of the
  server. Answers the server makes itself carry a JSON body `{"error": "..."}`:
  400 malformed request line, header, target or query (a repeated query key is malformed too),
  404 unknown path, 405 known path with another method (with `Allow`), 408 request not received
  within `request_timeout_s`, 413 body over `max_body_bytes`, 414 request line over
  `max_request_line_bytes`, 417 an `Expect` other than 100-continue, 431 header section over
  `max_header_bytes` or `max_headers`, 501 `Transfer-Encoding` (send `Content-Length`),
  505 an HTTP version other than 1.0/1.1, 503 over `max_connections` or a handler past
  `handler_timeout_s`, 500 a handler that raised (logged with its traceback).
  `HttpError(status, message)` raised by a handler becomes that status with the same JSON body.
- After an answer to a request whose framing cannot be trusted (400, 408, 413, 414, 417, 431,
  501, 505), the connection is closed; the server half-closes and discards what the peer still
  sends for a moment ("lingering close"), so the peer reads the answer instead of a reset.
- Keep-alive follows HTTP/1.1 (persistent unless `Connection: close`; HTTP/1.0 only with
  `Connection: keep-alive`), and is off entirely with `HttpLimits.keep_alive = False`. An idle
  connection is closed after `idle_timeout_s`, and after `max_requests_per_connection` requests.
- `HttpServer` owns every connection task: `close(grace_s)` stops listening, closes idle
  connections, lets requests in progress finish for up to `grace_s`, cancels the rest, and returns
  only when no connection task is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

log = logging.getLogger("sluice.http")

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_VERSION = re.compile(r"^HTTP/(\d)\.(\d)$")
_SUPPORTED_VERSIONS = ("HTTP/1.0", "HTTP/1.1")
_MAX_LEADING_EMPTY_LINES = 4
_LINGER_S = 0.5
_LINGER_BYTES = 64 * 1024
_SERVER_HEADERS = frozenset({"content-type", "content-length", "connection", "date", "server", "transfer-encoding"})


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds of one HTTP server. Units are last in every name."""

    max_request_line_bytes: int = 8 * 1024
    max_header_bytes: int = 16 * 1024  # all header lines together
    max_headers: int = 64
    max_body_bytes: int = 64 * 1024
    max_query_params: int = 32
    max_connections: int = 256
    max_requests_per_connection: int = 1000
    # A keep-alive connection may wait this long for the next request line.
    idle_timeout_s: float = 30.0
    # Headers and body of one request must arrive within this; also bounds writing the answer.
    request_timeout_s: float = 10.0
    handler_timeout_s: float = 30.0
    keep_alive: bool = True

    def __post_init__(self) -> None:
        for name in (
            "max_request_line_bytes",
            "max_header_bytes",
            "max_headers",
            "max_query_params",
            "max_connections",
            "max_requests_per_connection",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must not be negative, got {self.max_body_bytes}")
        for name in ("idle_timeout_s", "request_timeout_s", "handler_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request. Header names are lower-case; repeated headers are joined with ', '."""

    method: str
    path: str  # percent-decoded, without the query
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes = b""
    remote: str = ""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str = TEXT_TYPE
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # Handlers are our own code: a bad header is a bug, answered as 500, never sent.
        if not 200 <= self.status <= 599:
            raise ValueError(f"status {self.status} is not a final status")
        for name, value in (("Content-Type", self.content_type), *self.headers):
            if not _TOKEN.match(name) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"invalid response header {name!r}: {value!r}")
        for name, _ in self.headers:
            if name.lower() in _SERVER_HEADERS:
                raise ValueError(f"response header {name} is set by the server")


Handler = Callable[[Request], Awaitable[Response]]
Routes = Mapping[tuple[str, str], Handler]  # (method, path) -> handler


class HttpError(Exception):
    """Raised by a handler to answer `status` with a JSON error body."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def json_response(doc: Any, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return Response(status, JSON_TYPE, body, headers)


def text_response(text: str, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, TEXT_TYPE, text.encode(), headers)


def error_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return json_response({"error": message}, status, headers)


class _Reject(Exception):
    """A request the server answers itself (and, unless the target was at fault, closes after)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.response = error_response(status, message)


@dataclass(slots=True)
class _Connection:
    task: asyncio.Task[None]
    busy: bool = False  # between the first byte of a request and the end of its answer


@dataclass(slots=True)
class _Head:
    method: str
    target: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)


class HttpServer:
    """Serves `routes` on one listening address; use `async with` or `start()` / `close()`."""

    def __init__(self, routes: Routes, *, limits: HttpLimits | None = None, name: str = "http") -> None:
        self._routes = dict(routes)
        self._methods: dict[str, set[str]] = {}
        for method, path in self._routes:
            self._methods.setdefault(path, set()).add(method)
        self._limits = limits or HttpLimits()
        self._name = name
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._closing = False
        self._port = 0

    @property
    def port(self) -> int:
        """The bound port (the real one when started with port 0)."""
        return self._port

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on host:port; returns the bound port. Raises OSError if the address cannot be bound."""
        limit = max(self._limits.max_request_line_bytes, self._limits.max_header_bytes) + 2
        self._server = await asyncio.start_server(
            self._on_connection, host, port, limit=limit, reuse_port=reuse_port or None
        )
        sockets = self._server.sockets
        self._port = sockets[0].getsockname()[1] if sockets else port
        return self._port

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop listening and end every connection (see the module contract); idempotent."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections.values()):
            if not conn.busy:
                conn.task.cancel()
        pending = [c.task for c in self._connections.values()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.wait(pending)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> HttpServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- one connection -------------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs this callback as a task
        conn = _Connection(task)
        peer = writer.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        refuse = self._closing or len(self._connections) >= self._limits.max_connections
        self._connections[task] = conn  # refused ones too: close() waits for every connection task
        try:
            if refuse:
                conn.busy = True  # a short, bounded answer: let it finish
                await self._write(writer, error_response(503, "too many connections; retry later"), "GET", False)
                await _linger_close(reader, writer)
                return
            await self._serve(conn, reader, writer, remote)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the peer went away or stalled; nothing to answer
        except asyncio.CancelledError:
            pass  # close(): the server owns this task and ends it on purpose
        except Exception:
            log.exception("%s: connection from %s failed", self._name, remote)
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)

    async def _serve(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, remote: str
    ) -> None:
        limits = self._limits
        for served in range(1, limits.max_requests_per_connection + 1):
            conn.busy = False
            try:
                async with asyncio.timeout(limits.idle_timeout_s):
                    line = await self._request_line(reader)
                if line is None:
                    return  # clean end of a keep-alive connection
                conn.busy = True
                async with asyncio.timeout(limits.request_timeout_s):
                    head, body = await self._read_head_and_body(line, reader, writer)
            except TimeoutError:
                if conn.busy:
                    await self._write(writer, error_response(408, "request not received in time"), "GET", False)
                return  # an idle keep-alive connection (or a trickling request line) is just closed
            except _Reject as rejected:
                await self._write(writer, rejected.response, "GET", False)
                await _linger_close(reader, writer)
                return
            try:
                path, query = _parse_target(head.target, limits.max_query_params)
            except _Reject as rejected:
                response = rejected.response  # the whole request was read: the connection stays usable
            else:
                response = await self._dispatch(Request(head.method, path, query, head.headers, body, remote))
            # Decided after the handler: close() may have begun while it ran.
            keep_alive = (
                self._wants_keep_alive(head) and not self._closing and served < limits.max_requests_per_connection
            )
            await self._write(writer, response, head.method, keep_alive)
            if not keep_alive:
                return

    async def _request_line(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next request line, None at a clean EOF; raises _Reject when it is too long."""
        for _ in range(_MAX_LEADING_EMPTY_LINES + 1):
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial.strip():
                    raise  # a request cut short
                return None
            except asyncio.LimitOverrunError:
                raise _Reject(414, f"request line over {self._limits.max_request_line_bytes} bytes") from None
            if len(line) > self._limits.max_request_line_bytes + 2:
                raise _Reject(414, f"request line over {self._limits.max_request_line_bytes} bytes")
            if line.strip(b"\r\n"):
                return line
        raise _Reject(400, "too many empty lines before the request line")

    async def _read_head_and_body(
        self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[_Head, bytes]:
        head = _parse_request_line(line)
        head.headers = await self._read_headers(reader)
        return head, await self._read_body(head, reader, writer)

    async def _read_headers(self, reader: asyncio.StreamReader) -> dict[str, str]:
        limits = self._limits
        headers: dict[str, str] = {}
        total = 0
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise _Reject(431, f"header section over {limits.max_header_bytes} bytes") from None
            total += len(line)
            if total > limits.max_header_bytes + 2:
                raise _Reject(431, f"header section over {limits.max_header_bytes} bytes")
            text = line.rstrip(b"\r\n")
            if not text:
                return headers
            if len(headers) >= limits.max_headers:
                raise _Reject(431, f"more than {limits.max_headers} headers")
            name, value = _parse_header(text)
            if name in headers:
                if name in ("content-length", "transfer-encoding", "host"):
                    raise _Reject(400, f"header {name} given twice")
                value = f"{headers[name]}, {value}"
            headers[name] = value

    def _wants_keep_alive(self, head: _Head) -> bool:
        if not self._limits.keep_alive:
            return False
        tokens = {t.strip().lower() for t in head.headers.get("connection", "").split(",")}
        if head.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    async def _read_body(self, head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        headers = head.headers
        if "transfer-encoding" in headers:
            raise _Reject(501, "Transfer-Encoding is not supported in requests; send Content-Length")
        length_text = headers.get("content-length", "")
        if not length_text:
            return b""
        if not length_text.isdigit() or len(length_text) > 18:
            raise _Reject(400, f"invalid Content-Length {length_text[:32]!r}")
        length = int(length_text)
        if length > self._limits.max_body_bytes:
            raise _Reject(413, f"body of {length} bytes is over the limit of {self._limits.max_body_bytes}")
        expect = headers.get("expect", "").lower()
        if expect and expect != "100-continue":
            raise _Reject(417, f"unsupported Expect {expect[:32]!r}")
        if expect and length:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        return await reader.readexactly(length) if length else b""

    async def _dispatch(self, request: Request) -> Response:
        handler = self._routes.get((request.method, request.path))
        if handler is None and request.method == "HEAD":
            handler = self._routes.get(("GET", request.path))
        if handler is None:
            allowed = self._methods.get(request.path)
            if allowed is None:
                return error_response(404, f"no such path: {request.path[:200]}")
            if "GET" in allowed:
                allowed = allowed | {"HEAD"}
            return error_response(405, f"method {request.method} not allowed", (("Allow", ", ".join(sorted(allowed))),))
        try:
            async with asyncio.timeout(self._limits.handler_timeout_s):
                return await handler(request)
        except HttpError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except TimeoutError:
            log.warning("%s: handler for %s %s timed out", self._name, request.method, request.path)
            return error_response(503, "the request took too long; retry later")
        except Exception:
            log.exception("%s: handler for %s %s failed", self._name, request.method, request.path)
            return error_response(500, "internal error")

    async def _write(self, writer: asyncio.StreamWriter, response: Response, method: str, keep_alive: bool) -> None:
        lines = [
            f"HTTP/1.1 {response.status} {_reason(response.status)}",
            f"Date: {formatdate(usegmt=True)}",
            "Server: sluice",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
            *(f"{name}: {value}" for name, value in response.headers),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head if method == "HEAD" else head + response.body)
        async with asyncio.timeout(self._limits.request_timeout_s):
            await writer.drain()


# -- parsing (pure) -----------------------------------------------------------------------------


def _parse_request_line(line: bytes) -> _Head:
    try:
        text = line.rstrip(b"\r\n").decode("ascii")
    except UnicodeDecodeError:
        raise _Reject(400, "request line is not ASCII; percent-encode the target") from None
    parts = text.split(" ")
    if len(parts) != 3 or not all(parts):
        raise _Reject(400, "malformed request line; expected METHOD TARGET HTTP/1.1")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise _Reject(400, "malformed method")
    if version not in _SUPPORTED_VERSIONS:
        if _VERSION.match(version):
            raise _Reject(505, f"{version} is not supported; use HTTP/1.1")
        raise _Reject(400, "malformed HTTP version")
    return _Head(method, target, version)


def _parse_header(text: bytes) -> tuple[str, str]:
    if text[:1] in (b" ", b"\t"):
        raise _Reject(400, "folded header lines are not allowed")
    raw_name, sep, raw_value = text.partition(b":")
    name = raw_name.decode("latin-1")
    if not sep or not _TOKEN.match(name):
        raise _Reject(400, f"malformed header line {text[:40]!r}")
    value = raw_value.decode("latin-1").strip(" \t")
    if any(c in value for c in "\r\0"):
        raise _Reject(400, f"header {name[:40]} has a control character")
    return name.lower(), value


def _parse_target(target: str, max_params: int) -> tuple[str, dict[str, str]]:
    if not target.startswith("/") and not target.lower().startswith(("http://", "https://")):
        raise _Reject(400, "request target must be a path, e.g. /healthz")
    parts = urlsplit(target)
    try:
        path = unquote(parts.path or "/", errors="strict")
        pairs = parse_qsl(parts.query, keep_blank_values=True, errors="strict", max_num_fields=max_params)
    except UnicodeDecodeError:
        raise _Reject(400, "request target is not valid UTF-8 once decoded") from None
    except ValueError:
        raise _Reject(400, f"more than {max_params} query parameters") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise _Reject(400, "path has a control character")
    query: dict[str, str] = {}
    for key, value in pairs:
        if key in query:
            raise _Reject(400, f"query parameter {key[:40]!r} given twice")
        query[key] = value
    return path, query


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


async def _linger_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read and drop what the peer still sends (bounded), so it sees our answer."""
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()  # sent after whatever the transport still buffers
    dropped = 0
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_LINGER_S):
            while dropped < _LINGER_BYTES:
                chunk = await reader.read(_LINGER_BYTES)
                if not chunk:
                    break
                dropped += len(chunk)


async def serve_http(
    routes: Routes,
    host: str,
    port: int,
    stop: asyncio.Event,
    *,
    limits: HttpLimits | None = None,
    on_ready: Callable[[int], None] | None = None,
    grace_s: float = 5.0,
    name: str = "http",
) -> None:
    """Serve `routes` on host:port until `stop` is set, then close (see `HttpServer.close`).

    `on_ready(port)` is called once listening, with the real port when `port` is 0. Raises OSError
    if the address cannot be bound.
    """
    server = HttpServer(routes, limits=limits, name=name)
    bound = await server.start(host, port)
    try:
        if on_ready is not None:
            on_ready(bound)
        await stop.wait()
    finally:
        await server.close(grace_s)
