"""The operations endpoint every Sluice process can expose over HTTP (`--metrics-port PORT`):

    GET /healthz   200 while the process runs (liveness)
    GET /readyz    200 only while every part of the process can serve, else 503 (readiness)
    GET /metrics   Prometheus metrics of the process (prometheus-client's default registry; the
                   families are defined in common/metrics.py and listed in docs/metrics.md)
    GET /loglevel  the process's log level, as JSON {"level": "info"}
    PUT /loglevel  change it at runtime; the body is the level (debug, info, warning, error) as
                   plain text or as JSON {"level": "debug"}; 400 for an unknown level

The endpoint listens on the process's host (127.0.0.1 by default): whoever reaches it can change
the log level, like whoever can send the process a signal.

Parts report readiness through `Readiness.set(part, ready)`; a process is ready when it has at
least one part and all of them are ready. A draining proxy reports not ready, so load balancers
and probes stop sending it traffic. `serve_part` runs a process of one part (a broker, a
NameServer, a navigation server) with its endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp.web import Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from common.httpserver import HttpError, Routes, json_response, serve_http, text_response
from common.logs import get_level, kv, set_level
from ops.merge import Children, forward_put, merge, scrape
from processes.runtime import serve

log = logging.getLogger("sluice.ops")


class Readiness:
    def __init__(self) -> None:
        self._parts: dict[str, bool] = {}

    def set(self, part: str, ready: bool) -> None:
        self._parts[part] = ready

    def ready(self) -> bool:
        return bool(self._parts) and all(self._parts.values())

    def parts(self) -> dict[str, bool]:
        return dict(self._parts)


def routes(readiness: Readiness, children: Children | None = None) -> Routes:
    """The endpoint's routes; with `children` (a parent's workers) /metrics merges theirs
    (ops/merge.py), /readyz needs every worker ready and PUT /loglevel reaches them too."""

    async def healthz(_: Request) -> Response:
        return text_response("ok\n")

    async def readyz(_: Request) -> Response:
        parts = readiness.parts()
        if children is not None:
            parts[f"{children.label}s"] = children.ready()
        ready = bool(parts) and all(parts.values())
        body = json.dumps({"ready": ready, "parts": parts}) + "\n"
        return Response(status=200 if ready else 503, body=body.encode(), content_type="application/json")

    async def metrics(_: Request) -> Response:
        body = (
            generate_latest(REGISTRY)
            if children is None
            else merge(REGISTRY.collect(), await scrape(children), children.label)
        )
        # The exposition type carries parameters (version, charset), which aiohttp's content_type refuses.
        return Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_loglevel(_: Request) -> Response:
        return json_response({"level": get_level()})

    async def put_loglevel(request: Request) -> Response:
        level = _parse_level(await request.read())
        try:
            set_level(level)
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        log.warning("log level changed", extra=kv(level=level, by=request.remote))
        if children is not None:
            await forward_put(children, "/loglevel", level.encode())
        return json_response({"level": get_level()})

    return {
        ("GET", "/healthz"): healthz, ("GET", "/readyz"): readyz, ("GET", "/metrics"): metrics,
        ("GET", "/loglevel"): get_loglevel, ("PUT", "/loglevel"): put_loglevel,
    }  # fmt: skip


def _parse_level(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            raise HttpError(400, 'the body is not valid JSON; send {"level": "debug"} or just: debug') from None
        level = doc.get("level") if isinstance(doc, dict) else None
        if not isinstance(level, str):
            raise HttpError(400, 'the JSON body needs a "level" string, e.g. {"level": "debug"}')
        return level
    if not text:
        raise HttpError(400, "the body is empty; send the level: debug, info, warning or error")
    return text


async def serve_ops(
    host: str,
    port: int,
    readiness: Readiness,
    stop: asyncio.Event,
    *,
    on_ready: Callable[[int], None] | None = None,
    children: Children | None = None,
) -> None:
    await serve_http(routes(readiness, children), host, port, stop, on_ready=on_ready, grace_s=1.0, name="ops")


@contextlib.asynccontextmanager
async def ops_server(
    host: str,
    port: int | None,
    readiness: Readiness,
    *,
    children: Children | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> AsyncIterator[None]:
    """Serve the ops endpoint for the duration of the block: on `port`, or on an ephemeral port
    when `port` is 0 and `on_ready` wants to learn it; no endpoint when `port` is 0 or None."""
    if not port and on_ready is None:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(serve_ops(host, port or 0, readiness, stop, on_ready=on_ready, children=children),
                               name="ops-http")  # fmt: skip
    try:
        yield
    finally:
        stop.set()
        await task


def serve_part(
    part: str,
    host: str,
    metrics_port: int | None,
    body: Callable[[asyncio.Event, Callable[..., None]], Awaitable[None]],
    announce: Callable[..., None],
) -> int:
    """Run a process of one part until SIGTERM/SIGINT (processes/runtime.py `serve`), with its ops
    endpoint on `metrics_port`: `body(stop, on_ready)` serves until `stop`; when it calls
    `on_ready(...)`, `announce(...)` prints the ready line and `/readyz` says `part` is ready."""

    async def main(stop: asyncio.Event) -> int:
        readiness = Readiness()
        readiness.set(part, False)

        def ready(*args: Any) -> None:
            announce(*args)
            readiness.set(part, True)

        async with ops_server(host, metrics_port, readiness):
            await body(stop, ready)
        return 0

    return serve(main)
