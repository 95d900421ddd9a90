"""Sluice's plain-HTTP surfaces (every process's ops endpoint, navigation's API) served by aiohttp.

Handlers are aiohttp handlers, `async def handler(request: web.Request) -> web.StreamResponse`,
routed by exact (method, path); a GET route answers HEAD too (aiohttp's `allow_head`). aiohttp
parses HTTP; this module adds what every Sluice HTTP server shares, as middlewares:

- Errors are JSON `{"error": "..."}`: 404 unknown path, 405 another method (with `Allow`), 413 a
  body over `max_body_bytes`, 400 a malformed query (more than `max_query_params` parameters, a
  repeated one, or one that is not UTF-8), 503 over `max_connections` (the connection is closed)
  or a handler past `handler_timeout_s`, 500 a handler that raised (logged with its traceback).
  `HttpError(status, message)` raised by a handler becomes that status with the same body.
- Malformed HTTP (request line, headers, framing) is answered by aiohttp's parser itself, always
  with a 400 and a closed connection; a request line over `max_request_line_bytes`, a header over
  `max_header_bytes` or more than `max_headers` headers are such errors too.
- Keep-alive follows HTTP/1.1 (HTTP/1.0 only with `Connection: keep-alive`), is off with
  `keep_alive = false`, and an idle connection is closed after `idle_timeout_s`.
- `HttpServer.close()` stops listening, closes idle connections, lets requests in progress
  finish for up to `grace_s` and cancels the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from common.httplimits import HttpLimits

log = logging.getLogger("sluice.http")

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain"  # aiohttp adds "; charset=utf-8" to text answers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Routes = Mapping[tuple[str, str], Handler]  # (method, path) -> handler
Headers = tuple[tuple[str, str], ...]


class HttpError(Exception):
    """Raised by a handler to answer `status` with a JSON error body."""

    def __init__(self, status: int, message: str, headers: Headers = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def json_response(doc: Any, status: int = 200, headers: Headers = ()) -> web.Response:
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return web.Response(status=status, body=body, content_type=JSON_TYPE, headers=dict(headers))


def text_response(text: str, status: int = 200, headers: Headers = ()) -> web.Response:
    return web.Response(status=status, text=text, content_type=TEXT_TYPE, headers=dict(headers))


def error_response(status: int, message: str, headers: Headers = ()) -> web.Response:
    return json_response({"error": message}, status, headers)


def checked_query(request: web.Request, max_params: int) -> None:
    """Raise HttpError(400) for a query with too many parameters, a repeated one or bad UTF-8."""
    try:
        query = request.query
    except UnicodeDecodeError:
        raise HttpError(400, "query is not valid UTF-8 once decoded") from None
    if len(query) > max_params:
        raise HttpError(400, f"more than {max_params} query parameters")
    if len(set(query)) != len(query):
        repeated = next(k for k in query if len(query.getall(k)) > 1)
        raise HttpError(400, f"query parameter {repeated[:40]!r} given twice")


class HttpServer:
    """Serves `routes` on one listening address: `start(host, port)`, then `close(grace_s)`."""

    def __init__(
        self, routes: Routes, *, limits: HttpLimits | None = None, name: str = "http", grace_s: float = 5.0
    ) -> None:
        self._limits = limits or HttpLimits()
        self._grace_s = grace_s
        self._name = name
        self._runner: web.AppRunner | None = None
        self._port = 0
        app = web.Application(middlewares=[self._guard], client_max_size=self._limits.max_body_bytes)
        for (method, path), handler in routes.items():
            if method == "GET":
                app.router.add_get(path, handler)  # and HEAD
            else:
                app.router.add_route(method, path, handler)
        self._app = app

    @property
    def port(self) -> int:
        """The bound port (the real one when started with port 0)."""
        return self._port

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on host:port; returns the bound port. Raises OSError if the address cannot be bound."""
        limits = self._limits
        runner = web.AppRunner(
            self._app, access_log=None, handle_signals=False, keepalive_timeout=limits.idle_timeout_s,
            max_line_size=limits.max_request_line_bytes, max_field_size=limits.max_header_bytes,
            max_headers=limits.max_headers, lingering_time=0.5, shutdown_timeout=self._grace_s,
        )  # fmt: skip
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = runner.addresses[0][1] if runner.addresses else port
        return self._port

    async def close(self) -> None:
        """Stop listening and end every connection, waiting up to `grace_s` for requests in progress."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> HttpServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _connections(self) -> int:
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        limits = self._limits
        try:
            if self._connections() > limits.max_connections:
                response: web.StreamResponse = error_response(503, "too many connections; retry later")
                response.force_close()
                return response
            checked_query(request, limits.max_query_params)
            async with asyncio.timeout(limits.handler_timeout_s):
                response = await handler(request)
        except HttpError as exc:
            response = error_response(exc.status, exc.message, exc.headers)
        except web.HTTPException as exc:  # the router's 404/405, aiohttp's 413
            response = error_response(exc.status, _reason(exc), _kept_headers(exc))
        except TimeoutError:
            log.warning("%s: handler for %s %s timed out", self._name, request.method, request.path)
            response = error_response(503, "the request took too long; retry later")
        except Exception:
            log.exception("%s: handler for %s %s failed", self._name, request.method, request.path)
            response = error_response(500, "internal error")
        if not limits.keep_alive:
            response.force_close()
        return response


def _reason(exc: web.HTTPException) -> str:
    if isinstance(exc, web.HTTPNotFound):
        return "no such path"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return f"method {exc.method} not allowed"
    return exc.text or exc.reason


def _kept_headers(exc: web.HTTPException) -> Headers:
    allow = exc.headers.get("Allow")
    return (("Allow", allow),) if allow else ()


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
    server = HttpServer(routes, limits=limits, name=name, grace_s=grace_s)
    bound = await server.start(host, port)
    try:
        if on_ready is not None:
            on_ready(bound)
        await stop.wait()
    finally:
        await server.close()
