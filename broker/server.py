"""The broker process body: a `LocalBroker` served over the internal gRPC service (on our HTTP/2
server, common/http2), registered with the NameServers.

`run_broker(config, stop)` binds the port first (a taken port fails before the store is opened),
starts the broker, serves `BrokerServicer` (broker/service.py), and keeps the broker registered through a
`BrokerRegistrar` whose registration is rebuilt from `broker.topic_infos()` on every heartbeat. A
topic change is pushed to the NameServers before the admin call that made it returns
(the broker's `on_topics_changed`). With no NameServer configured the broker runs standalone; NameServers
that are down are logged and retried at the next heartbeat while the broker keeps serving.

Shutdown, once `stop` is set, in this order: stop accepting calls and give in-flight ones
`SHUTDOWN_GRACE_S` (long polls are cancelled after that), unregister from the NameServers, close the
broker. Every task is owned by a TaskGroup, so nothing outlives `run_broker`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable
from typing import cast

from broker import service
from broker.client.api import BrokerApi
from broker.client.grpc_convert import MAX_MESSAGE_BYTES
from broker.config import BrokerConfig
from broker.local import LocalBroker
from common.config import ConfigError
from common.errors import BadRequest
from common.http2.grpcserver import GrpcLimits, GrpcServer
from common.http2.limits import Http2Limits
from common.logs import kv
from nameserver.client import BrokerRegistrar, NameServerClient
from nameserver.model import BrokerRegistration, format_address, validate_name
from proto import token
from proto.serve import bind_socket

log = logging.getLogger("sluice.broker.server")

# In-flight calls get this long to finish once the broker is asked to stop.
SHUTDOWN_GRACE_S = 3.0
# Calls served at once; further calls are refused (RESOURCE_EXHAUSTED) rather than queued. Long
# polls hold a slot each, so this is well above the number of consumers a broker expects.
MAX_CONCURRENT_RPCS = 10_000
# Each caller's connection (a proxy, an admin, another node): the HTTP/2 edge's defences as on the
# client port, with room for every call a proxy may hold at once (long polls) and a stream window
# that takes a batch of sends (64 sends of a 1 KiB message: ~70 KB) without waiting for a grant.
SERVICE_HTTP2 = Http2Limits(max_concurrent_streams=MAX_CONCURRENT_RPCS, initial_window_bytes=1024 * 1024)


async def run_broker(
    config: BrokerConfig,
    stop: asyncio.Event,
    *,
    on_ready: Callable[[str], None] | None = None,
    on_broker: Callable[[LocalBroker], None] | None = None,
) -> None:
    """Serve one broker until `stop` is set; then shut down in order and return.

    `on_ready(address)` is called once the broker serves (with the real port when config.port is
    0), then `on_broker(broker)` with the running `LocalBroker` (the merged topology's proxy calls
    it in-process; it must not be used after `run_broker` returns). Raises ConfigError for a name
    the NameServer would refuse or an address that cannot be bound; store errors propagate from
    `LocalBroker.start()`.
    """
    _check_names(config)
    client = NameServerClient(config.namesrv) if config.namesrv else None  # opens channels lazily
    sock = bind_socket("broker", config.host, config.port)
    port = int(sock.getsockname()[1])
    server = GrpcServer(GrpcLimits(MAX_MESSAGE_BYTES, MAX_CONCURRENT_RPCS), SERVICE_HTTP2)
    address = format_address(config.host, port)
    if port != config.port:  # port 0: the broker stamps stored messages with its real address
        config = dataclasses.replace(config, port=port)
    advertised = config.advertised_address
    if config.replication.enabled:  # a member of a broker group (docs/replication.md)
        await _run_member(config, stop, server, sock, client, address, advertised, on_ready)
        return
    registrar: BrokerRegistrar | None = None

    async def topics_changed() -> None:
        # LocalBroker logs and swallows a failed report; the next heartbeat catches up. A broker
        # that is stopping leaves the NameServers: nothing to report.
        if registrar is not None and not stop.is_set():
            await registrar.report_now()

    broker = LocalBroker(config, on_topics_changed=topics_changed)
    try:
        await broker.start()
        registrar = _registrar(broker, client, config, advertised) if client is not None else None
        if registrar is None:
            log.info("no nameserver configured: running standalone", extra=kv(broker=broker.name))
        service.serve(server, service.BrokerServicer(broker))
        await server.serve_socket(sock)
        log.info("broker serving", extra=kv(broker=broker.name, address=address, advertised=advertised))
        if on_ready is not None:
            on_ready(address)
        if on_broker is not None:
            on_broker(broker)
        await _serve_until_stopped(broker, server, registrar, stop)
    finally:
        await server.shutdown(0)  # nothing left after a graceful stop; immediate after an error
        sock.close()  # (never served, after an error)
        if client is not None:
            await client.close()
        await broker.close()
        log.info("broker stopped", extra=kv(broker=broker.name, address=address))


async def _serve_until_stopped(
    broker: LocalBroker, server: GrpcServer, registrar: BrokerRegistrar | None, stop: asyncio.Event
) -> None:
    registrar_stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        if registrar is not None:
            tasks.create_task(registrar.run(registrar_stop), name="broker-registrar")
        await stop.wait()
        log.info("broker stopping", extra=kv(broker=broker.name, grace_s=SHUTDOWN_GRACE_S))
        await server.shutdown(SHUTDOWN_GRACE_S)
        registrar_stop.set()  # the registrar unregisters from every NameServer, then ends


async def _run_member(
    config: BrokerConfig,
    stop: asyncio.Event,
    server: GrpcServer,
    sock: socket.socket,
    client: NameServerClient | None,
    address: str,
    advertised: str,
    on_ready: Callable[[str], None] | None,
) -> None:
    """`run_broker` for a member of a broker group: the service answers through the member's
    `RoleSwitch` (the LocalBroker only while primary); routes are registered under the group's name."""
    from broker.replication.member import GroupMember, RoleSwitch

    switch = RoleSwitch(config.name, config.replication.group)
    registrar = (
        None
        if client is None
        else (lambda broker, term_valid: _registrar(broker, client, config, advertised, may_register=term_valid))
    )
    member = GroupMember(config, switch, advertised, registrar, token=token.from_environment())
    member_stop = asyncio.Event()
    try:
        service.serve(server, service.BrokerServicer(cast(BrokerApi, switch)))
        await server.serve_socket(sock)
        log.info("broker serving as a group member", extra=kv(broker=config.name, group=config.replication.group,
                                                              address=address))  # fmt: skip
        if on_ready is not None:
            on_ready(address)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(member.run(member_stop), name="group-member")
            await stop.wait()
            await server.shutdown(SHUTDOWN_GRACE_S)
            member_stop.set()  # resigns at once if primary, closes the broker, leaves the NameServers
    finally:
        member_stop.set()
        await server.shutdown(0)
        sock.close()
        if client is not None:
            await client.close()
        log.info("broker stopped", extra=kv(broker=config.name, address=address))


def _check_names(config: BrokerConfig) -> None:
    try:
        validate_name("broker", config.name)
        validate_name("cluster", config.cluster)
    except BadRequest as exc:
        raise ConfigError(f"[broker] {exc}") from None


def _registrar(
    broker: LocalBroker, client: NameServerClient, config: BrokerConfig, advertised: str, *,
    may_register: Callable[[], bool] = lambda: True,
) -> BrokerRegistrar:  # fmt: skip
    """`may_register`: a group's primary registers only while its term is valid (BrokerRegistrar)."""

    def registration() -> BrokerRegistration:
        return BrokerRegistration(
            cluster_name=config.cluster,
            broker_name=broker.name,
            address=advertised,
            topics=tuple(broker.topic_infos()),
            client_endpoint=config.client_endpoint,
            epoch=broker.term,  # a group's primary: its term orders its registrations against its successor's
        )

    log.info(
        "registering with nameservers",
        extra=kv(broker=broker.name, cluster=config.cluster, nameservers=";".join(client.addresses)),
    )
    return BrokerRegistrar(client, registration, heartbeat_interval_s=config.heartbeat_interval_s,
                           may_register=may_register)  # fmt: skip
