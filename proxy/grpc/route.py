"""QueryRoute and QueryAssignment at the edge: our routes as `MessageQueue`s the clients accept.

Every queue carries broker id 0, a READ/WRITE permission and the topic's accepted message types;
its broker endpoints are a proxy endpoint with one address (what every official client accepts).
For a client in `ADDRESS_LIST_LANGUAGES`, a FIFO topic's queues list every proxy, the queue's own
first (`route_queues`' fallbacks), when all are IPv4 addresses: its gRPC channel then moves to the
next proxy when one is gone, so a FIFO message group survives a proxy's loss. The Node client
cannot take that (its gRPC target has no scheme, and `a:1,b:2` does not resolve), and a domain
name scheme allows one address only.
"""

from __future__ import annotations

import ipaddress
from typing import cast

from nameserver.model import split_address
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy import names
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.core.routing import RouteQueue, route_queues
from proxy.grpc import convert
from proxy.grpc.status import OK

# Clients (the x-mq-language header) known to connect to an IPv4 endpoints list with several
# addresses and move to the next address when one fails (checked: the Python client's channel to
# `ipv4:a,b` is gRPC's pick_first over both).
ADDRESS_LIST_LANGUAGES = frozenset({"PYTHON"})


async def _fleet_endpoints(app: ProxyApp, namespace: str, access_point: pb.Endpoints) -> list[str]:
    """Proxy endpoints to advertise to a client that reached us through `access_point`."""
    given = [f"{a.host}:{a.port}" for a in access_point.addresses]
    return await app.endpoints(namespace, app.fleet.network_of(given), given)


def _ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def endpoints_pb(address: str, fallbacks: tuple[str, ...] = ()) -> pb.Endpoints:
    """`address` as client endpoints; with `fallbacks`, all of them when every one is IPv4."""
    hosts = [split_address(a) for a in (address, *fallbacks)]
    if len(hosts) > 1 and all(_ipv4(h) for h, _ in hosts):
        return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=h, port=p) for h, p in hosts])
    host, port = hosts[0]
    return pb.Endpoints(scheme=pb.IPv4 if _ipv4(host) else pb.DOMAIN_NAME, addresses=[pb.Address(host=host, port=port)])


def _queue(ns: str, topic: str, q: RouteQueue, qid: int | None = None) -> pb.MessageQueue:
    return pb.MessageQueue(
        topic=pb.Resource(name=names.unwrap(ns, topic), resource_namespace=ns),
        id=q.queue_id if qid is None else qid,
        permission=cast(pb.Permission, int(q.permission)),
        broker=pb.Broker(name=q.broker, id=0, endpoints=endpoints_pb(q.endpoint, q.fallbacks)),
        accept_message_types=[cast(pb.MessageType, int(t)) for t in sorted(q.message_types)],
    )


async def query_route(app: ProxyApp, ctx: RequestContext, request: spb.QueryRouteRequest) -> spb.QueryRouteResponse:
    ns, topic = convert.resource_name(request.topic, ctx.namespace)
    routes = app.client_routes(await app.directory.route(topic))
    endpoints = await _fleet_endpoints(app, ns, request.endpoints)
    fallbacks = ctx.language.upper() in ADDRESS_LIST_LANGUAGES
    queues = [_queue(ns, topic, q) for q in route_queues(routes, endpoints, fifo_fallbacks=fallbacks)]
    return spb.QueryRouteResponse(status=OK, message_queues=queues)


async def query_assignment(
    app: ProxyApp, ctx: RequestContext, request: spb.QueryAssignmentRequest
) -> spb.QueryAssignmentResponse:
    ns, topic = convert.resource_name(request.topic, ctx.namespace)
    convert.resource_name(request.group, ctx.namespace, "consumer group")
    routes = app.client_routes(await app.directory.route(topic))
    endpoints = await _fleet_endpoints(app, ns, request.endpoints)
    assignments = []
    fallbacks = ctx.language.upper() in ADDRESS_LIST_LANGUAGES
    for q in route_queues([r for r in routes if r.permission.readable], endpoints, fifo_fallbacks=fallbacks):
        if q.queue_id == 0:  # one assignment per (virtual) broker, queue -1: pop from any of its queues
            assignments.append(pb.Assignment(message_queue=_queue(ns, topic, q, -1)))
    return spb.QueryAssignmentResponse(status=OK, assignments=assignments)
