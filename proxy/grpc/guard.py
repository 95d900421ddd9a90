"""Admission at the edge: who is calling (signature), may they (access rules), and is there room
(in-flight bound, rate limits) — checked before a request reaches the core, so a refused request
stores and delivers nothing.

`resources` reads the topics and groups an RPC touches from its protobuf request, as short names
in their namespace (the `resource_namespace` of each Resource, else the `x-mq-namespace` header);
access rules are scoped to namespaces, so a rule of namespace A never matches a resource of B.

What each RPC needs: QueryRoute PUB or SUB on the topic; SendMessage, EndTransaction and
RecallMessage PUB on the topic; Heartbeat SUB on its group if it names one; QueryAssignment,
ReceiveMessage, Ack, ChangeInvisibleDuration, ForwardToDLQ, SyncLiteSubscription (the bind topic),
Pull and the offset RPCs SUB on the
group and the topic they name; NotifyClientTermination and Telemetry only a valid signature.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from common.errors import TooManyRequests, Unavailable
from common.security import Action, ResourceKind
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.context import RequestContext

Need = tuple[ResourceKind, str, str, tuple[Action, ...]]  # kind, namespace, short name, any of these actions

_PUB = (Action.PUB,)
_SUB = (Action.SUB,)
_ROUTE = (Action.PUB, Action.SUB)


def _res(kind: ResourceKind, resource: pb.Resource, ctx: RequestContext, actions: tuple[Action, ...]) -> Need:
    return (kind, resource.resource_namespace or ctx.namespace, resource.name, actions)


def resources(request: Any, ctx: RequestContext) -> Iterator[Need]:
    """The (kind, namespace, name, actions) an RPC's request needs; nothing for auth-only RPCs."""
    topic, group = ResourceKind.TOPIC, ResourceKind.GROUP
    if isinstance(request, spb.SendMessageRequest):
        for msg in request.messages:
            yield _res(topic, msg.topic, ctx, _PUB)
    elif isinstance(request, spb.QueryRouteRequest):
        yield _res(topic, request.topic, ctx, _ROUTE)
    elif isinstance(request, (spb.EndTransactionRequest, spb.RecallMessageRequest)):
        yield _res(topic, request.topic, ctx, _PUB)
    elif isinstance(request, spb.HeartbeatRequest | spb.NotifyClientTerminationRequest):
        if isinstance(request, spb.HeartbeatRequest) and request.HasField("group") and request.group.name:
            yield _res(group, request.group, ctx, _SUB)
    elif isinstance(request, (spb.QueryAssignmentRequest, spb.AckMessageRequest, spb.ChangeInvisibleDurationRequest,
                              spb.ForwardMessageToDeadLetterQueueRequest,
                              spb.SyncLiteSubscriptionRequest)):  # fmt: skip
        yield _res(group, request.group, ctx, _SUB)
        yield _res(topic, request.topic, ctx, _SUB)
    elif isinstance(request, (spb.ReceiveMessageRequest, spb.PullMessageRequest, spb.UpdateOffsetRequest,
                              spb.GetOffsetRequest)):  # fmt: skip
        yield _res(group, request.group, ctx, _SUB)
        yield _res(topic, request.message_queue.topic, ctx, _SUB)
    elif isinstance(request, spb.QueryOffsetRequest):
        yield _res(topic, request.message_queue.topic, ctx, _SUB)


def admit(app: ProxyApp, ctx: RequestContext, request: Any) -> None:
    """Raise TooManyRequests, Unauthorized, Forbidden or Unavailable unless `request` may proceed."""
    if app.in_flight > app.config.flow.max_in_flight:  # the caller already counts this request
        raise TooManyRequests(f"this proxy is working on {app.config.flow.max_in_flight} requests; retry shortly")
    if app.config.auth.enabled:
        authenticate(app, ctx, request)
    if isinstance(request, spb.SendMessageRequest) and app.flow.limited:  # totals cost a read per message
        _admit_produce(app, ctx, request)
    elif isinstance(request, spb.ReceiveMessageRequest):
        app.flow.admit_receive(request.group.resource_namespace or ctx.namespace, request.group.name)


def authenticate(app: ProxyApp, ctx: RequestContext, request: Any) -> None:
    if app.access.version < 0:
        raise Unavailable("this proxy has not loaded the cluster's users yet (are the brokers reachable?); retry")
    access_key = app.access.authenticate(ctx.authorization, ctx.date_time)
    for kind, namespace, name, actions in resources(request, ctx):
        app.access.authorize(access_key, namespace, kind, name, *actions)


def _admit_produce(app: ProxyApp, ctx: RequestContext, request: spb.SendMessageRequest) -> None:
    totals: dict[tuple[str, str], list[int]] = {}
    for msg in request.messages:
        entry = totals.setdefault((msg.topic.resource_namespace or ctx.namespace, msg.topic.name), [0, 0])
        entry[0] += 1
        entry[1] += len(msg.body)
    for (namespace, topic), (count, size) in totals.items():
        app.flow.admit_produce(namespace, topic, count, size)
