"""Navigation's gRPC edge and process body (gRPC and HTTP served together).

`NavigationService` validates and converts each call (proto ↔ `navigation.model`) and calls the
`Registry`; every error leaves as a coded status through `@internal_rpc`. `run_navigation` serves
both protocols over the same registry until its stop event is set, then stops both with a grace
period. It owns the expiry sweep task (in a TaskGroup) and the HTTP server's connection tasks, so
no task outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from common.config import ConfigError
from common.httpserver import HttpServer
from common.logs import kv
from navigation import convert
from navigation.config import NavigationConfig
from navigation.http import NavigationHttp
from navigation.model import RegisterOutcome
from navigation.registry import Registry
from proto.rpc import internal_rpc
from proto.serve import bind, host_port, internal_server
from proto.sluice.internal.v1 import navigation_pb2 as pb
from proto.sluice.internal.v1 import navigation_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.navigation")

OnReady = Callable[[str, str], None]  # (gRPC address, HTTP URL)


class NavigationService(pb_grpc.NavigationServicer):
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    @internal_rpc
    async def RegisterProxy(
        self, request: pb.RegisterProxyRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterProxyResponse:
        registration = convert.registration_from_pb(request.registration)
        outcome = self._registry.register(registration)
        fields = kv(
            proxy=registration.proxy_id,
            zone=registration.zone,
            endpoints=",".join(f"{n}={e}" for n, e in sorted(registration.endpoints.items())),
            draining=registration.draining,
        )
        if outcome is RegisterOutcome.NEW:
            log.info("proxy registered", extra=fields)
        elif outcome is RegisterOutcome.CHANGED:
            log.info("proxy registration changed", extra=fields)
        elif outcome is RegisterOutcome.RESTARTED:
            # After a crash this is a restart; repeated, two proxies share one id and flap.
            log.warning("proxy id taken over by a new instance", extra=fields)
        else:
            log.debug("proxy heartbeat (%s)", outcome.value, extra=fields)
        return pb.RegisterProxyResponse()

    @internal_rpc
    async def UnregisterProxy(
        self, request: pb.UnregisterProxyRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterProxyResponse:
        removed = self._registry.unregister(request.proxy_id, request.instance_id, request.sequence)
        log.info(
            "proxy unregistered" if removed else "unregister ignored (unknown proxy or other instance)",
            extra=kv(proxy=request.proxy_id, instance=request.instance_id),
        )
        return pb.UnregisterProxyResponse(removed=removed)

    @internal_rpc
    async def GetEndpoints(
        self, request: pb.GetEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEndpointsResponse:
        return convert.answer_to_pb(self._registry.select(convert.query_from_pb(request)))

    @internal_rpc
    async def ListProxies(
        self, request: pb.ListProxiesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListProxiesResponse:
        return pb.ListProxiesResponse(proxies=[convert.status_to_pb(s) for s in self._registry.proxies()])


class _Readiness:
    """Ready once serving and warmed up (a proxy registered, or `warmup_s` passed); not while stopping."""

    def __init__(self, registry: Registry, warmup_s: float, stop: asyncio.Event) -> None:
        self._registry = registry
        self._ready_at = time.monotonic() + warmup_s
        self._stop = stop
        self._warm = warmup_s <= 0

    def __call__(self) -> bool:
        if self._stop.is_set():
            return False
        if not self._warm:
            self._warm = time.monotonic() >= self._ready_at or self._registry.live_count() > 0
        return self._warm


async def run_navigation(
    config: NavigationConfig,
    stop: asyncio.Event,
    *,
    on_ready: OnReady | None = None,
    registry: Registry | None = None,
) -> None:
    """Serve navigation over gRPC and HTTP until `stop` is set; then stop both gracefully and return.

    `on_ready(grpc_address, http_url)` is called once both ports are bound (with the real ports
    when configured as 0). Raises ConfigError if an address cannot be bound.
    """
    if registry is None:
        registry = Registry(proxy_expiry_s=config.proxy_expiry_s, max_proxies=config.max_proxies)
    server = internal_server(max_concurrent_rpcs=config.max_concurrent_rpcs, max_message_bytes=config.max_message_bytes)
    pb_grpc.add_NavigationServicer_to_server(NavigationService(registry), server)
    grpc_address = host_port(config.host, bind(server, "navigation", config.host, config.port))
    http = HttpServer(
        NavigationHttp(registry, ready=_Readiness(registry, config.warmup_s, stop)).routes(),
        limits=config.http_limits,
        name="navigation-http",
        grace_s=config.shutdown_grace_s,
    )
    await server.start()
    try:
        try:
            http_port = await http.start(config.host, config.http_port)
        except OSError as exc:
            raise ConfigError(
                f"[navigation] cannot listen for HTTP on {host_port(config.host, config.http_port)} "
                f"(host, http_port): {exc.strerror or exc}"
            ) from None
        http_url = f"http://{host_port(config.host, http_port)}"
        log.info(
            "navigation started",
            extra=kv(grpc=grpc_address, http=http_url, proxy_expiry_s=config.proxy_expiry_s),
        )
        if on_ready is not None:
            on_ready(grpc_address, http_url)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(_sweep(registry, config.sweep_interval_s, stop))
            await stop.wait()
    finally:
        await asyncio.gather(http.close(), server.stop(config.shutdown_grace_s))
        log.info("navigation stopped", extra=kv(grpc=grpc_address))


async def _sweep(registry: Registry, interval_s: float, stop: asyncio.Event) -> None:
    """Reclaim expired proxies every `interval_s` until `stop`."""
    while not stop.is_set():
        for gone in registry.expire():
            log.warning(
                "proxy expired",
                extra=kv(proxy=gone.proxy_id, zone=gone.zone, silent_s=round(gone.last_heartbeat_age_s, 3)),
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
