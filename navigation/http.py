"""Navigation's plain-HTTP API over the registry (aiohttp handlers, served by `common.httpserver`).

    GET /v1/endpoints?namespace=NS&network=NET&zone=Z&limit=N&format=json|text
    GET /v1/proxies
    GET /healthz      200 while the process runs
    GET /readyz       200 while it serves answers worth taking (see `NavigationConfig.warmup_s`)

All parameters are optional (network defaults to `default`); an unknown parameter, a repeated one
or a malformed value is a 400 with `{"error": "..."}`. JSON answers are objects (never bare lists)
so fields can be added. `format=text` answers the JSON's `access_points`: `host:port;host:port`
with no trailing newline, narrowed by `model.access_points` to what the official clients accept
as their endpoints setting; or 503 with a short text reason when no proxy matches (a JSON answer
is then 200 with empty lists). Answers are never cacheable: loads change with every heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp.web import Request, Response

from common.errors import BadRequest
from common.httpserver import HttpError, Routes, json_response, text_response
from navigation.model import (
    DEFAULT_NETWORK,
    EndpointQuery,
    ProxyEndpoint,
    ProxyLoad,
    ProxyStatus,
    access_points,
    distinct_endpoints,
    endpoints_text,
)
from navigation.registry import Registry

ENDPOINT_PARAMS = frozenset({"namespace", "network", "zone", "limit", "format"})
FORMATS = ("json", "text")
_NO_STORE = (("Cache-Control", "no-store"),)


class NavigationHttp:
    """The route handlers; `ready()` tells `/readyz` whether this server should take traffic."""

    def __init__(self, registry: Registry, *, ready: Callable[[], bool], retry_after_s: int = 1) -> None:
        self._registry = registry
        self._ready = ready
        self._retry_after = str(max(1, retry_after_s))

    def routes(self) -> Routes:
        return {
            ("GET", "/v1/endpoints"): self.endpoints,
            ("GET", "/v1/proxies"): self.proxies,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
        }

    async def endpoints(self, request: Request) -> Response:
        query, text_format = parse_endpoint_query(request.query, max_limit=self._registry.max_proxies)
        try:
            ranked = self._registry.select(query)
        except BadRequest as exc:
            raise HttpError(400, exc.message) from None
        endpoints = distinct_endpoints(ranked)
        text = endpoints_text(access_points(endpoints))
        if text_format:
            if not text:
                reason = f"no proxy available for namespace={query.namespace!r} network={query.network!r}"
                return text_response(reason, 503, (*_NO_STORE, ("Retry-After", self._retry_after)))
            return text_response(text, headers=_NO_STORE)
        doc = {
            "namespace": query.namespace,
            "network": query.network,
            "zone": query.zone,
            "endpoints": endpoints,
            "access_points": text,
            "proxies": [endpoint_doc(p) for p in ranked],
        }
        return json_response(doc, headers=_NO_STORE)

    async def proxies(self, request: Request) -> Response:
        _no_params(request)
        return json_response({"proxies": [status_doc(s) for s in self._registry.proxies()]}, headers=_NO_STORE)

    async def healthz(self, request: Request) -> Response:
        return text_response("ok", headers=_NO_STORE)

    async def readyz(self, request: Request) -> Response:
        if self._ready():
            return text_response("ready", headers=_NO_STORE)
        return text_response("not ready", 503, (*_NO_STORE, ("Retry-After", self._retry_after)))


def parse_endpoint_query(params: Mapping[str, str], *, max_limit: int) -> tuple[EndpointQuery, bool]:
    """(query, whether text was asked) from `/v1/endpoints` parameters; HttpError(400) if malformed."""
    unknown = sorted(set(params) - ENDPOINT_PARAMS)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise HttpError(400, f"unknown parameter(s) {shown}; known: {', '.join(sorted(ENDPOINT_PARAMS))}")
    fmt = params.get("format", "json")
    if fmt not in FORMATS:
        raise HttpError(400, f"format {fmt[:40]!r} is not one of {', '.join(FORMATS)}")
    limit_text = params.get("limit", "0")
    if not limit_text.isdigit() or len(limit_text) > 9 or int(limit_text) > max_limit:
        raise HttpError(400, f"limit {limit_text[:40]!r} is not a whole number in 0..{max_limit} (0 means no limit)")
    query = EndpointQuery(
        namespace=params.get("namespace", ""),
        network=params.get("network", "") or DEFAULT_NETWORK,
        zone=params.get("zone", ""),
        limit=int(limit_text),
    )
    return query, fmt == "text"


def _no_params(request: Request) -> None:
    if request.query:
        raise HttpError(400, f"{request.path} takes no parameters")


def load_doc(load: ProxyLoad) -> dict[str, int]:
    return {
        "load": load.score,
        "in_flight_requests": load.in_flight_requests,
        "connected_clients": load.connected_clients,
    }


def endpoint_doc(proxy: ProxyEndpoint) -> dict[str, Any]:
    return {"id": proxy.proxy_id, "zone": proxy.zone, "endpoint": proxy.endpoint, **load_doc(proxy.load)}


def status_doc(status: ProxyStatus) -> dict[str, Any]:
    return {
        "id": status.proxy_id,
        "zone": status.zone,
        "endpoints": dict(sorted(status.endpoints.items())),
        "namespaces": sorted(status.namespaces),
        "draining": status.draining,
        **load_doc(status.load),
        "last_heartbeat_age_s": round(status.last_heartbeat_age_s, 3),
    }
