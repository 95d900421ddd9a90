"""Conversions between the `broker.client.api` dataclasses and the `sluice.internal.v1` Broker messages.

The one place that maps one to the other, used by both ends of the internal RPC: the servicer
(`broker/service.py`) decodes requests and encodes results, the client (`broker/client/remote.py`) the
reverse. Nothing else in the broker sees protobuf.

Invariants:
- `x_from_pb(x_to_pb(v)) == v` for every value the dataclasses can hold within the wire ranges
  (int32 queue ids and counts, int64 offsets and times); tests/unit/test_broker_convert.py checks it.
- `None` (tag, message_group, a pop's queue id) travels as an absent `optional` field, never as "".
- Enum numbers from the wire are checked: an unknown one is a `BadRequest` naming the field (the
  peer speaks a version we do not know), never a crash. Enums of broker/client/api.py accept 0
  (UNSPECIFIED) as their dataclass default; `OffsetPolicy` has no default and rejects it.

Send and Pop carry batches of messages on the hot path, so the message converters build each
protobuf message with one constructor call and map enum numbers through dicts, not enum calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, TypeVar

from broker.client.api import (
    AckResult,
    BackoffKind,
    BrokerInfo,
    CallContext,
    ConnectedClient,
    ConsumeFrom,
    FilterKind,
    FilterSpec,
    GroupInfo,
    GroupQueueStatus,
    GroupSpec,
    GroupStatus,
    LiteAction,
    LiteOffset,
    LiteOffsetPolicy,
    LiteRemoval,
    LiteSync,
    LiteTopicInfo,
    LiteTopicList,
    OffsetPolicy,
    PopRequest,
    PullResult,
    QueueStatus,
    RetryPolicy,
    SendResult,
    StoredMessage,
    TierEvictResult,
    TierQueueStatus,
    TierStatus,
    TierTopicStatus,
    TopicSpec,
    TopicStatus,
    TraceEvent,
    TraceKind,
    TransactionCheck,
    TransactionResolution,
    TransactionSource,
)
from common.errors import BadRequest, error_for_code
from common.model import MESSAGE_TYPES, MessageType, Permission
from common.record import decode, stored_bytes
from proto.rpc import wire_error
from proto.sluice.internal.v1 import broker_pb2 as pb

E = TypeVar("E", bound=Enum)

# Largest request or response on the internal RPC, for both ends. Bodies reach 4 MiB
# (`LimitsConfig.max_body_bytes`) and travel in batches of up to 32 (pop) messages: 32 x 4 MiB
# plus properties and headers stays below this.
MAX_MESSAGE_BYTES = 130 * 1024 * 1024

_PERMISSIONS: dict[int, Permission] = {int(p): p for p in Permission}

# api enum -> wire number; the reverse tables also map 0 (UNSPECIFIED) to the dataclass default.
_CONSUME_FROM_TO_PB = {
    ConsumeFrom.LATEST: pb.CONSUME_FROM_LATEST,
    ConsumeFrom.EARLIEST: pb.CONSUME_FROM_EARLIEST,
    ConsumeFrom.TIMESTAMP: pb.CONSUME_FROM_TIMESTAMP,
}
_CONSUME_FROM_FROM_PB = {v: k for k, v in _CONSUME_FROM_TO_PB.items()} | {
    pb.CONSUME_FROM_UNSPECIFIED: GroupSpec("").consume_from
}
_BACKOFF_TO_PB = {
    BackoffKind.EXPONENTIAL: pb.BACKOFF_KIND_EXPONENTIAL,
    BackoffKind.CUSTOMIZED: pb.BACKOFF_KIND_CUSTOMIZED,
}
_BACKOFF_FROM_PB = {v: k for k, v in _BACKOFF_TO_PB.items()} | {pb.BACKOFF_KIND_UNSPECIFIED: RetryPolicy().kind}
_FILTER_TO_PB = {FilterKind.TAG: pb.FILTER_KIND_TAG, FilterKind.SQL: pb.FILTER_KIND_SQL}
_FILTER_FROM_PB = {v: k for k, v in _FILTER_TO_PB.items()} | {pb.FILTER_KIND_UNSPECIFIED: FilterSpec().kind}
_OFFSET_POLICY_TO_PB = {
    OffsetPolicy.BEGINNING: pb.OFFSET_POLICY_BEGINNING,
    OffsetPolicy.END: pb.OFFSET_POLICY_END,
    OffsetPolicy.TIMESTAMP: pb.OFFSET_POLICY_TIMESTAMP,
}
_OFFSET_POLICY_FROM_PB = {v: k for k, v in _OFFSET_POLICY_TO_PB.items()}


def _lookup(table: Mapping[Any, E], value: int, what: str) -> E:
    try:
        return table[value]
    except KeyError:
        known = ", ".join(f"{number}={member.name}" for number, member in sorted(table.items()))
        raise BadRequest(f"unknown {what} {value}; known: {known}") from None


def message_types_from_pb(values: Iterable[int]) -> frozenset[MessageType]:
    return frozenset(_lookup(MESSAGE_TYPES, v, "message type") for v in values)


def message_types_to_pb(types: Iterable[MessageType]) -> list[int]:
    return sorted(int(t) for t in types)


def permission_from_pb(value: int) -> Permission:
    return _lookup(_PERMISSIONS, value, "permission")


def offset_policy_to_pb(policy: OffsetPolicy) -> pb.OffsetPolicy:
    return _OFFSET_POLICY_TO_PB[policy]


def offset_policy_from_pb(value: int) -> OffsetPolicy:
    return _lookup(_OFFSET_POLICY_FROM_PB, value, "offset policy")


# -- topics -------------------------------------------------------------------------------------


def topic_spec_to_pb(spec: TopicSpec) -> pb.TopicSpec:
    return pb.TopicSpec(
        name=spec.name,
        queue_count=spec.queue_count,
        message_types=message_types_to_pb(spec.message_types),
        permission=int(spec.permission),
        max_priority=spec.max_priority,
        lite_expiration_s=spec.lite_expiration_s,
        max_lite_topics=spec.max_lite_topics,
    )


_DEFAULT_SPEC = TopicSpec("-")


def topic_spec_from_pb(msg: pb.TopicSpec) -> TopicSpec:
    return TopicSpec(
        name=msg.name,
        queue_count=msg.queue_count,
        message_types=message_types_from_pb(msg.message_types),
        permission=permission_from_pb(msg.permission),
        max_priority=msg.max_priority if msg.HasField("max_priority") else _DEFAULT_SPEC.max_priority,
        lite_expiration_s=msg.lite_expiration_s
        if msg.HasField("lite_expiration_s")
        else _DEFAULT_SPEC.lite_expiration_s,
        max_lite_topics=msg.max_lite_topics,
    )


def topic_status_to_pb(status: TopicStatus) -> pb.TopicStatus:
    return pb.TopicStatus(
        spec=topic_spec_to_pb(status.spec),
        queues=[
            pb.QueueStatus(
                queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset, acked_offset=q.acked_offset
            )
            for q in status.queues
        ],
        half_messages=status.half_messages,
        pending_timers=status.pending_timers,
        local_bytes=status.local_bytes,
        delivered=status.delivered,
    )


def topic_status_from_pb(msg: pb.TopicStatus) -> TopicStatus:
    return TopicStatus(
        spec=topic_spec_from_pb(msg.spec),
        queues=tuple(QueueStatus(q.queue_id, q.min_offset, q.max_offset, q.acked_offset) for q in msg.queues),
        half_messages=msg.half_messages,
        pending_timers=msg.pending_timers,
        local_bytes=msg.local_bytes,
        delivered=msg.delivered,
    )


# -- consumer groups ----------------------------------------------------------------------------


def retry_policy_to_pb(policy: RetryPolicy) -> pb.RetryPolicy:
    return pb.RetryPolicy(
        kind=_BACKOFF_TO_PB[policy.kind],
        initial_ms=policy.initial_ms,
        max_ms=policy.max_ms,
        multiplier=policy.multiplier,
        customized_ms=policy.customized_ms,
    )


def retry_policy_from_pb(msg: pb.RetryPolicy) -> RetryPolicy:
    return RetryPolicy(
        kind=_lookup(_BACKOFF_FROM_PB, msg.kind, "backoff kind"),
        initial_ms=msg.initial_ms,
        max_ms=msg.max_ms,
        multiplier=msg.multiplier,
        customized_ms=tuple(msg.customized_ms),
    )


def group_spec_to_pb(spec: GroupSpec) -> pb.GroupSpec:
    return pb.GroupSpec(
        name=spec.name,
        fifo=spec.fifo,
        max_delivery_attempts=spec.max_delivery_attempts,
        retry_policy=retry_policy_to_pb(spec.retry_policy),
        consume_from=_CONSUME_FROM_TO_PB[spec.consume_from],
        consume_from_timestamp_ms=spec.consume_from_timestamp_ms,
    )


def group_spec_from_pb(msg: pb.GroupSpec) -> GroupSpec:
    return GroupSpec(
        name=msg.name,
        fifo=msg.fifo,
        max_delivery_attempts=msg.max_delivery_attempts,
        retry_policy=retry_policy_from_pb(msg.retry_policy) if msg.HasField("retry_policy") else RetryPolicy(),
        consume_from=_lookup(_CONSUME_FROM_FROM_PB, msg.consume_from, "consume-from policy"),
        consume_from_timestamp_ms=msg.consume_from_timestamp_ms,
    )


def group_info_to_pb(info: GroupInfo) -> pb.GroupInfo:
    return pb.GroupInfo(spec=group_spec_to_pb(info.spec), created_ms=info.created_ms)


def group_info_from_pb(msg: pb.GroupInfo) -> GroupInfo:
    return GroupInfo(spec=group_spec_from_pb(msg.spec), created_ms=msg.created_ms)


def group_status_to_pb(status: GroupStatus) -> pb.GroupStatus:
    return pb.GroupStatus(
        info=group_info_to_pb(status.info),
        queues=[
            pb.GroupQueueStatus(
                topic=q.topic,
                queue_id=q.queue_id,
                consumed_offset=q.consumed_offset,
                max_offset=q.max_offset,
                lag=q.lag,
                in_flight=q.in_flight,
                retrying=q.retrying,
                ready=q.ready,
                due=q.due,
                ready_bytes=q.ready_bytes,
            )
            for q in status.queues
        ],
    )


def group_status_from_pb(msg: pb.GroupStatus) -> GroupStatus:
    return GroupStatus(
        info=group_info_from_pb(msg.info),
        queues=tuple(
            GroupQueueStatus(
                q.topic,
                q.queue_id,
                q.consumed_offset,
                q.max_offset,
                q.lag,
                q.in_flight,
                q.retrying,
                q.ready,
                q.due,
                q.ready_bytes,
            )
            for q in msg.queues
        ),
    )


# -- messages (hot path) ------------------------------------------------------------------------
#
# Measured with upb: passing a dict to a protobuf constructor costs more than `update` afterwards,
# and copying an empty map or repeated field out of a message costs more than testing it first.


def context_to_pb(ctx: CallContext, out: pb.CallContext) -> None:
    """Write `ctx` into `out` (a request's own field, filled in place), its deadline as the time
    left now: the receiving process's clock is not this one's."""
    out.SetInParent()  # present even when empty: the send's context, not the call's
    if ctx.request_id:
        out.request_id = ctx.request_id
    if ctx.client_id:
        out.client_id = ctx.client_id
    if ctx.namespace:
        out.namespace = ctx.namespace
    remaining = ctx.remaining_s()
    if remaining is not None:
        out.remaining_ms = max(0, int(remaining * 1000))


def context_from_pb(msg: pb.CallContext) -> CallContext:
    """The context `context_to_pb` wrote, its deadline on this process's clock."""
    deadline = time.monotonic() + msg.remaining_ms / 1000 if msg.HasField("remaining_ms") else None
    return CallContext(msg.request_id, msg.client_id, msg.namespace, deadline)


def stored_to_pb(m: StoredMessage) -> pb.StoredMessage:
    """The record's bytes as stored (`stored_bytes`: unchanged when read from the CommitLog) and the
    delivery's fields; the store host only when the record names none."""
    rec = m.record
    msg = pb.StoredMessage(
        record=stored_bytes(rec), delivery_attempt=m.delivery_attempt, receipt_handle=m.receipt_handle,
        invisible_until_ms=m.invisible_until_ms,
    )  # fmt: skip
    if not rec.store_host:
        msg.store_host = m.store_host
    return msg


def stored_from_pb(msg: pb.StoredMessage) -> StoredMessage:
    """The record decoded once (verified as any read is: magic, size, version, CRC) and the delivery."""
    rec = decode(msg.record, where="the broker's delivered message")
    return StoredMessage(rec, msg.delivery_attempt, msg.receipt_handle, msg.invisible_until_ms, msg.store_host)


def stored_list_to_pb(messages: Iterable[StoredMessage]) -> list[pb.StoredMessage]:
    return [stored_to_pb(m) for m in messages]


def stored_list_from_pb(messages: Iterable[pb.StoredMessage]) -> list[StoredMessage]:
    return [stored_from_pb(m) for m in messages]


def send_result_to_pb(r: SendResult) -> pb.SendResult:
    return pb.SendResult(
        message_id=r.message_id,
        queue_id=r.queue_id,
        queue_offset=r.queue_offset,
        transaction_id=r.transaction_id,
        recall_handle=r.recall_handle,
    )


def send_result_from_pb(msg: pb.SendResult) -> SendResult:
    return SendResult(msg.message_id, msg.queue_id, msg.queue_offset, msg.transaction_id, msg.recall_handle)


# -- consumption --------------------------------------------------------------------------------


def filter_to_pb(spec: FilterSpec) -> pb.FilterSpec:
    return pb.FilterSpec(kind=_FILTER_TO_PB[spec.kind], expression=spec.expression)


def filter_from_pb(msg: pb.FilterSpec) -> FilterSpec:
    return FilterSpec(kind=_lookup(_FILTER_FROM_PB, msg.kind, "filter kind"), expression=msg.expression)


def pop_request_to_pb(request: PopRequest) -> pb.PopRequest:
    return pb.PopRequest(
        group=request.group,
        topic=request.topic,
        queue_id=request.queue_id,  # None leaves the optional field absent: any queue
        max_messages=request.max_messages,
        invisible_ms=request.invisible_ms,
        filter=filter_to_pb(request.filter),
        long_poll_ms=request.long_poll_ms,
        lite_client=request.lite_client,
        lite_window=request.lite_window,
    )


def pop_request_from_pb(msg: pb.PopRequest) -> PopRequest:
    return PopRequest(
        group=msg.group,
        topic=msg.topic,
        queue_id=msg.queue_id if msg.HasField("queue_id") else None,
        max_messages=msg.max_messages,
        invisible_ms=msg.invisible_ms,
        filter=filter_or_default(msg),
        long_poll_ms=msg.long_poll_ms,
        lite_client=msg.lite_client,
        lite_window=max(1, msg.lite_window),
    )


def ack_result_to_pb(r: AckResult) -> pb.AckResult:
    if r.error is None:
        return pb.AckResult(receipt_handle=r.receipt_handle, ok=True)
    code, message = wire_error(r.error)
    return pb.AckResult(receipt_handle=r.receipt_handle, ok=False, error_code=int(code), error_message=message)


def ack_result_from_pb(msg: pb.AckResult) -> AckResult:
    if msg.ok:
        return AckResult(msg.receipt_handle)
    return AckResult(msg.receipt_handle, error_for_code(msg.error_code, msg.error_message))


def pull_result_to_pb(result: PullResult) -> pb.PullResult:
    return pb.PullResult(
        messages=stored_list_to_pb(result.messages),
        next_offset=result.next_offset,
        min_offset=result.min_offset,
        max_offset=result.max_offset,
    )


def pull_result_from_pb(msg: pb.PullResult) -> PullResult:
    return PullResult(
        messages=stored_list_from_pb(msg.messages),
        next_offset=msg.next_offset,
        min_offset=msg.min_offset,
        max_offset=msg.max_offset,
    )


def filter_or_default(msg: Any) -> FilterSpec:
    """The filter of a request that has an optional `filter` field (absent: tag "*")."""
    return filter_from_pb(msg.filter) if msg.HasField("filter") else FilterSpec()


# -- transactions -------------------------------------------------------------------------------

_RESOLUTIONS: dict[int, TransactionResolution] = {r.value: r for r in TransactionResolution}
_SOURCES: dict[int, TransactionSource] = {s.value: s for s in TransactionSource}


def resolution_from_pb(value: int) -> TransactionResolution:
    return _lookup(_RESOLUTIONS, value, "transaction resolution")


def source_from_pb(value: int) -> TransactionSource:
    return _lookup(_SOURCES, value, "transaction source")


def transaction_check_to_pb(check: TransactionCheck) -> pb.TransactionCheck:
    return pb.TransactionCheck(
        transaction_id=check.transaction_id, message=stored_to_pb(check.message), check=check.check
    )


def transaction_check_from_pb(msg: pb.TransactionCheck) -> TransactionCheck:
    return TransactionCheck(msg.transaction_id, stored_from_pb(msg.message), msg.check)


# -- message trace (appended) ---------------------------------------------------------------------


def trace_event_to_pb(e: TraceEvent) -> pb.TraceEvent:
    return pb.TraceEvent(kind=e.kind.value, time_ms=e.time_ms, topic=e.topic, queue_id=e.queue_id,
                         queue_offset=e.queue_offset, message_id=e.message_id, group=e.group, attempt=e.attempt,
                         client_id=e.client_id, detail=e.detail)  # fmt: skip


def trace_event_from_pb(e: pb.TraceEvent) -> TraceEvent:
    try:
        kind = TraceKind(e.kind)
    except ValueError:
        raise BadRequest(f"unknown trace event kind {e.kind!r}") from None
    return TraceEvent(kind=kind, time_ms=e.time_ms, topic=e.topic, queue_id=e.queue_id, queue_offset=e.queue_offset,
                      message_id=e.message_id, group=e.group, attempt=e.attempt, client_id=e.client_id,
                      detail=dict(e.detail))  # fmt: skip


# -- tiered storage -------------------------------------------------------------------------------


def tier_topic_status_to_pb(st: TierTopicStatus) -> pb.TierTopicStatus:
    return pb.TierTopicStatus(
        topic=st.topic,
        queues=[
            pb.TierQueueStatus(queue_id=q.queue_id, local_min=q.local_min, local_max=q.local_max,
                               tiered_min=q.tiered_min, tiered_end=q.tiered_end)
            for q in st.queues
        ],
        lag_messages=st.lag_messages, lag_s=st.lag_s, bytes=st.bytes, objects=st.objects,
        last_error=st.last_error, failures=st.failures, last_upload_ms=st.last_upload_ms,
    )  # fmt: skip


def tier_topic_status_from_pb(msg: pb.TierTopicStatus) -> TierTopicStatus:
    return TierTopicStatus(
        msg.topic,
        tuple(TierQueueStatus(q.queue_id, q.local_min, q.local_max, q.tiered_min, q.tiered_end) for q in msg.queues),
        msg.lag_messages, msg.lag_s, msg.bytes, msg.objects, msg.last_error, msg.failures, msg.last_upload_ms,
    )  # fmt: skip


def tier_status_to_pb(st: TierStatus) -> pb.TierStatusResponse:
    return pb.TierStatusResponse(
        enabled=st.enabled, store=st.store, topics=[tier_topic_status_to_pb(t) for t in st.topics],
        puts=st.puts, put_bytes=st.put_bytes, gets=st.gets, get_bytes=st.get_bytes,
    )  # fmt: skip


def tier_status_from_pb(msg: pb.TierStatusResponse) -> TierStatus:
    return TierStatus(
        msg.enabled, msg.store, tuple(tier_topic_status_from_pb(t) for t in msg.topics),
        msg.puts, msg.put_bytes, msg.gets, msg.get_bytes,
    )  # fmt: skip


def tier_evict_to_pb(r: TierEvictResult) -> pb.TierEvictLocalResponse:
    return pb.TierEvictLocalResponse(topic=r.topic, messages=r.messages, segments=r.segments)


def tier_evict_from_pb(msg: pb.TierEvictLocalResponse) -> TierEvictResult:
    return TierEvictResult(msg.topic, msg.messages, msg.segments)


# -- operations -----------------------------------------------------------------------------------


def connected_client_to_pb(c: ConnectedClient) -> pb.ConnectedClient:
    return pb.ConnectedClient(
        client_id=c.client_id, language=c.language, version=c.version, client_type=c.client_type,
        address=c.address, proxy=c.proxy, group=c.group, topics=list(c.topics), last_seen_ms=c.last_seen_ms,
        detail=c.detail,
    )  # fmt: skip


def connected_client_from_pb(msg: pb.ConnectedClient) -> ConnectedClient:
    return ConnectedClient(msg.client_id, msg.language, msg.version, msg.client_type, msg.address, msg.proxy,
                           msg.group, tuple(msg.topics), msg.last_seen_ms, msg.detail)  # fmt: skip


# -- lite topics ----------------------------------------------------------------------------------


def lite_sync_to_pb(sync: LiteSync) -> pb.SyncLiteSubscriptionRequest:
    out = pb.SyncLiteSubscriptionRequest(
        group=sync.group, topic=sync.topic, client_id=sync.client_id, action=sync.action.value,
        lite_topics=list(sync.lite_topics), version=sync.version, quota=sync.quota, filters=sync.filters,
    )  # fmt: skip
    o = sync.offset
    if o is not None:
        out.offset.CopyFrom(pb.LiteOffset(policy=0 if o.policy is None else o.policy.value + 1, offset=o.offset,
                                          tail_n=o.tail_n, timestamp_ms=o.timestamp_ms))  # fmt: skip
    return out


def lite_sync_from_pb(msg: pb.SyncLiteSubscriptionRequest) -> LiteSync:
    offset = None
    if msg.HasField("offset"):
        o = msg.offset
        policy = None if o.policy == 0 else _lookup({p.value + 1: p for p in LiteOffsetPolicy}, o.policy, "policy")
        offset = LiteOffset(policy, o.offset if o.HasField("offset") else None,
                            o.tail_n if o.HasField("tail_n") else None,
                            o.timestamp_ms if o.HasField("timestamp_ms") else None)  # fmt: skip
    action = _lookup({a.value: a for a in LiteAction}, msg.action, "lite subscription action")
    return LiteSync(msg.group, msg.topic, msg.client_id, action, tuple(msg.lite_topics), msg.version, offset,
                    msg.quota, msg.filters)  # fmt: skip


def lite_list_to_pb(result: LiteTopicList) -> pb.ListLiteTopicsResponse:
    return pb.ListLiteTopicsResponse(topic=result.topic, count=result.count, topics=[
        pb.LiteTopicInfo(name=t.name, backlog=t.backlog, last_write_ms=t.last_write_ms, created_ms=t.created_ms,
                         subscribers=t.subscribers) for t in result.topics])  # fmt: skip


def lite_list_from_pb(msg: pb.ListLiteTopicsResponse) -> LiteTopicList:
    infos = (LiteTopicInfo(t.name, t.backlog, t.last_write_ms, t.created_ms, t.subscribers) for t in msg.topics)
    return LiteTopicList(msg.topic, msg.count, tuple(infos))


def lite_removals_to_pb(removals: list[LiteRemoval]) -> pb.ClaimLiteRemovalsResponse:
    return pb.ClaimLiteRemovalsResponse(removals=[
        pb.LiteRemoval(client_id=r.client_id, group=r.group, topic=r.topic, lite_topic=r.lite_topic)
        for r in removals])  # fmt: skip


def lite_removals_from_pb(msg: pb.ClaimLiteRemovalsResponse) -> list[LiteRemoval]:
    return [LiteRemoval(r.client_id, r.group, r.topic, r.lite_topic) for r in msg.removals]


# -- broker information ---------------------------------------------------------------------------


def broker_info_to_pb(info: BrokerInfo) -> pb.BrokerInfoResponse:
    return pb.BrokerInfoResponse(
        version=info.version, started_ms=info.started_ms, disk_used_bytes=info.disk_used_bytes,
        disk_total_bytes=info.disk_total_bytes, store_bytes=info.store_bytes, unflushed_bytes=info.unflushed_bytes,
        dispatch_lag_bytes=info.dispatch_lag_bytes, dispatch_lag_ms=info.dispatch_lag_ms,
    )  # fmt: skip


def broker_info_from_pb(msg: pb.BrokerInfoResponse) -> BrokerInfo:
    return BrokerInfo(msg.version, msg.started_ms, msg.disk_used_bytes, msg.disk_total_bytes, msg.store_bytes,
                      msg.unflushed_bytes, msg.dispatch_lag_bytes, msg.dispatch_lag_ms)  # fmt: skip
