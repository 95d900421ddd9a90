"""Consumption RPCs at the edge: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue, and the offset-based PullMessage / UpdateOffset / GetOffset /
QueryOffset.

ReceiveMessage answers with exactly one status frame (OK, MESSAGE_NOT_FOUND when nothing came
within the long poll, or the error), the messages, a delivery timestamp, and then ends the stream:
the official clients only process a receive at end of stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from broker.client import receipt
from broker.client.api import FilterKind, FilterSpec, MessagingApi, OffsetPolicy
from common import metrics
from common.codes import Code
from common.errors import (
    BadRequest,
    IllegalFilterExpression,
    IllegalInvisibleTime,
    IllegalOffset,
    IllegalPollingTime,
    InvalidReceiptHandle,
)
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.core.consumer import ReceiveSpec
from proxy.core.routing import real_broker
from proxy.grpc import convert
from proxy.grpc.status import OK, common_status, status, status_of

DEFAULT_INVISIBLE_MS = 30_000
PULL_BATCH = 32  # messages a pull asks for when its batch_size is 0


def filter_spec(expr: pb.FilterExpression) -> FilterSpec:
    if expr.type == pb.SQL:
        if not expr.expression.strip():
            raise IllegalFilterExpression("SQL filter expression is empty")
        return FilterSpec(FilterKind.SQL, expr.expression)
    if expr.type in (pb.TAG, pb.FILTER_TYPE_UNSPECIFIED):
        return FilterSpec(FilterKind.TAG, expr.expression or "*")
    raise IllegalFilterExpression(f"unknown filter type {expr.type}")


def long_poll_ms(
    app: ProxyApp, ctx: RequestContext, request: spb.ReceiveMessageRequest | spb.PullMessageRequest
) -> int:
    """Poll as long as asked, at most `[proxy.input] max_long_polling_ms`, and answer
    `receive.deadline_margin_ms` before the client's deadline (its gRPC timeout). Without a
    `long_polling_timeout`, a receive polls until a second before that, a pull not at all."""
    margin_ms = app.config.receive.deadline_margin_ms
    remaining = ctx.remaining_s()
    budget = None if remaining is None else int(remaining * 1000) - margin_ms
    if request.HasField("long_polling_timeout"):
        wanted = convert.duration_ms(request.long_polling_timeout, "long_polling_timeout", IllegalPollingTime)
        wanted = min(wanted, app.config.input.max_long_polling_ms)
    elif isinstance(request, spb.ReceiveMessageRequest) and budget is not None:
        wanted = min(budget - 1000, app.config.input.max_long_polling_ms)
    else:
        wanted = 0
    if budget is not None:
        wanted = min(wanted, budget)
    if app.fleet.draining:  # answer quickly: the client should move to another proxy
        wanted = min(wanted, app.config.drain_long_poll_ms)
    return max(0, wanted)


def _handle(app: ProxyApp, handle: str) -> str:
    limit = app.config.input.max_handle_bytes
    if len(handle) > limit:
        raise InvalidReceiptHandle(f"the receipt handle is {len(handle)} characters long; Sluice's are at most {limit}")
    return handle


async def receive_message(
    app: ProxyApp, ctx: RequestContext, request: spb.ReceiveMessageRequest
) -> list[spb.ReceiveMessageResponse]:
    """Every frame of the answer, the status frame first.

    The frames are built before the first is written (the clients only act at end of stream
    anyway), so the servicer writes them from a list rather than through a second generator.
    """
    started = time.time_ns() // 1_000_000
    try:
        ns, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
        _, topic = convert.resource_name(request.message_queue.topic, ctx.namespace)
        if request.batch_size < 0:
            raise BadRequest(f"batch size {request.batch_size} is negative")
        if request.auto_renew:
            invisible: int | None = None
        elif request.HasField("invisible_duration"):
            invisible = convert.duration_ms(request.invisible_duration, "invisible_duration", IllegalInvisibleTime)
        else:
            invisible = DEFAULT_INVISIBLE_MS
        spec = ReceiveSpec(group, topic, request.message_queue.broker.name, filter_spec(request.filter_expression),
                           request.batch_size, invisible, long_poll_ms(app, ctx, request))  # fmt: skip
        messages = await app.consumer.receive(ctx, spec)
    except Exception as exc:
        return [spb.ReceiveMessageResponse(status=status_of(exc, "ReceiveMessage"))]
    if not messages:
        return [spb.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))]
    frames = [spb.ReceiveMessageResponse(status=OK)]
    response = spb.ReceiveMessageResponse
    fill = convert.fill_delivered
    for m in messages:
        frame = response()
        fill(frame.message, m, ns)  # in place: no copy of a separately built Message
        frames.append(frame)
    last = response()
    last.delivery_timestamp.FromMilliseconds(started)
    frames.append(last)
    return frames


async def ack_message(app: ProxyApp, ctx: RequestContext, request: spb.AckMessageRequest) -> spb.AckMessageResponse:
    _, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
    _, topic = convert.resource_name(request.topic, ctx.namespace)
    if not request.entries:
        raise BadRequest("the request carries no entry to acknowledge")
    limit = app.config.input.max_ack_entries
    if len(request.entries) > limit:
        raise BadRequest(f"the request acknowledges {len(request.entries)} entries; at most {limit} are accepted")
    handles = [e.receipt_handle for e in request.entries]  # each malformed one fails its own entry
    results = await app.consumer.ack(ctx, group, topic, handles)
    # Entries are filled in place in the response (hot path: once per acknowledged message);
    # passing built messages to a constructor would copy each through a serialise and a parse.
    response = spb.AckMessageResponse()
    add = response.entries.add
    for e, handle, r in zip(request.entries, handles, results, strict=True):
        entry = add(message_id=e.message_id, receipt_handle=handle)
        st = entry.status
        if r.error is None:
            st.code = OK.code
            st.message = OK.message
        else:
            st.CopyFrom(status_of(r.error, "AckMessage"))
    response.status.CopyFrom(common_status(e.status for e in response.entries))
    return response


async def change_invisible_duration(
    app: ProxyApp, ctx: RequestContext, request: spb.ChangeInvisibleDurationRequest
) -> spb.ChangeInvisibleDurationResponse:
    try:
        _, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
        _, topic = convert.resource_name(request.topic, ctx.namespace)
        invisible = convert.duration_ms(request.invisible_duration, "invisible_duration", IllegalInvisibleTime)
        handle = await app.consumer.change_invisible_duration(
            ctx, group, topic, _handle(app, request.receipt_handle), invisible
        )
    except Exception as exc:  # the Python client reads the handle even on failure: echo the old one
        return spb.ChangeInvisibleDurationResponse(
            status=status_of(exc, "ChangeInvisibleDuration"), receipt_handle=request.receipt_handle
        )
    return spb.ChangeInvisibleDurationResponse(status=OK, receipt_handle=handle)


async def forward_to_dead_letter(
    app: ProxyApp, ctx: RequestContext, request: spb.ForwardMessageToDeadLetterQueueRequest
) -> spb.ForwardMessageToDeadLetterQueueResponse:
    _, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
    _, topic = convert.resource_name(request.topic, ctx.namespace)
    try:
        await app.consumer.forward_to_dead_letter(ctx, group, topic, _handle(app, request.receipt_handle))
    except InvalidReceiptHandle:
        receipt.decode(request.receipt_handle)  # a malformed handle is still an error
        # The message is already gone (acked, dead-lettered): OK, or the client retries forever.
    return spb.ForwardMessageToDeadLetterQueueResponse(status=OK)


async def _queue(app: ProxyApp, ctx: RequestContext, mq: pb.MessageQueue) -> tuple[str, MessagingApi, int]:
    """(cluster-wide topic, its broker, queue id) of a message queue given by the client."""
    _, topic = convert.resource_name(mq.topic, ctx.namespace)
    if mq.id < 0:
        raise BadRequest(f"queue id {mq.id} is not a queue")
    name = real_broker(mq.broker.name)
    broker = await app.directory.lookup(name) if name else None
    if broker is None:
        raise BadRequest(f"the message queue names broker {name!r}, which is not part of this cluster; use the "
                         "brokers QueryRoute answers")  # fmt: skip
    return topic, broker, mq.id


async def pull_message(
    app: ProxyApp, ctx: RequestContext, request: spb.PullMessageRequest
) -> AsyncIterator[spb.PullMessageResponse]:
    try:
        ns, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
        topic, broker, qid = await _queue(app, ctx, request.message_queue)
        if request.offset < 0:
            raise IllegalOffset(f"offset {request.offset} is negative")
        if request.batch_size < 0:
            raise BadRequest(f"batch size {request.batch_size} is negative")
        batch = min(request.batch_size or PULL_BATCH, app.config.receive.max_batch_messages)
        result = await broker.pull(
            group, topic, qid, request.offset, batch, filter_spec(request.filter_expression),
            long_poll_ms(app, ctx, request), ctx=ctx,
        )  # fmt: skip
    except Exception as exc:
        yield spb.PullMessageResponse(status=status_of(exc, "PullMessage"))
        return
    if result.messages:
        metrics.count_out(topic, group, len(result.messages), sum(len(m.body) for m in result.messages))
    code = OK if result.messages else status(Code.MESSAGE_NOT_FOUND, "no new message")
    yield spb.PullMessageResponse(status=code)
    for m in result.messages:
        yield spb.PullMessageResponse(message=convert.delivered(m, ns))
    yield spb.PullMessageResponse(next_offset=result.next_offset)


async def update_offset(
    app: ProxyApp, ctx: RequestContext, request: spb.UpdateOffsetRequest
) -> spb.UpdateOffsetResponse:
    _, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
    topic, broker, qid = await _queue(app, ctx, request.message_queue)
    if request.offset < 0:
        raise IllegalOffset(f"offset {request.offset} is negative")
    await broker.update_offset(group, topic, qid, request.offset, ctx=ctx)
    return spb.UpdateOffsetResponse(status=OK)


async def get_offset(app: ProxyApp, ctx: RequestContext, request: spb.GetOffsetRequest) -> spb.GetOffsetResponse:
    _, group = convert.resource_name(request.group, ctx.namespace, "consumer group")
    topic, broker, qid = await _queue(app, ctx, request.message_queue)
    offset = await broker.get_offset(group, topic, qid, ctx=ctx)
    return spb.GetOffsetResponse(status=OK, offset=offset)


async def query_offset(app: ProxyApp, ctx: RequestContext, request: spb.QueryOffsetRequest) -> spb.QueryOffsetResponse:
    topic, broker, qid = await _queue(app, ctx, request.message_queue)
    policy = {pb.BEGINNING: OffsetPolicy.BEGINNING, pb.END: OffsetPolicy.END, pb.TIMESTAMP: OffsetPolicy.TIMESTAMP}
    chosen = policy.get(request.query_offset_policy)
    if chosen is None:
        raise BadRequest(f"unknown query offset policy {request.query_offset_policy}")
    ts = convert.timestamp_ms(request.timestamp, "timestamp") if request.HasField("timestamp") else 0
    offset = await broker.query_offset(topic, qid, chosen, ts, ctx=ctx)
    return spb.QueryOffsetResponse(status=OK, offset=offset)
