"""QueryRoute and QueryAssignment at the edge: our routes as `MessageQueue`s the clients accept.

Every queue carries broker id 0, a READ/WRITE permission and the topic's accepted message types;
its broker endpoints are a proxy endpoint with one address (what both official clients accept).
"""

from __future__ import annotations

import ipaddress
from typing import cast

from common.model import MessageType, Permission
from nameserver.model import split_address
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy import names
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.core.routing import route_queues
from proxy.grpc import convert
from proxy.grpc.status import OK


async def _fleet_endpoints(app: ProxyApp, namespace: str, access_point: pb.Endpoints) -> list[str]:
    """Proxy endpoints to advertise to a client that reached us through `access_point`."""
    network = app.fleet.network_of([f"{a.host}:{a.port}" for a in access_point.addresses])
    return await app.endpoints(namespace, network)


def endpoints_pb(address: str) -> pb.Endpoints:
    host, port = split_address(address)
    try:
        ipaddress.IPv4Address(host)
        scheme = pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


def _queue(ns: str, topic: str, broker: str, qid: int, perm: Permission, types: frozenset[MessageType],
           endpoint: str) -> pb.MessageQueue:  # fmt: skip
    return pb.MessageQueue(
        topic=pb.Resource(name=names.unwrap(ns, topic), resource_namespace=ns),
        id=qid,
        permission=cast(pb.Permission, int(perm)),
        broker=pb.Broker(name=broker, id=0, endpoints=endpoints_pb(endpoint)),
        accept_message_types=[cast(pb.MessageType, int(t)) for t in sorted(types)],
    )


async def query_route(app: ProxyApp, ctx: RequestContext, request: spb.QueryRouteRequest) -> spb.QueryRouteResponse:
    ns, topic = convert.resource_name(request.topic, ctx.namespace)
    routes = await app.directory.route(topic)
    endpoints = await _fleet_endpoints(app, ns, request.endpoints)
    queues = [_queue(ns, topic, q.broker, q.queue_id, q.permission, q.message_types, q.endpoint)
              for q in route_queues(routes, endpoints)]  # fmt: skip
    return spb.QueryRouteResponse(status=OK, message_queues=queues)


async def query_assignment(
    app: ProxyApp, ctx: RequestContext, request: spb.QueryAssignmentRequest
) -> spb.QueryAssignmentResponse:
    ns, topic = convert.resource_name(request.topic, ctx.namespace)
    convert.resource_name(request.group, ctx.namespace, "consumer group")
    routes = await app.directory.route(topic)
    endpoints = await _fleet_endpoints(app, ns, request.endpoints)
    assignments = []
    for q in route_queues([r for r in routes if r.permission.readable], endpoints):
        if q.queue_id == 0:  # one assignment per (virtual) broker, queue -1: pop from any of its queues
            mq = _queue(ns, topic, q.broker, -1, q.permission, q.message_types, q.endpoint)
            assignments.append(pb.Assignment(message_queue=mq))
    return spb.QueryAssignmentResponse(status=OK, assignments=assignments)
