"""`BrokerServicer`: the broker's internal gRPC edge (`sluice.internal.v1.Broker`), served by our
HTTP/2 gRPC server (common/http2/grpcserver.py; `serve` below, proto/h2rpc.py).

Each handler converts the request (`broker.client.grpc_convert`), awaits the one matching `BrokerApi`
call and converts the result back; it holds no logic and no state of its own. proto/h2rpc.py turns
every exception into a coded status, so a `RemoteBroker` raises the class the `BrokerApi` raised;
a request the converters reject (an unknown enum number) is BAD_REQUEST.

Pop and Pull long-poll inside the `BrokerApi`: the handler simply awaits it. When the client's
deadline passes, its stream is reset or the server stops, the server cancels the handler's task,
which cancels the wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from broker.client import grpc_convert as convert
from broker.client.amqpmeta import AmqpMetaApi
from broker.client.api import BrokerApi, CallContext
from broker.client.mqttstate import MqttStateApi
from common.errors import SluiceError, Unsupported
from common.http2.grpcserver import GrpcServer
from common.logs import current_request, kv
from common.security import SecurityStoreApi
from proto import h2rpc
from proto.rpc import wire_error
from proto.sluice.internal.v1 import broker_pb2 as pb

log = logging.getLogger("sluice.broker.rpc")
SERVICE = pb.DESCRIPTOR.services_by_name["Broker"]


class Context(Protocol):
    """What a handler reads of its call (common/http2/grpcserver.py `Call`)."""

    def time_remaining(self) -> float | None: ...


def serve(server: GrpcServer, servicer: BrokerServicer) -> None:
    """Serve `servicer` as `sluice.internal.v1.Broker` on `server`."""
    h2rpc.register(server, SERVICE, pb, servicer, label="broker")


def call_context(context: Context) -> CallContext:
    """The context of the client request a call serves: the ids proto/h2rpc.py bound from its
    metadata, and its deadline (the caller's gRPC timeout)."""
    request_id, client_id = current_request()
    remaining = context.time_remaining()
    return CallContext(request_id, client_id, deadline=None if remaining is None else time.monotonic() + remaining)


def _send_context(send: pb.SendRequest, call: CallContext) -> CallContext:
    """The context of the client request a send serves: its own, or the call's (a caller that does
    not send one: a unary Send carries it as metadata and timeout)."""
    return convert.context_from_pb(send.context) if send.HasField("context") else call


class BrokerServicer:
    """Serves one `BrokerApi` (normally the process's `LocalBroker`)."""

    def __init__(self, api: BrokerApi) -> None:
        self._api = api

    # -- topics ---------------------------------------------------------------------------------

    async def CreateTopic(self, request: pb.CreateTopicRequest, context: Context) -> pb.CreateTopicResponse:
        spec = await self._api.create_topic(convert.topic_spec_from_pb(request.spec))
        return pb.CreateTopicResponse(spec=convert.topic_spec_to_pb(spec))

    async def UpdateTopic(self, request: pb.UpdateTopicRequest, context: Context) -> pb.UpdateTopicResponse:
        spec = await self._api.update_topic(convert.topic_spec_from_pb(request.spec))
        return pb.UpdateTopicResponse(spec=convert.topic_spec_to_pb(spec))

    async def DeleteTopic(self, request: pb.DeleteTopicRequest, context: Context) -> pb.DeleteTopicResponse:
        await self._api.delete_topic(request.name)
        return pb.DeleteTopicResponse()

    async def GetTopic(self, request: pb.GetTopicRequest, context: Context) -> pb.GetTopicResponse:
        like = convert.topic_spec_from_pb(request.like) if request.HasField("like") else None
        spec = await self._api.get_topic(request.name, auto_create=request.auto_create, like=like)
        return pb.GetTopicResponse(spec=convert.topic_spec_to_pb(spec))

    async def ListTopics(self, request: pb.ListTopicSpecsRequest, context: Context) -> pb.ListTopicSpecsResponse:
        specs = await self._api.list_topics()
        return pb.ListTopicSpecsResponse(topics=[convert.topic_spec_to_pb(s) for s in specs])

    async def TopicStatus(self, request: pb.TopicStatusRequest, context: Context) -> pb.TopicStatusResponse:
        status = await self._api.topic_status(request.name)
        return pb.TopicStatusResponse(status=convert.topic_status_to_pb(status))

    # -- consumer groups ------------------------------------------------------------------------

    async def CreateGroup(self, request: pb.CreateGroupRequest, context: Context) -> pb.CreateGroupResponse:
        info = await self._api.create_group(convert.group_spec_from_pb(request.spec))
        return pb.CreateGroupResponse(info=convert.group_info_to_pb(info))

    async def UpdateGroup(self, request: pb.UpdateGroupRequest, context: Context) -> pb.UpdateGroupResponse:
        info = await self._api.update_group(convert.group_spec_from_pb(request.spec))
        return pb.UpdateGroupResponse(info=convert.group_info_to_pb(info))

    async def DeleteGroup(self, request: pb.DeleteGroupRequest, context: Context) -> pb.DeleteGroupResponse:
        await self._api.delete_group(request.name)
        return pb.DeleteGroupResponse()

    async def GetGroup(self, request: pb.GetGroupRequest, context: Context) -> pb.GetGroupResponse:
        like = convert.group_spec_from_pb(request.like) if request.HasField("like") else None
        info = await self._api.get_group(request.name, auto_create=request.auto_create, like=like)
        return pb.GetGroupResponse(info=convert.group_info_to_pb(info))

    async def ListGroups(self, request: pb.ListGroupsRequest, context: Context) -> pb.ListGroupsResponse:
        infos = await self._api.list_groups()
        return pb.ListGroupsResponse(groups=[convert.group_info_to_pb(i) for i in infos])

    async def GroupStatus(self, request: pb.GroupStatusRequest, context: Context) -> pb.GroupStatusResponse:
        status = await self._api.group_status(request.name, list(request.topics), ready_bytes=request.ready_bytes)
        return pb.GroupStatusResponse(status=convert.group_status_to_pb(status))

    # -- produce --------------------------------------------------------------------------------

    async def Send(self, request: pb.SendRequest, context: Context) -> pb.SendResponse:
        results = await self._api.send(request.topic, request.queue_id, request.records,
                                       ctx=_send_context(request, call_context(context)))  # fmt: skip
        return pb.SendResponse(results=[convert.send_result_to_pb(r) for r in results])

    async def SendBatch(self, request: pb.SendBatchRequest, context: Context) -> pb.SendBatchResponse:
        # The sends run concurrently (their appends share the writer's group commit); each one's
        # failure is its own outcome, as if it had been a Send of its own.
        ctx = call_context(context)
        sends = request.sends
        if len(sends) == 1:  # (a proxy's lone send: no task of its own)
            return pb.SendBatchResponse(outcomes=[await self._send_one(sends[0], ctx)])
        outcomes = await asyncio.gather(*(self._send_one(s, ctx) for s in sends))
        return pb.SendBatchResponse(outcomes=outcomes)

    async def _send_one(self, send: pb.SendRequest, ctx: CallContext) -> pb.SendOutcome:
        """One send of a SendBatch request; `ctx` (the call's) serves if the send carries no
        context of its own."""
        try:
            results = await self._api.send(send.topic, send.queue_id, send.records, ctx=_send_context(send, ctx))
        except Exception as exc:
            if not isinstance(exc, SluiceError):
                log.exception("send of a batch failed", extra=kv(topic=send.topic, queue=send.queue_id))
            code, message = wire_error(exc)
            return pb.SendOutcome(error_code=int(code), error_message=message)
        return pb.SendOutcome(results=[convert.send_result_to_pb(r) for r in results])

    # -- pop consumption ------------------------------------------------------------------------

    async def Pop(self, request: pb.PopRequest, context: Context) -> pb.PopResponse:
        messages = await self._api.pop(convert.pop_request_from_pb(request), ctx=call_context(context))
        return pb.PopResponse(messages=convert.stored_list_to_pb(messages))

    async def Ack(self, request: pb.AckRequest, context: Context) -> pb.AckResponse:
        results = await self._api.ack(
            request.group, request.topic, list(request.receipt_handles), ctx=call_context(context)
        )
        return pb.AckResponse(results=[convert.ack_result_to_pb(r) for r in results])

    async def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, context: Context
    ) -> pb.ChangeInvisibleDurationResponse:
        handle = await self._api.change_invisible_duration(
            request.group, request.topic, request.receipt_handle, request.invisible_ms, ctx=call_context(context)
        )
        return pb.ChangeInvisibleDurationResponse(receipt_handle=handle)

    async def Nack(self, request: pb.NackRequest, context: Context) -> pb.NackResponse:
        handle = await self._api.nack(request.group, request.topic, request.receipt_handle, ctx=call_context(context))
        return pb.NackResponse(receipt_handle=handle)

    async def Renew(self, request: pb.RenewRequest, context: Context) -> pb.RenewResponse:
        results = await self._api.renew(
            request.group, request.topic, list(request.receipt_handles), request.invisible_ms, ctx=call_context(context)
        )
        return pb.RenewResponse(results=[convert.ack_result_to_pb(r) for r in results])

    async def ForwardToDeadLetter(
        self, request: pb.ForwardToDeadLetterRequest, context: Context
    ) -> pb.ForwardToDeadLetterResponse:
        await self._api.forward_to_dead_letter(
            request.group, request.topic, request.receipt_handle, ctx=call_context(context)
        )
        return pb.ForwardToDeadLetterResponse()

    # -- pull consumption and offsets -----------------------------------------------------------

    async def Pull(self, request: pb.PullRequest, context: Context) -> pb.PullResponse:
        result = await self._api.pull(
            request.group,
            request.topic,
            request.queue_id,
            request.offset,
            request.max_messages,
            convert.filter_or_default(request),
            long_poll_ms=request.long_poll_ms,
            ctx=call_context(context),
        )
        return pb.PullResponse(result=convert.pull_result_to_pb(result))

    async def GetOffset(self, request: pb.GetOffsetRequest, context: Context) -> pb.GetOffsetResponse:
        offset = await self._api.get_offset(request.group, request.topic, request.queue_id, ctx=call_context(context))
        return pb.GetOffsetResponse(offset=offset)

    async def UpdateOffset(self, request: pb.UpdateOffsetRequest, context: Context) -> pb.UpdateOffsetResponse:
        await self._api.update_offset(
            request.group, request.topic, request.queue_id, request.offset, ctx=call_context(context)
        )
        return pb.UpdateOffsetResponse()

    async def QueryOffset(self, request: pb.QueryOffsetRequest, context: Context) -> pb.QueryOffsetResponse:
        policy = convert.offset_policy_from_pb(request.policy)
        offset = await self._api.query_offset(
            request.topic, request.queue_id, policy, request.timestamp_ms, ctx=call_context(context)
        )
        return pb.QueryOffsetResponse(offset=offset)

    async def ReadRows(self, request: pb.ReadRowsRequest, context: Context) -> pb.ReadRowsResponse:
        got = await self._api.read_rows(
            request.topic, request.queue_id, request.offset, request.end_offset, request.max_messages,
            request.max_bytes,
        )  # fmt: skip
        return pb.ReadRowsResponse(
            rows=got.rows, count=got.count, next_offset=got.next_offset, min_offset=got.min_offset,
            max_offset=got.max_offset,
        )  # fmt: skip

    # -- lookups --------------------------------------------------------------------------------

    async def GetMessage(self, request: pb.GetMessageRequest, context: Context) -> pb.GetMessageResponse:
        messages = await self._api.get_message(request.topic, request.message_id)
        return pb.GetMessageResponse(messages=convert.stored_list_to_pb(messages))

    async def FindMessagesByKey(
        self, request: pb.FindMessagesByKeyRequest, context: Context
    ) -> pb.FindMessagesByKeyResponse:
        messages = await self._api.find_messages_by_key(request.topic, request.key, request.limit)
        return pb.FindMessagesByKeyResponse(messages=convert.stored_list_to_pb(messages))

    # -- transactions ---------------------------------------------------------------------------

    async def EndTransaction(self, request: pb.EndTransactionRequest, context: Context) -> pb.EndTransactionResponse:
        await self._api.end_transaction(
            request.topic, request.message_id, request.transaction_id, convert.resolution_from_pb(request.resolution),
            convert.source_from_pb(request.source), ctx=call_context(context),
        )  # fmt: skip
        return pb.EndTransactionResponse()

    async def ClaimTransactionChecks(
        self, request: pb.ClaimTransactionChecksRequest, context: Context
    ) -> pb.ClaimTransactionChecksResponse:
        checks = await self._api.claim_transaction_checks(list(request.topics), request.max_checks)
        return pb.ClaimTransactionChecksResponse(checks=[convert.transaction_check_to_pb(c) for c in checks])

    # -- observability (appended) ---------------------------------------------------------------

    async def MessageTrace(self, request: pb.MessageTraceRequest, context: Context) -> pb.MessageTraceResponse:
        events = await self._api.message_trace(request.message_id)
        return pb.MessageTraceResponse(events=[convert.trace_event_to_pb(e) for e in events])

    # -- tiered storage -------------------------------------------------------------------------

    async def TierStatus(self, request: pb.TierStatusRequest, context: Context) -> pb.TierStatusResponse:
        return convert.tier_status_to_pb(await self._api.tier_status())

    async def TierUploadNow(self, request: pb.TierUploadNowRequest, context: Context) -> pb.TierUploadNowResponse:
        status = await self._api.tier_upload_now(request.topic, request.timeout_ms / 1000.0)
        return pb.TierUploadNowResponse(status=convert.tier_topic_status_to_pb(status))

    async def TierEvictLocal(self, request: pb.TierEvictLocalRequest, context: Context) -> pb.TierEvictLocalResponse:
        return convert.tier_evict_to_pb(await self._api.tier_evict_local(request.topic))

    # -- security document (broker/security_store.py) ---------------------------------------------

    async def GetSecurity(self, request: pb.GetSecurityRequest, context: Context) -> pb.GetSecurityResponse:
        version, document = await self._security().get_security()
        return pb.GetSecurityResponse(version=version, document=document)

    async def PutSecurity(self, request: pb.PutSecurityRequest, context: Context) -> pb.PutSecurityResponse:
        await self._security().put_security(request.version, request.document)
        return pb.PutSecurityResponse()

    # -- the AMQP gateway's metadata document (broker/amqp_meta_store.py) -------------------------

    async def GetAmqpMeta(self, request: pb.GetAmqpMetaRequest, context: Context) -> pb.GetAmqpMetaResponse:
        version, document = await self._amqp_meta().get_amqp_meta(request.newer_than)
        return pb.GetAmqpMetaResponse(version=version, document=document)

    async def PutAmqpMeta(self, request: pb.PutAmqpMetaRequest, context: Context) -> pb.PutAmqpMetaResponse:
        await self._amqp_meta().put_amqp_meta(request.version, request.document)
        return pb.PutAmqpMetaResponse()

    # -- the MQTT gateway's state (broker/mqtt_store.py) -----------------------------------------

    async def MqttGet(self, request: pb.MqttGetRequest, context: Context) -> pb.MqttGetResponse:
        values = await self._mqtt().mqtt_get(list(request.keys))
        return pb.MqttGetResponse(values=[pb.MqttValue(found=v is not None, value=v or b"") for v in values])

    async def MqttWrite(self, request: pb.MqttWriteRequest, context: Context) -> pb.MqttWriteResponse:
        await self._mqtt().mqtt_write([(e.key, e.value) for e in request.puts], list(request.deletes),
                                      [(e.key, e.value if e.present else None) for e in request.expect])  # fmt: skip
        return pb.MqttWriteResponse()

    async def MqttScan(self, request: pb.MqttScanRequest, context: Context) -> pb.MqttScanResponse:
        entries = await self._mqtt().mqtt_scan(request.prefix, request.after, request.limit or 1000)
        return pb.MqttScanResponse(entries=[pb.MqttEntry(key=k, value=v) for k, v in entries])

    def _mqtt(self) -> MqttStateApi:
        if not isinstance(self._api, MqttStateApi):
            raise Unsupported("this broker keeps no MQTT state")
        return self._api

    def _amqp_meta(self) -> AmqpMetaApi:
        if not isinstance(self._api, AmqpMetaApi):
            raise Unsupported("this broker keeps no AMQP metadata")
        return self._api

    def _security(self) -> SecurityStoreApi:
        if not isinstance(self._api, SecurityStoreApi):
            raise Unsupported("this broker keeps no security document")
        return self._api

    # -- timers ---------------------------------------------------------------------------------

    async def Recall(self, request: pb.RecallRequest, context: Context) -> pb.RecallResponse:
        message_id = await self._api.recall(request.topic, request.recall_handle, ctx=call_context(context))
        return pb.RecallResponse(message_id=message_id)

    # -- operations -----------------------------------------------------------------------------

    async def ResetOffset(self, request: pb.ResetOffsetRequest, context: Context) -> pb.ResetOffsetResponse:
        reset = await self._api.reset_offset(request.group, request.topic, request.queue_id, request.offset)
        return pb.ResetOffsetResponse(previous=reset.previous, offset=reset.offset)

    async def ReportClients(self, request: pb.ReportClientsRequest, context: Context) -> pb.ReportClientsResponse:
        clients = [convert.connected_client_from_pb(c) for c in request.clients]
        await self._api.report_clients(request.proxy, clients, request.ttl_ms)
        return pb.ReportClientsResponse()

    async def ListClients(self, request: pb.ListClientsRequest, context: Context) -> pb.ListClientsResponse:
        clients = await self._api.list_clients()
        return pb.ListClientsResponse(clients=[convert.connected_client_to_pb(c) for c in clients])

    async def SyncLiteSubscription(
        self, request: pb.SyncLiteSubscriptionRequest, context: Context
    ) -> pb.SyncLiteSubscriptionResponse:
        subscribed = await self._api.sync_lite_subscription(convert.lite_sync_from_pb(request))
        return pb.SyncLiteSubscriptionResponse(subscribed=subscribed)

    async def ListLiteTopics(self, request: pb.ListLiteTopicsRequest, context: Context) -> pb.ListLiteTopicsResponse:
        result = await self._api.list_lite_topics(request.topic, request.group, request.limit or 100)
        return convert.lite_list_to_pb(result)

    async def ClaimLiteRemovals(
        self, request: pb.ClaimLiteRemovalsRequest, context: Context
    ) -> pb.ClaimLiteRemovalsResponse:
        return convert.lite_removals_to_pb(await self._api.claim_lite_removals(list(request.client_ids)))

    # -- broker information ---------------------------------------------------------------------

    async def BrokerInfo(self, request: pb.BrokerInfoRequest, context: Context) -> pb.BrokerInfoResponse:
        return convert.broker_info_to_pb(await self._api.broker_info())
