"""`apache.rocketmq.v2.MessagingService` served by the proxy: one thin method per RPC.

Each method builds the request context, calls its handler (route, produce, consume, telemetry
modules) and turns any failure into the response's Status via `status_of` — never a gRPC error,
never a crash. RPCs for features Sluice does not have yet answer NOT_IMPLEMENTED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from common.codes import Code
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proto.apache.rocketmq.v2 import service_pb2_grpc
from proxy import names
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.grpc import consume, produce, route, telemetry
from proxy.grpc.status import OK, request_context, status, status_of

Resp = TypeVar("Resp")
Handler = Callable[[ProxyApp, RequestContext, Any], Awaitable[Resp]]


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, app: ProxyApp) -> None:
        self.app = app

    async def _unary(
        self, rpc: str, response: Callable[..., Resp], handler: Handler[Resp], request: Any,
        context: grpc.aio.ServicerContext,
    ) -> Resp:  # fmt: skip
        self.app.in_flight += 1
        try:
            return await handler(self.app, request_context(context), request)
        except Exception as exc:
            return response(status=status_of(exc, rpc))
        finally:
            self.app.in_flight -= 1

    async def QueryRoute(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("QueryRoute", spb.QueryRouteResponse, route.query_route, request, context)

    async def QueryAssignment(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("QueryAssignment", spb.QueryAssignmentResponse, route.query_assignment, request,
                                 context)  # fmt: skip

    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle(app: ProxyApp, ctx: RequestContext, req: spb.HeartbeatRequest) -> spb.HeartbeatResponse:
            group = ""
            if req.HasField("group") and req.group.name:
                group = names.wrap(req.group.resource_namespace or ctx.namespace, req.group.name)
                await app.touch_group(group)
            app.sessions.touch(ctx.client_id, client_type=int(req.client_type), group=group)
            return spb.HeartbeatResponse(status=OK)

        return await self._unary("Heartbeat", spb.HeartbeatResponse, handle, request, context)

    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("SendMessage", spb.SendMessageResponse, produce.send_message, request, context)

    async def ReceiveMessage(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self.app.in_flight += 1
        try:
            try:
                ctx = request_context(context)
            except Exception as exc:
                yield spb.ReceiveMessageResponse(status=status_of(exc, "ReceiveMessage"))
                return
            async for frame in consume.receive_message(self.app, ctx, request):
                yield frame
        finally:
            self.app.in_flight -= 1

    async def AckMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("AckMessage", spb.AckMessageResponse, consume.ack_message, request, context)

    async def ChangeInvisibleDuration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("ChangeInvisibleDuration", spb.ChangeInvisibleDurationResponse,
                                 consume.change_invisible_duration, request, context)  # fmt: skip

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueResponse,
                                 consume.forward_to_dead_letter, request, context)  # fmt: skip

    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            ctx = request_context(context)
        except Exception as exc:
            yield spb.PullMessageResponse(status=status_of(exc, "PullMessage"))
            return
        async for frame in consume.pull_message(self.app, ctx, request):
            yield frame

    async def UpdateOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("UpdateOffset", spb.UpdateOffsetResponse, consume.update_offset, request, context)

    async def GetOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("GetOffset", spb.GetOffsetResponse, consume.get_offset, request, context)

    async def QueryOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("QueryOffset", spb.QueryOffsetResponse, consume.query_offset, request, context)

    async def NotifyClientTermination(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def handle(app: ProxyApp, ctx: RequestContext, req: Any) -> spb.NotifyClientTerminationResponse:
            app.sessions.terminate(ctx.client_id)
            return spb.NotifyClientTerminationResponse(status=OK)

        return await self._unary("NotifyClientTermination", spb.NotifyClientTerminationResponse, handle, request,
                                 context)  # fmt: skip

    async def Telemetry(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            ctx = request_context(context)
        except Exception as exc:
            yield spb.TelemetryCommand(status=status_of(exc, "Telemetry"))
            return
        async for command in telemetry.telemetry(self.app, ctx, request_iterator):
            yield command

    async def EndTransaction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return spb.EndTransactionResponse(status=_not_yet("transactional messages"))

    async def RecallMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._unary("RecallMessage", spb.RecallMessageResponse, produce.recall_message, request, context)

    async def SyncLiteSubscription(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return spb.SyncLiteSubscriptionResponse(status=status(Code.UNSUPPORTED, "lite topics are not supported"))


def _not_yet(feature: str) -> Any:
    return status(Code.NOT_IMPLEMENTED, f"{feature} are not supported by this Sluice version yet")
