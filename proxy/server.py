"""Serving the proxy: our HTTP/2 gRPC server (common/http2/) on uvloop in front of a `ProxyApp`.

`serve_proxy` runs until `stop` is set. With navigation configured it then drains: it reports
itself not ready, tells navigation at once (so it is no longer handed out or put in routes),
answers long polls quickly, and keeps serving for `drain_s` so that clients still holding routes
to it move to other proxies at their next route refresh without an error. Then it sends GOAWAY on
every connection (clients open new calls elsewhere; nothing they sent is dropped unanswered), lets
in-flight calls finish within a short grace period, ends the Telemetry streams, and returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from broker.client.api import CallContext, PopRequest, StoredMessage
from common.config import ConfigError
from common.errors import Unavailable
from common.http2.grpcserver import GrpcLimits, GrpcServer, server_ssl_context
from common.logs import kv
from proxy.amqp.server import Gateway
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.core.gather import pop_anywhere
from proxy.grpc.edge import Edge
from proxy.grpc.servicer import MessagingServicer
from proxy.mqtt.server import Gateway as MqttGateway

log = logging.getLogger("sluice.proxy")

SHUTDOWN_GRACE_S = 3.0


async def _listen(server: GrpcServer, cfg: ProxyConfig) -> None:
    tls = None
    if cfg.tls.enabled:
        try:
            tls = server_ssl_context(cfg.tls.cert_file, cfg.tls.key_file)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"[proxy.tls] cannot load the certificate or key: {exc}") from None
    try:
        await server.listen(cfg.host, cfg.port, ssl_context=tls, reuse_port=cfg.reuse_port)
    except OSError as exc:
        raise Unavailable(f"proxy cannot listen on {cfg.host}:{cfg.port}: {exc} (is the port in use?)") from None


async def serve_proxy(
    app: ProxyApp,
    stop: asyncio.Event,
    *,
    on_ready: Callable[[str], None] | None = None,
    on_readiness: Callable[[bool], None] | None = None,
) -> None:
    cfg = app.config
    server = GrpcServer(GrpcLimits(cfg.max_message_bytes, cfg.max_concurrent_rpcs), cfg.http2)
    # Requests arrive as bytes and are parsed by the edge (proxy/grpc/edge.py).
    Edge(app, MessagingServicer(app)).register(server)
    address = f"{cfg.host}:{cfg.port}"
    try:  # serve with the cluster's users and limits from the first call, without stalling start-up
        await asyncio.wait_for(app.policy.refresh(), cfg.auth.policy_refresh_s)
    except Exception as exc:  # the background refresh retries; with auth on, calls wait for it
        log.warning("security document not loaded at start", extra=kv(error=str(exc) or type(exc).__name__))
    await _listen(server, cfg)
    amqp = await _start_amqp(app) if cfg.amqp.enabled else None
    mqtt = await _start_mqtt(app) if cfg.mqtt.enabled else None
    log.info("proxy listening", extra=kv(address=address, advertise=cfg.advertised_address, tls=cfg.tls.enabled,
                                         auth=cfg.auth.enabled))  # fmt: skip
    if on_ready is not None:
        on_ready(address)
    if on_readiness is not None:
        on_readiness(True)
    background_stop = asyncio.Event()
    background = asyncio.create_task(app.run(background_stop), name="proxy-background")
    amqp_task = None if amqp is None else asyncio.create_task(amqp.run(background_stop), name="amqp")
    mqtt_task = None if mqtt is None else asyncio.create_task(mqtt.run(background_stop), name="mqtt")
    try:
        await stop.wait()
        if on_readiness is not None:
            on_readiness(False)
        if (cfg.navigation or cfg.peers) and cfg.drain_s > 0:  # others can take this proxy's clients
            await app.fleet.drain()
            await asyncio.sleep(cfg.drain_s)
    finally:
        await server.shutdown(SHUTDOWN_GRACE_S)
        background_stop.set()
        await background
        if amqp_task is not None:
            await amqp_task
        if mqtt_task is not None:
            await mqtt_task
        log.info("proxy stopped", extra=kv(address=address))


async def _start_amqp(app: ProxyApp) -> Gateway:
    """The AMQP gateway of this proxy (docs/amqp.md), listening on the proxy's host."""
    cfg = app.config
    directory = app.directory

    async def pops(brokers: list[str], request: PopRequest, ctx: CallContext) -> list[StoredMessage]:
        return await pop_anywhere(directory, brokers, request, ctx=ctx)

    gateway = Gateway(cfg.amqp, broker=directory.broker, broker_names=directory.broker_names,
                      security=lambda: app.policy.doc, auth_required=cfg.auth.enabled, send=app.producer.send,
                      routes=directory.route, pop_anywhere=pops, authorize=app.access.authorize,
                      client_report_s=cfg.client_report_s,
                      max_topic_body_bytes=cfg.settings.max_body_bytes,
                      max_lite_chars=cfg.settings.max_lite_topic_chars)  # fmt: skip
    await gateway.start(cfg.host, reuse_port=cfg.reuse_port)
    app.client_reporter.add_source(gateway.connected_clients)
    return gateway


async def _start_mqtt(app: ProxyApp) -> MqttGateway:
    """The MQTT gateway of this proxy (docs/mqtt.md), listening on the proxy's host."""
    cfg = app.config
    directory = app.directory
    gateway = MqttGateway(cfg.mqtt, directory=directory, broker_names=directory.broker_names, send=app.producer.send,
                          security=lambda: app.policy.doc, auth_required=cfg.auth.enabled,
                          authorize=app.access.authorize, advertised=cfg.advertised_address, tls=cfg.tls,
                          max_lite_chars=cfg.settings.max_lite_topic_chars)  # fmt: skip
    await gateway.start(cfg.host, reuse_port=cfg.reuse_port)
    app.client_reporter.add_source(gateway.connected_clients)
    return gateway
