"""Conversions between `navigation.model` dataclasses and `sluice.internal.v1` Navigation messages.

The only module of navigation besides the service and the client that sees protobuf. Conversion
never validates (the registry does, with coded errors); it only maps fields. Proto3 defaults map
to the model's: an empty network in a query is `DEFAULT_NETWORK`, an absent load is zero.
"""

from __future__ import annotations

from navigation.model import (
    DEFAULT_NETWORK,
    EndpointQuery,
    ProxyEndpoint,
    ProxyLoad,
    ProxyRegistration,
    ProxyStatus,
    distinct_endpoints,
)
from proto.sluice.internal.v1 import navigation_pb2 as pb


def load_to_pb(load: ProxyLoad) -> pb.ProxyLoad:
    return pb.ProxyLoad(in_flight_requests=load.in_flight_requests, connected_clients=load.connected_clients)


def load_from_pb(msg: pb.ProxyLoad) -> ProxyLoad:
    return ProxyLoad(in_flight_requests=msg.in_flight_requests, connected_clients=msg.connected_clients)


# -- registration -------------------------------------------------------------------------------


def registration_to_pb(registration: ProxyRegistration) -> pb.ProxyRegistration:
    return pb.ProxyRegistration(
        proxy_id=registration.proxy_id,
        endpoints=dict(registration.endpoints),
        zone=registration.zone,
        namespaces=sorted(registration.namespaces),
        draining=registration.draining,
        load=load_to_pb(registration.load),
        instance_id=registration.instance_id,
        sequence=registration.sequence,
    )


def registration_from_pb(msg: pb.ProxyRegistration) -> ProxyRegistration:
    return ProxyRegistration(
        proxy_id=msg.proxy_id,
        endpoints=dict(msg.endpoints),
        zone=msg.zone,
        namespaces=frozenset(msg.namespaces),
        draining=msg.draining,
        load=load_from_pb(msg.load),
        instance_id=msg.instance_id,
        sequence=msg.sequence,
    )


# -- endpoint look-ups ------------------------------------------------------------------------


def query_to_pb(query: EndpointQuery) -> pb.GetEndpointsRequest:
    return pb.GetEndpointsRequest(namespace=query.namespace, network=query.network, zone=query.zone, limit=query.limit)


def query_from_pb(msg: pb.GetEndpointsRequest) -> EndpointQuery:
    return EndpointQuery(
        namespace=msg.namespace, network=msg.network or DEFAULT_NETWORK, zone=msg.zone, limit=msg.limit
    )


def answer_to_pb(proxies: list[ProxyEndpoint]) -> pb.GetEndpointsResponse:
    return pb.GetEndpointsResponse(
        endpoints=distinct_endpoints(proxies),
        proxies=[
            pb.ProxyEndpoint(proxy_id=p.proxy_id, zone=p.zone, endpoint=p.endpoint, load=load_to_pb(p.load))
            for p in proxies
        ],
    )


def answer_from_pb(msg: pb.GetEndpointsResponse) -> list[ProxyEndpoint]:
    return [
        ProxyEndpoint(proxy_id=p.proxy_id, zone=p.zone, endpoint=p.endpoint, load=load_from_pb(p.load))
        for p in msg.proxies
    ]


# -- listings -----------------------------------------------------------------------------------


def status_to_pb(status: ProxyStatus) -> pb.ProxyStatus:
    return pb.ProxyStatus(
        proxy_id=status.proxy_id,
        endpoints=dict(status.endpoints),
        zone=status.zone,
        namespaces=sorted(status.namespaces),
        draining=status.draining,
        load=load_to_pb(status.load),
        last_heartbeat_age_s=status.last_heartbeat_age_s,
    )


def status_from_pb(msg: pb.ProxyStatus) -> ProxyStatus:
    return ProxyStatus(
        proxy_id=msg.proxy_id,
        endpoints=dict(msg.endpoints),
        zone=msg.zone,
        namespaces=frozenset(msg.namespaces),
        draining=msg.draining,
        load=load_from_pb(msg.load),
        last_heartbeat_age_s=msg.last_heartbeat_age_s,
    )
