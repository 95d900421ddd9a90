"""SyncLiteSubscription at the edge, and removal notices as Telemetry commands (docs/lite-topics.md)."""

from __future__ import annotations

import asyncio

from broker.client.api import LiteAction, LiteOffset, LiteOffsetPolicy, LiteRemoval, LiteSync
from common.errors import BadRequest, ClientIdRequired
from common.model import validate_lite_topic_name
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.core.lite import Notify
from proxy.grpc import convert
from proxy.grpc.status import OK

_ACTIONS = {a.value: a for a in LiteAction}
_POLICIES = {p.value: p for p in LiteOffsetPolicy}
LITE_CLIENT_TYPES = (pb.LITE_PUSH_CONSUMER, pb.LITE_SIMPLE_CONSUMER)


def offset_option(option: pb.OffsetOption) -> LiteOffset | None:
    kind = option.WhichOneof("offset_type")
    if kind == "policy":
        return LiteOffset(policy=_POLICIES[int(option.policy)])
    if kind == "offset":
        if option.offset < 0:
            raise BadRequest(f"offset {option.offset} is negative")
        return LiteOffset(offset=option.offset)
    if kind == "tail_n":
        if option.tail_n < 0:
            raise BadRequest(f"tail_n {option.tail_n} is negative")
        return LiteOffset(tail_n=option.tail_n)
    if kind == "timestamp":
        return LiteOffset(timestamp_ms=option.timestamp)
    return None


async def sync_lite_subscription(
    app: ProxyApp, ctx: RequestContext, request: spb.SyncLiteSubscriptionRequest
) -> spb.SyncLiteSubscriptionResponse:
    _, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
    _, topic = convert.resource_name(request.topic, ctx.namespace)
    if not ctx.client_id:
        raise ClientIdRequired("SyncLiteSubscription needs the client id header (x-mq-client-id)")
    action = _ACTIONS.get(int(request.action))
    if action is None:
        raise BadRequest(f"unknown lite subscription action {request.action}")
    limit = app.config.settings.max_lite_topic_chars
    wanted = list(request.lite_topic_set)
    if python_split_name(ctx, action, wanted):
        wanted = ["".join(wanted)]
    lite_topics = tuple(dict.fromkeys(validate_lite_topic_name(n, limit) for n in wanted))
    offset = offset_option(request.offset_option) if request.HasField("offset_option") else None
    version = request.version if request.HasField("version") else 0
    await app.lite.sync(LiteSync(group, topic, ctx.client_id, action, lite_topics, version, offset))
    return spb.SyncLiteSubscriptionResponse(status=OK)


def python_split_name(ctx: RequestContext, action: LiteAction, names: list[str]) -> bool:
    """The Python client (5.1.2) builds a subscribe_lite request with `lite_topic_set.extend(name)`,
    which sends the name's characters one by one, in order. Its API subscribes one lite topic per
    PARTIAL_ADD (several names only travel in its COMPLETE_ADD resync), so a PARTIAL_ADD of several
    one-character names from it is one name split up: the proxy joins it again."""
    return (
        action is LiteAction.PARTIAL_ADD
        and ctx.language.upper() == "PYTHON"
        and len(names) > 1
        and all(len(n) == 1 for n in names)
    )


def removal_notify(out: asyncio.Queue[spb.TelemetryCommand | None], max_queued: int, namespace: str) -> Notify:
    """A `Notify` that enqueues a NotifyUnsubscribeLiteCommand on one Telemetry stream."""

    def notify(removal: LiteRemoval) -> bool:
        if out.qsize() >= max_queued:
            return False
        command = spb.NotifyUnsubscribeLiteCommand(lite_topic=removal.lite_topic)
        out.put_nowait(spb.TelemetryCommand(notify_unsubscribe_lite_command=command))
        return True

    return notify
