"""Conversions between `nameserver.model` dataclasses and `sluice.internal.v1` NameServer messages.

The only module of the NameServer besides the service and the client that sees protobuf. Enum
values travel as their `common.model` numbers; a number outside the enum is a BadRequest (the
peer speaks a version we do not know), never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.errors import BadRequest
from common.model import MessageType, Permission, TopicInfo
from nameserver.model import BrokerQueues, BrokerRegistration, BrokerStatus, TopicRoute, TopicSummary
from proto.sluice.internal.v1 import nameserver_pb2 as pb


def permission_from_pb(value: int) -> Permission:
    try:
        return Permission(value)
    except ValueError:
        raise BadRequest(f"unknown permission {value}; known: {_known(Permission)}") from None


def message_types_from_pb(values: Iterable[int]) -> frozenset[MessageType]:
    types = set()
    for value in values:
        try:
            types.add(MessageType(value))
        except ValueError:
            raise BadRequest(f"unknown message type {value}; known: {_known(MessageType)}") from None
    return frozenset(types)


def message_types_to_pb(types: Iterable[MessageType]) -> list[int]:
    return sorted(int(t) for t in types)


def _known(enum_cls: type[Permission] | type[MessageType]) -> str:
    return ", ".join(f"{int(m)}={m.name}" for m in enum_cls)


# -- registration -------------------------------------------------------------------------------


def registration_to_pb(registration: BrokerRegistration) -> pb.BrokerRegistration:
    return pb.BrokerRegistration(
        cluster_name=registration.cluster_name,
        broker_name=registration.broker_name,
        address=registration.address,
        topics=[
            pb.TopicEntry(
                name=t.name,
                queue_count=t.queue_count,
                permission=int(t.permission),
                message_types=message_types_to_pb(t.message_types),
            )
            for t in registration.topics
        ],
        instance_id=registration.instance_id,
        sequence=registration.sequence,
        client_endpoint=registration.client_endpoint,
        epoch=registration.epoch,
    )


def registration_from_pb(msg: pb.BrokerRegistration) -> BrokerRegistration:
    return BrokerRegistration(
        cluster_name=msg.cluster_name,
        broker_name=msg.broker_name,
        address=msg.address,
        topics=tuple(
            TopicInfo(
                name=t.name,
                queue_count=t.queue_count,
                permission=permission_from_pb(t.permission),
                message_types=message_types_from_pb(t.message_types),
            )
            for t in msg.topics
        ),
        instance_id=msg.instance_id,
        sequence=msg.sequence,
        client_endpoint=msg.client_endpoint,
        epoch=msg.epoch,
    )


# -- route --------------------------------------------------------------------------------------


def route_to_pb(route: TopicRoute) -> pb.TopicRoute:
    return pb.TopicRoute(
        topic=route.topic,
        young=route.young,
        brokers=[
            pb.BrokerQueues(
                broker_name=b.broker_name,
                address=b.address,
                cluster_name=b.cluster_name,
                queue_count=b.queue_count,
                permission=int(b.permission),
                message_types=message_types_to_pb(b.message_types),
                client_endpoint=b.client_endpoint,
            )
            for b in route.brokers
        ],
    )


def route_from_pb(msg: pb.TopicRoute) -> TopicRoute:
    return TopicRoute(
        topic=msg.topic,
        brokers=tuple(
            BrokerQueues(
                broker_name=b.broker_name,
                address=b.address,
                cluster_name=b.cluster_name,
                queue_count=b.queue_count,
                permission=permission_from_pb(b.permission),
                message_types=message_types_from_pb(b.message_types),
                client_endpoint=b.client_endpoint,
            )
            for b in msg.brokers
        ),
        young=msg.young,
    )


# -- listings -----------------------------------------------------------------------------------


def broker_status_to_pb(status: BrokerStatus) -> pb.BrokerStatus:
    return pb.BrokerStatus(
        cluster_name=status.cluster_name,
        broker_name=status.broker_name,
        address=status.address,
        topic_count=status.topic_count,
        last_heartbeat_age_s=status.last_heartbeat_age_s,
        client_endpoint=status.client_endpoint,
    )


def broker_status_from_pb(msg: pb.BrokerStatus) -> BrokerStatus:
    return BrokerStatus(
        cluster_name=msg.cluster_name,
        broker_name=msg.broker_name,
        address=msg.address,
        topic_count=msg.topic_count,
        last_heartbeat_age_s=msg.last_heartbeat_age_s,
        client_endpoint=msg.client_endpoint,
    )


def topic_summary_to_pb(summary: TopicSummary) -> pb.TopicSummary:
    return pb.TopicSummary(
        name=summary.name,
        broker_names=list(summary.broker_names),
        queue_count=summary.queue_count,
        message_types=message_types_to_pb(summary.message_types),
    )


def topic_summary_from_pb(msg: pb.TopicSummary) -> TopicSummary:
    return TopicSummary(
        name=msg.name,
        broker_names=tuple(msg.broker_names),
        queue_count=msg.queue_count,
        message_types=message_types_from_pb(msg.message_types),
    )
