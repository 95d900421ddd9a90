"""`RemoteBroker`: `BrokerApi` over the broker's internal gRPC service (the Cluster backend).

One channel of our HTTP/2 gRPC client (common/http2/client.py) to one broker. Each method converts
its arguments (`broker.client.grpc_convert`), makes one unary call (`send`: its part of a SendBatch
call, `ack` of an Ack call, both coalesced) and converts the answer back, so callers see exactly
what a `LocalBroker` returns. Contract:

- Every call has a deadline: `timeout_s`, and for Pop and Pull `long_poll_ms` plus `timeout_s`
  (the long poll happens inside the broker; `timeout_s` is the margin for the rest of the call).
- Errors are `SluiceError`s: a coded status becomes the same class the broker raised (through
  `proto.h2rpc.error_from_status`); an unreachable broker or a passed deadline is `Unavailable`.
  Arguments that cannot be encoded (a queue id beyond int32, a str that is not valid UTF-8) are a
  `BadRequest` raised before anything is sent.
- No call is retried here (the channel makes again only a call the broker never saw); every call
  except `send` is safe for the caller to retry.
- Use one RemoteBroker from one event loop; `close()` it (or use `async with`) when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message

from broker.client import grpc_convert as convert
from broker.client.api import (
    NO_CONTEXT,
    AckResult,
    BrokerInfo,
    CallContext,
    ConnectedClient,
    FilterSpec,
    GroupInfo,
    GroupSpec,
    GroupStatus,
    LiteRemoval,
    LiteSync,
    LiteTopicList,
    OffsetPolicy,
    OffsetReset,
    PopRequest,
    PullResult,
    QueueRows,
    SendResult,
    StoredMessage,
    TierEvictResult,
    TierStatus,
    TierTopicStatus,
    TopicSpec,
    TopicStatus,
    TraceEvent,
    TransactionCheck,
    TransactionResolution,
    TransactionSource,
)
from broker.client.coalesce import AckCoalescer, batch_timeout, settle
from common.config import ConfigError
from common.errors import (
    BadRequest,
    InternalError,
    RequestTimeout,
    TooManyRequests,
    Unavailable,
    error_for_code,
)
from common.http2.client import Channel, Method, RpcError
from common.logs import MD_CLIENT_ID, MD_REQUEST_ID, current_request
from proto import token
from proto.h2rpc import error_from_status
from proto.sluice.internal.v1 import broker_pb2 as pb

DEFAULT_TIMEOUT_S = 5.0
# gRPC waits between attempts to reconnect to a broker that is down; capped so a restarted broker
# is used again within seconds (gRPC's own cap is two minutes).
DEFAULT_RECONNECT_BACKOFF_MAX_S = 5.0
_RECONNECT_BACKOFF_INITIAL_S = 1.0
# The connection to a broker is pinged when nothing arrived on it for this long, and taken as lost
# (its calls in flight fail with UNAVAILABLE) when nothing answers within the timeout: a broker whose
# host is cut off from the network answers nothing and resets nothing (common/http2/client.py).
DEFAULT_KEEPALIVE_S = 1.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 1.0
_MS_PER_S = 1000.0
# Sends to one broker leave one SendBatch call at a time; sends made while a call is in flight wait
# for it to be answered and leave together in the next (`_drain_sends`). Under load that is one call
# for many sends on both sides; at low load a send leaves at once. Bounds of one call, far below the
# message size limit of the internal RPC:
MAX_SENDS_PER_BATCH = 64
# Acks of one (group, topic) that arrive together leave in one Ack call of at most this many handles
# (broker/client/coalesce.py); far below the internal RPC's message size limit.
MAX_ACKS_PER_CALL = 256
MAX_BATCH_BYTES = 8 * 1024 * 1024
# Sends waiting for their request to leave; beyond it a send is refused (TOO_MANY_REQUESTS) rather
# than queued without limit behind a slow broker.
DEFAULT_MAX_PENDING_SENDS = 10_000
# Calls in flight on the channel at once (long polls included); beyond, a call is refused
# (TOO_MANY_REQUESTS).
MAX_PENDING_CALLS = 20_000
SERVICE = pb.DESCRIPTOR.services_by_name["Broker"]
# The path and response class of each RPC, by name.
_RPCS: dict[str, tuple[str, Any]] = {
    m.name: (f"/{SERVICE.full_name}/{m.name}", getattr(pb, m.output_type.name)) for m in SERVICE.methods
}


class RemoteBroker:
    """One broker reached over gRPC; implements `broker.client.api.BrokerApi`."""

    def __init__(
        self,
        name: str,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_message_bytes: int = convert.MAX_MESSAGE_BYTES,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
        max_pending_sends: int = DEFAULT_MAX_PENDING_SENDS,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S,
        on_silent: Callable[[str, str], None] | None = None,
    ) -> None:
        """`on_silent(name, why)`: the broker answered no keepalive PING in time (its host is cut off
        or hung); its calls in flight failed and the channel backs off (common/http2/client.py)."""
        if keepalive_s <= 0 or keepalive_timeout_s <= 0:
            raise ConfigError("RemoteBroker keepalive_s and keepalive_timeout_s must be positive")
        if timeout_s <= 0 or reconnect_backoff_max_s <= 0 or max_message_bytes <= 0 or max_pending_sends <= 0:
            raise ConfigError(
                "RemoteBroker timeout_s, reconnect_backoff_max_s, max_message_bytes and max_pending_sends must be "
                "positive"
            )
        self._name = name
        self._address = address
        self._timeout_s = timeout_s
        self._target = f"broker {name} at {address}"
        self._channel = Channel(
            address, metadata=token.call_metadata(), max_message_bytes=max_message_bytes,
            max_pending_calls=MAX_PENDING_CALLS, backoff_max_s=reconnect_backoff_max_s,
            backoff_initial_s=min(_RECONNECT_BACKOFF_INITIAL_S, reconnect_backoff_max_s),
            keepalive_s=keepalive_s, keepalive_timeout_s=keepalive_timeout_s,
            on_silent=None if on_silent is None else functools.partial(on_silent, name),
        )  # fmt: skip
        self._methods: dict[str, Method] = {}
        self._max_message_bytes = max_message_bytes
        self._closed = False
        # Sends waiting for the next call, and the task making the calls while there are any (`send`).
        self._pending_sends: list[_PendingSend] = []
        self._max_pending_sends = max_pending_sends
        self._sender: asyncio.Task[None] | None = None
        self._acks = AckCoalescer(
            self._ack_call, max_handles=MAX_ACKS_PER_CALL, timeout_s=timeout_s, target=self._target
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> str:
        return self._address

    def __repr__(self) -> str:
        return f"RemoteBroker({self._name!r}, {self._address!r})"

    async def __aenter__(self) -> RemoteBroker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls in flight fail (Unavailable), later calls raise Unavailable."""
        if not self._closed:
            self._closed = True
            await self._channel.close()

    # -- topics ---------------------------------------------------------------------------------

    async def create_topic(self, spec: TopicSpec) -> TopicSpec:
        with _encoding("create_topic"):
            request = pb.CreateTopicRequest(spec=convert.topic_spec_to_pb(spec))
        response = await self._call("CreateTopic", request)
        return convert.topic_spec_from_pb(response.spec)

    async def update_topic(self, spec: TopicSpec) -> TopicSpec:
        with _encoding("update_topic"):
            request = pb.UpdateTopicRequest(spec=convert.topic_spec_to_pb(spec))
        response = await self._call("UpdateTopic", request)
        return convert.topic_spec_from_pb(response.spec)

    async def delete_topic(self, name: str) -> None:
        with _encoding("delete_topic"):
            request = pb.DeleteTopicRequest(name=name)
        await self._call("DeleteTopic", request)

    async def get_topic(self, name: str, *, auto_create: bool = False, like: TopicSpec | None = None) -> TopicSpec:
        with _encoding("get_topic"):
            request = pb.GetTopicRequest(name=name, auto_create=auto_create,
                                         like=None if like is None else convert.topic_spec_to_pb(like))  # fmt: skip
        response = await self._call("GetTopic", request)
        return convert.topic_spec_from_pb(response.spec)

    async def list_topics(self) -> list[TopicSpec]:
        response = await self._call("ListTopics", pb.ListTopicSpecsRequest())
        return [convert.topic_spec_from_pb(t) for t in response.topics]

    async def topic_status(self, name: str) -> TopicStatus:
        with _encoding("topic_status"):
            request = pb.TopicStatusRequest(name=name)
        response = await self._call("TopicStatus", request)
        return convert.topic_status_from_pb(response.status)

    # -- consumer groups ------------------------------------------------------------------------

    async def create_group(self, spec: GroupSpec) -> GroupInfo:
        with _encoding("create_group"):
            request = pb.CreateGroupRequest(spec=convert.group_spec_to_pb(spec))
        response = await self._call("CreateGroup", request)
        return convert.group_info_from_pb(response.info)

    async def update_group(self, spec: GroupSpec) -> GroupInfo:
        with _encoding("update_group"):
            request = pb.UpdateGroupRequest(spec=convert.group_spec_to_pb(spec))
        response = await self._call("UpdateGroup", request)
        return convert.group_info_from_pb(response.info)

    async def delete_group(self, name: str) -> None:
        with _encoding("delete_group"):
            request = pb.DeleteGroupRequest(name=name)
        await self._call("DeleteGroup", request)

    async def get_group(self, name: str, *, auto_create: bool = False, like: GroupSpec | None = None) -> GroupInfo:
        with _encoding("get_group"):
            request = pb.GetGroupRequest(name=name, auto_create=auto_create,
                                         like=None if like is None else convert.group_spec_to_pb(like))  # fmt: skip
        response = await self._call("GetGroup", request)
        return convert.group_info_from_pb(response.info)

    async def list_groups(self) -> list[GroupInfo]:
        response = await self._call("ListGroups", pb.ListGroupsRequest())
        return [convert.group_info_from_pb(g) for g in response.groups]

    async def group_status(self, name: str, topics: Sequence[str] = (), *, ready_bytes: bool = False) -> GroupStatus:
        with _encoding("group_status"):
            request = pb.GroupStatusRequest(name=name, topics=list(topics), ready_bytes=ready_bytes)
        response = await self._call("GroupStatus", request)
        return convert.group_status_from_pb(response.status)

    # -- produce --------------------------------------------------------------------------------

    async def send(
        self, topic: str, queue_id: int, records: Sequence[bytes], *, ctx: CallContext = NO_CONTEXT
    ) -> list[SendResult]:
        """Store `records` (one per message, by `common.record.outgoing`) in one queue. Sends to this
        broker leave one request at a time, and sends made meanwhile leave together in the next: see
        `_drain_sends`. A send still waiting when
        `ctx`'s deadline passes does not leave (RequestTimeout)."""
        with _encoding("send"):
            request = pb.SendRequest(topic=topic, queue_id=queue_id, records=records)
        if self._closed:
            raise Unavailable(f"{self._target}: client is closed")
        if ctx.expired():
            raise RequestTimeout(f"{self._target}: the client's deadline passed before the send")
        if len(self._pending_sends) >= self._max_pending_sends:
            raise TooManyRequests(
                f"{self._target}: {len(self._pending_sends)} sends are already waiting for it "
                f"(max_pending_sends); retry later"
            )
        if not (ctx.request_id or ctx.client_id):  # the ids bound to this task, if any: it leaves from another
            request_id, client_id = current_request()
            if request_id or client_id:
                ctx = dataclasses.replace(ctx, request_id=request_id, client_id=client_id)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[SendResult]] = loop.create_future()
        pending = _PendingSend(request, future, ctx, sum(map(len, records)))
        self._pending_sends.append(pending)
        if self._sender is None:
            self._sender = loop.create_task(self._drain_sends(), name=f"send-to-{self._name}")
        return await future

    async def _drain_sends(self) -> None:
        """Send what is pending, one SendBatch call at a time, until nothing is. The task's first
        step runs on the loop's next turn, so the sends of every request the loop handles meanwhile
        join the first call; sends made while it is in flight, the next."""
        try:
            while batch := self._take_sends():
                await self._send_batch(batch)
        finally:
            self._sender = None
            if self._pending_sends:  # only when this task was cancelled (the loop is shutting down)
                for p in self._pending_sends:
                    settle(p.future, Unavailable(f"{self._target}: the send was cancelled"))
                self._pending_sends = []

    def _take_sends(self) -> list[_PendingSend]:
        """The oldest pending sends, within one call's bounds; skips those whose caller gave up."""
        taken: list[_PendingSend] = []
        size = 0
        i = 0
        pending = self._pending_sends
        while i < len(pending) and len(taken) < MAX_SENDS_PER_BATCH:
            p = pending[i]
            if taken and size + p.body_bytes > MAX_BATCH_BYTES:
                break
            i += 1
            if p.deadline is not None and p.deadline <= time.monotonic():
                settle(p.future, RequestTimeout(f"{self._target}: the client's deadline passed before the send left"))
            if not p.future.done():
                taken.append(p)
                size += p.body_bytes
        del pending[:i]
        return taken

    async def _send_batch(self, batch: list[_PendingSend]) -> None:
        request = pb.SendBatchRequest(sends=_leaving(batch))
        # The call carries the ids of a lone send's request (the broker's log lines name it); of
        # several, none's (each send carries its own).
        ids = (batch[0].ctx.request_id, batch[0].ctx.client_id) if len(batch) == 1 else ("", "")
        try:
            response = await self._call("SendBatch", request, _batch_timeout(batch, self._timeout_s), ids=ids)
        except asyncio.CancelledError:
            _settle_all(batch, Unavailable(f"{self._target}: the send was cancelled"))
            raise
        except Exception as exc:
            _settle_all(batch, exc)
            return
        self._settle_outcomes(batch, response.outcomes)

    def _settle_outcomes(self, batch: list[_PendingSend], outcomes: Sequence[pb.SendOutcome]) -> None:
        if len(outcomes) != len(batch):
            error = InternalError(f"{self._target}: SendBatch answered {len(outcomes)} outcomes for {len(batch)} sends")
            _settle_all(batch, error)
            return
        for p, outcome in zip(batch, outcomes, strict=True):
            if outcome.error_code:
                settle(p.future, error_for_code(outcome.error_code, outcome.error_message))
            else:
                settle(p.future, [convert.send_result_from_pb(r) for r in outcome.results])

    # -- pop consumption ------------------------------------------------------------------------

    async def pop(self, request: PopRequest, *, ctx: CallContext = NO_CONTEXT) -> list[StoredMessage]:
        with _encoding("pop"):
            message = convert.pop_request_to_pb(request)
        response = await self._call("Pop", message, self._long_poll_timeout_s(request.long_poll_ms), ctx=ctx)
        return convert.stored_list_from_pb(response.messages)

    async def ack(
        self, group: str, topic: str, receipt_handles: list[str], *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        """Acks that arrive together leave in one call (broker/client/coalesce.py)."""
        if ctx.expired():
            raise RequestTimeout(f"{self._target}: the client's deadline passed before the ack")
        return await self._acks.ack(group, topic, receipt_handles, ctx.deadline, _ids(ctx))

    async def _ack_call(
        self, group: str, topic: str, handles: list[str], timeout_s: float, ids: tuple[str, str]
    ) -> list[AckResult]:
        with _encoding("ack"):
            request = pb.AckRequest(group=group, topic=topic, receipt_handles=handles)
        response = await self._call("Ack", request, timeout_s, ids=ids)
        return [convert.ack_result_from_pb(r) for r in response.results]

    async def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> str:
        with _encoding("change_invisible_duration"):
            request = pb.ChangeInvisibleDurationRequest(
                group=group, topic=topic, receipt_handle=receipt_handle, invisible_ms=invisible_ms
            )
        response = await self._call("ChangeInvisibleDuration", request, ctx=ctx)
        return str(response.receipt_handle)

    async def nack(self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        with _encoding("nack"):
            request = pb.NackRequest(group=group, topic=topic, receipt_handle=receipt_handle)
        response = await self._call("Nack", request, ctx=ctx)
        return str(response.receipt_handle)

    async def renew(
        self, group: str, topic: str, receipt_handles: list[str], invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        with _encoding("renew"):
            request = pb.RenewRequest(
                group=group, topic=topic, receipt_handles=receipt_handles, invisible_ms=invisible_ms
            )
        response = await self._call("Renew", request, ctx=ctx)
        return [convert.ack_result_from_pb(r) for r in response.results]

    async def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        with _encoding("forward_to_dead_letter"):
            request = pb.ForwardToDeadLetterRequest(group=group, topic=topic, receipt_handle=receipt_handle)
        await self._call("ForwardToDeadLetter", request, ctx=ctx)

    # -- pull consumption and offsets -----------------------------------------------------------

    async def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        filter: FilterSpec,
        long_poll_ms: int = 0,
        *,
        ctx: CallContext = NO_CONTEXT,
    ) -> PullResult:
        with _encoding("pull"):
            request = pb.PullRequest(
                group=group,
                topic=topic,
                queue_id=queue_id,
                offset=offset,
                max_messages=max_messages,
                filter=convert.filter_to_pb(filter),
                long_poll_ms=long_poll_ms,
            )
        response = await self._call("Pull", request, self._long_poll_timeout_s(long_poll_ms), ctx=ctx)
        return convert.pull_result_from_pb(response.result)

    async def get_offset(self, group: str, topic: str, queue_id: int, *, ctx: CallContext = NO_CONTEXT) -> int:
        with _encoding("get_offset"):
            request = pb.GetOffsetRequest(group=group, topic=topic, queue_id=queue_id)
        response = await self._call("GetOffset", request, ctx=ctx)
        return int(response.offset)

    async def update_offset(
        self, group: str, topic: str, queue_id: int, offset: int, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        with _encoding("update_offset"):
            request = pb.UpdateOffsetRequest(group=group, topic=topic, queue_id=queue_id, offset=offset)
        await self._call("UpdateOffset", request, ctx=ctx)

    async def query_offset(
        self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0, *, ctx: CallContext = NO_CONTEXT
    ) -> int:
        with _encoding("query_offset"):
            request = pb.QueryOffsetRequest(
                topic=topic,
                queue_id=queue_id,
                policy=convert.offset_policy_to_pb(policy),
                timestamp_ms=timestamp_ms,
            )
        response = await self._call("QueryOffset", request, ctx=ctx)
        return int(response.offset)

    async def read_rows(
        self, topic: str, queue_id: int, offset: int, end_offset: int, max_messages: int, max_bytes: int
    ) -> QueueRows:
        with _encoding("read_rows"):
            request = pb.ReadRowsRequest(
                topic=topic, queue_id=queue_id, offset=offset, end_offset=end_offset, max_messages=max_messages,
                max_bytes=max_bytes,
            )  # fmt: skip
        r = await self._call("ReadRows", request)
        return QueueRows(r.rows, r.count, r.next_offset, r.min_offset, r.max_offset)

    # -- lookups --------------------------------------------------------------------------------

    async def get_message(self, topic: str, message_id: str) -> list[StoredMessage]:
        with _encoding("get_message"):
            request = pb.GetMessageRequest(topic=topic, message_id=message_id)
        response = await self._call("GetMessage", request)
        return convert.stored_list_from_pb(response.messages)

    async def find_messages_by_key(self, topic: str, key: str, limit: int = 64) -> list[StoredMessage]:
        with _encoding("find_messages_by_key"):
            request = pb.FindMessagesByKeyRequest(topic=topic, key=key, limit=limit)
        response = await self._call("FindMessagesByKey", request)
        return convert.stored_list_from_pb(response.messages)

    # -- transactions ---------------------------------------------------------------------------

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource, *, ctx: CallContext = NO_CONTEXT,
    ) -> None:  # fmt: skip
        with _encoding("end_transaction"):
            request = pb.EndTransactionRequest(topic=topic, message_id=message_id, transaction_id=transaction_id,
                                               resolution=resolution.value, source=source.value)  # fmt: skip
        await self._call("EndTransaction", request, ctx=ctx)

    async def claim_transaction_checks(self, topics: list[str], max_checks: int) -> list[TransactionCheck]:
        with _encoding("claim_transaction_checks"):
            request = pb.ClaimTransactionChecksRequest(topics=topics, max_checks=max_checks)
        response = await self._call("ClaimTransactionChecks", request)
        return [convert.transaction_check_from_pb(c) for c in response.checks]

    # -- observability --------------------------------------------------------------------------

    async def message_trace(self, message_id: str) -> list[TraceEvent]:
        with _encoding("message_trace"):
            request = pb.MessageTraceRequest(message_id=message_id)
        response = await self._call("MessageTrace", request)
        return [convert.trace_event_from_pb(e) for e in response.events]

    # -- tiered storage -------------------------------------------------------------------------

    async def tier_status(self) -> TierStatus:
        response = await self._call("TierStatus", pb.TierStatusRequest())
        return convert.tier_status_from_pb(response)

    async def tier_upload_now(self, topic: str, timeout_s: float) -> TierTopicStatus:
        with _encoding("tier_upload_now"):
            request = pb.TierUploadNowRequest(topic=topic, timeout_ms=int(timeout_s * _MS_PER_S))
        response = await self._call("TierUploadNow", request, timeout_s + self._timeout_s)
        return convert.tier_topic_status_from_pb(response.status)

    async def tier_evict_local(self, topic: str) -> TierEvictResult:
        with _encoding("tier_evict_local"):
            request = pb.TierEvictLocalRequest(topic=topic)
        response = await self._call("TierEvictLocal", request)
        return convert.tier_evict_from_pb(response)

    # -- security document (broker/security_store.py) ---------------------------------------------

    async def get_security(self) -> tuple[int, bytes]:
        response = await self._call("GetSecurity", pb.GetSecurityRequest())
        return int(response.version), bytes(response.document)

    async def put_security(self, version: int, data: bytes) -> None:
        with _encoding("put_security"):
            request = pb.PutSecurityRequest(version=version, document=data)
        await self._call("PutSecurity", request)

    # -- the AMQP gateway's metadata document (broker/amqp_meta_store.py) -------------------------

    async def get_amqp_meta(self, newer_than: int = 0) -> tuple[int, bytes]:
        response = await self._call("GetAmqpMeta", pb.GetAmqpMetaRequest(newer_than=newer_than))
        return int(response.version), bytes(response.document)

    async def put_amqp_meta(self, version: int, data: bytes) -> None:
        with _encoding("put_amqp_meta"):
            request = pb.PutAmqpMetaRequest(version=version, document=data)
        await self._call("PutAmqpMeta", request)

    # -- the MQTT gateway's state (broker/mqtt_store.py) -----------------------------------------

    async def mqtt_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        response = await self._call("MqttGet", pb.MqttGetRequest(keys=list(keys)))
        return [bytes(v.value) if v.found else None for v in response.values]

    async def mqtt_write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes] = (),
                         expect: Sequence[tuple[bytes, bytes | None]] = ()) -> None:  # fmt: skip
        with _encoding("mqtt_write"):
            request = pb.MqttWriteRequest(
                puts=[pb.MqttEntry(key=k, value=v) for k, v in puts], deletes=list(deletes),
                expect=[pb.MqttExpect(key=k, present=v is not None, value=v or b"") for k, v in expect],
            )  # fmt: skip
        await self._call("MqttWrite", request)

    async def mqtt_scan(self, prefix: bytes, after: bytes = b"", limit: int = 1000) -> list[tuple[bytes, bytes]]:
        response = await self._call("MqttScan", pb.MqttScanRequest(prefix=prefix, after=after, limit=limit))
        return [(bytes(e.key), bytes(e.value)) for e in response.entries]

    # -- timers ---------------------------------------------------------------------------------

    async def recall(self, topic: str, recall_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        with _encoding("recall"):
            request = pb.RecallRequest(topic=topic, recall_handle=recall_handle)
        response = await self._call("Recall", request, ctx=ctx)
        return str(response.message_id)

    # -- operations -----------------------------------------------------------------------------

    async def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> OffsetReset:
        with _encoding("reset_offset"):
            request = pb.ResetOffsetRequest(group=group, topic=topic, queue_id=queue_id, offset=offset)
        response = await self._call("ResetOffset", request)
        return OffsetReset(topic, queue_id, response.previous, response.offset)

    async def report_clients(self, proxy: str, clients: list[ConnectedClient], ttl_ms: int) -> None:
        with _encoding("report_clients"):
            request = pb.ReportClientsRequest(
                proxy=proxy, clients=[convert.connected_client_to_pb(c) for c in clients], ttl_ms=ttl_ms
            )
        await self._call("ReportClients", request)

    async def list_clients(self) -> list[ConnectedClient]:
        response = await self._call("ListClients", pb.ListClientsRequest())
        return [convert.connected_client_from_pb(c) for c in response.clients]

    # -- lite topics ----------------------------------------------------------------------------

    async def sync_lite_subscription(self, sync: LiteSync) -> int:
        with _encoding("sync lite subscription"):
            request = convert.lite_sync_to_pb(sync)
        response = await self._call("SyncLiteSubscription", request)
        return int(response.subscribed)

    async def list_lite_topics(self, topic: str, group: str = "", limit: int = 100) -> LiteTopicList:
        request = pb.ListLiteTopicsRequest(topic=topic, group=group, limit=limit)
        return convert.lite_list_from_pb(await self._call("ListLiteTopics", request))

    async def claim_lite_removals(self, client_ids: list[str]) -> list[LiteRemoval]:
        request = pb.ClaimLiteRemovalsRequest(client_ids=client_ids)
        return convert.lite_removals_from_pb(await self._call("ClaimLiteRemovals", request))

    # -- broker information ---------------------------------------------------------------------

    async def broker_info(self) -> BrokerInfo:
        return convert.broker_info_from_pb(await self._call("BrokerInfo", pb.BrokerInfoRequest()))

    # -- internals ------------------------------------------------------------------------------

    def _long_poll_timeout_s(self, long_poll_ms: int) -> float:
        return max(long_poll_ms, 0) / _MS_PER_S + self._timeout_s

    async def _call(
        self, rpc: str, request: Message, timeout_s: float | None = None, *, ids: tuple[str, str] | None = None,
        ctx: CallContext = NO_CONTEXT,
    ) -> Any:  # fmt: skip
        """One unary call carrying the request id and client id of the request it serves (`ids`, else
        `ctx`'s, else those of the current task) and timed out at `ctx`'s deadline if it is sooner."""
        if self._closed:
            raise Unavailable(f"{self._target}: client is closed")
        request_id, client_id = _ids(ctx) if ids is None else ids
        metadata = ((MD_REQUEST_ID, request_id), (MD_CLIENT_ID, client_id)) if request_id or client_id else ()
        timeout = timeout_s if timeout_s is not None else self._timeout_s
        remaining = ctx.remaining_s()
        if remaining is not None:
            if remaining <= 0:
                raise RequestTimeout(f"{self._target}: the client's deadline passed before the call")
            timeout = min(timeout, remaining)
        path, response_type = _RPCS[rpc]
        method = self._methods.get(rpc)
        if method is None:
            method = self._methods[rpc] = self._channel.method(path)
        raw = request.SerializeToString()
        if len(raw) > self._max_message_bytes:
            raise BadRequest(f"{self._target}: a {rpc} request of {len(raw)} bytes exceeds the internal service's "
                             f"limit of {self._max_message_bytes}")  # fmt: skip
        try:
            answer = await self._channel.unary(method, raw, timeout_s=timeout, metadata=metadata)
        except RpcError as exc:
            raise error_from_status(exc, self._target) from None
        try:
            return response_type.FromString(answer)
        except DecodeError:
            raise InternalError(f"{self._target}: an undecodable {rpc} answer ({len(answer)} bytes)") from None


@dataclass(slots=True)
class _PendingSend:
    request: pb.SendRequest
    future: asyncio.Future[list[SendResult]]
    ctx: CallContext  # of the client request the send serves
    body_bytes: int

    @property
    def deadline(self) -> float | None:
        return self.ctx.deadline


def _leaving(batch: list[_PendingSend]) -> list[pb.SendRequest]:
    """The requests of sends about to leave, each with its context as of now (the time its client
    has left: the broker refuses a send whose deadline passed meanwhile)."""
    for p in batch:
        convert.context_to_pb(p.ctx, p.request.context)
    return [p.request for p in batch]


def _ids(ctx: CallContext) -> tuple[str, str]:
    """(request id, client id) a call carries: the context's, else those bound to the current task."""
    return (ctx.request_id, ctx.client_id) if ctx.request_id or ctx.client_id else current_request()


def _batch_timeout(batch: list[_PendingSend], timeout_s: float) -> float:
    return batch_timeout((p.deadline for p in batch), timeout_s)


def _settle_all(batch: list[_PendingSend], error: BaseException) -> None:
    for p in batch:
        settle(p.future, error)


@contextlib.contextmanager
def _encoding(what: str) -> Iterator[None]:
    """Arguments protobuf refuses (out of range, wrong type, invalid UTF-8) are the caller's BadRequest."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"{what}: argument cannot be sent to the broker: {exc}") from None
