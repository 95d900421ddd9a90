"""The NameServer's gRPC edge and process body.

`NameServerService` validates and converts each call (proto ↔ `nameserver.model`) and calls the
`Registry`; every error leaves as a coded status through `@internal_rpc`. `run_nameserver` serves
until its stop event is set, then stops the server with a grace period. It owns the expiry sweep
task (in a TaskGroup), so no task outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from common.logs import kv
from nameserver import convert
from nameserver.config import NameServerConfig
from nameserver.model import RegisterOutcome, format_address
from nameserver.registry import Registry
from proto.rpc import internal_rpc
from proto.serve import bind, internal_server
from proto.sluice.internal.v1 import nameserver_pb2 as pb
from proto.sluice.internal.v1 import nameserver_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.nameserver")
# A sweep this much later than its interval means the NameServer was hung (SIGSTOP, starved): it
# may have missed heartbeats, so its routes say young again (nameserver/registry.py).
STALL_MARGIN_S = 1.0


class NameServerService(pb_grpc.NameServerServicer):
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    @internal_rpc
    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterBrokerResponse:
        registration = convert.registration_from_pb(request.registration)
        outcome = self._registry.register(registration)
        fields = kv(
            broker=registration.broker_name,
            cluster=registration.cluster_name,
            address=registration.address,
            topics=len(registration.topics),
            epoch=registration.epoch,
        )
        if outcome is RegisterOutcome.NEW:
            log.info("broker registered", extra=fields)
        elif outcome is RegisterOutcome.CHANGED:
            log.info("broker registration changed", extra=fields)
        else:
            log.debug("broker heartbeat (%s)", outcome.value, extra=fields)
        return pb.RegisterBrokerResponse()

    @internal_rpc
    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterBrokerResponse:
        removed = self._registry.unregister(request.broker_name, request.instance_id)
        log.info(
            "broker unregistered" if removed else "unregister ignored (unknown broker or other instance)",
            extra=kv(broker=request.broker_name, instance=request.instance_id),
        )
        return pb.UnregisterBrokerResponse(removed=removed)

    @internal_rpc
    async def GetRoute(self, request: pb.GetRouteRequest, context: grpc.aio.ServicerContext) -> pb.GetRouteResponse:
        return pb.GetRouteResponse(route=convert.route_to_pb(self._registry.route(request.topic)))

    @internal_rpc
    async def ListBrokers(
        self, request: pb.ListBrokersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListBrokersResponse:
        brokers = self._registry.brokers(request.cluster_name)
        return pb.ListBrokersResponse(brokers=[convert.broker_status_to_pb(b) for b in brokers])

    @internal_rpc
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsResponse:
        topics = self._registry.topics()
        return pb.ListTopicsResponse(topics=[convert.topic_summary_to_pb(t) for t in topics])


async def run_nameserver(
    config: NameServerConfig,
    stop: asyncio.Event,
    *,
    on_ready: Callable[[str], None] | None = None,
    registry: Registry | None = None,
) -> None:
    """Serve the NameServer until `stop` is set; then stop gracefully and return.

    `on_ready(address)` is called once the port is bound (with the real port when config.port is 0).
    Raises ConfigError if the address cannot be bound (in use, not a local address).
    """
    if registry is None:
        registry = Registry(broker_expiry_s=config.broker_expiry_s, max_brokers=config.max_brokers,
                            young_s=config.young_s, stall_s=config.sweep_interval_s + STALL_MARGIN_S)  # fmt: skip
    server = internal_server(max_concurrent_rpcs=config.max_concurrent_rpcs, max_message_bytes=config.max_message_bytes)
    pb_grpc.add_NameServerServicer_to_server(NameServerService(registry), server)
    address = format_address(config.host, bind(server, "nameserver", config.host, config.port))
    await server.start()
    try:
        log.info("nameserver started", extra=kv(address=address, broker_expiry_s=config.broker_expiry_s))
        if on_ready is not None:
            on_ready(address)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(_sweep(registry, config.sweep_interval_s, stop))
            await stop.wait()
    finally:
        await server.stop(config.shutdown_grace_s)
        log.info("nameserver stopped", extra=kv(address=address))


async def _sweep(registry: Registry, interval_s: float, stop: asyncio.Event) -> None:
    """Reclaim expired brokers every `interval_s` until `stop`."""
    while not stop.is_set():
        if registry.tick():
            log.warning("nameserver was stalled; its routes say young until brokers have re-registered")
        for gone in registry.expire():
            log.warning(
                "broker expired",
                extra=kv(
                    broker=gone.broker_name,
                    cluster=gone.cluster_name,
                    address=gone.address,
                    silent_s=round(gone.last_heartbeat_age_s, 3),
                ),
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
