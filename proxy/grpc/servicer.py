"""`apache.rocketmq.v2.MessagingService` served by the proxy: one thin method per RPC.

Requests reach these methods parsed and admitted by size (proxy/grpc/edge.py registers them on the
HTTP/2 gRPC server, common/http2/grpcserver.py, and turns undecodable bytes into BAD_REQUEST). Each
method builds the request context, admits the request (`guard.admit`: in-flight bound, signature
and access rules when auth is on, rate limits), calls its handler (route, produce, consume,
telemetry modules) and turns any failure into the response's Status via `status_of` — never a gRPC
error, never a crash. RPCs for features Sluice does not have yet answer NOT_IMPLEMENTED.

Every unary RPC, ReceiveMessage and PullMessage is counted by the Code of its answer and timed
(`common.metrics.observe_rpc`); Telemetry streams live as long as the client and are not timed.
At debug level each answer is also logged (RPC, code, duration; the request id and client id come
with every line, see common/logs.py): switch it on at runtime with `PUT /loglevel` when needed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from common import metrics
from common.http2.grpcserver import Call
from common.logs import kv
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy import names
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.grpc import consume, guard, lite, produce, route, telemetry, transaction
from proxy.grpc.status import OK, code_name, request_context, status_of

log = logging.getLogger("sluice.proxy.rpc")
_MS_PER_S = 1000.0
# The code counted for a call that ended without an answer: its client cancelled it or went away.
CANCELLED = "CANCELLED"

Resp = TypeVar("Resp")
Handler = Callable[[ProxyApp, RequestContext, Any], Awaitable[Resp]]


class MessagingServicer:
    def __init__(self, app: ProxyApp) -> None:
        self.app = app

    async def _unary(
        self, rpc: str, response: Callable[..., Resp], handler: Handler[Resp], request: Any,
        context: Call,
    ) -> Resp:  # fmt: skip
        self.app.in_flight += 1
        started = time.perf_counter()
        try:
            ctx = request_context(context)
            guard.admit(self.app, ctx, request)
            answer = await handler(self.app, ctx, request)
        except Exception as exc:
            answer = response(status=status_of(exc, rpc))
        except asyncio.CancelledError:  # the client gave up (its deadline passed) before the answer: counted
            _answered(rpc, CANCELLED, time.perf_counter() - started)  # too, or a cut-off broker would not show
            raise
        finally:
            self.app.in_flight -= 1
        _answered(rpc, code_name(answer.status.code), time.perf_counter() - started)  # type: ignore[attr-defined]
        return answer

    async def QueryRoute(self, request: Any, context: Call) -> Any:
        return await self._unary("QueryRoute", spb.QueryRouteResponse, route.query_route, request, context)

    async def QueryAssignment(self, request: Any, context: Call) -> Any:
        return await self._unary("QueryAssignment", spb.QueryAssignmentResponse, route.query_assignment, request,
                                 context)  # fmt: skip

    async def Heartbeat(self, request: Any, context: Call) -> Any:
        async def handle(app: ProxyApp, ctx: RequestContext, req: spb.HeartbeatRequest) -> spb.HeartbeatResponse:
            group = ""
            if req.HasField("group") and req.group.name:
                group = names.wrap(req.group.resource_namespace or ctx.namespace, req.group.name)
                await app.touch_group(group)
            app.sessions.touch(ctx.client_id, client_type=int(req.client_type), group=group, address=ctx.peer)
            return spb.HeartbeatResponse(status=OK)

        return await self._unary("Heartbeat", spb.HeartbeatResponse, handle, request, context)

    async def SendMessage(self, request: Any, context: Call) -> Any:
        return await self._unary("SendMessage", spb.SendMessageResponse, produce.send_message, request, context)

    async def ReceiveMessage(self, request: Any, context: Call) -> AsyncIterator[Any]:
        self.app.in_flight += 1
        started = time.perf_counter()
        code = CANCELLED  # the stream ended before its status frame (client went away)
        try:
            try:
                ctx = request_context(context)
                guard.admit(self.app, ctx, request)
            except Exception as exc:
                frame = spb.ReceiveMessageResponse(status=status_of(exc, "ReceiveMessage"))
                code = code_name(frame.status.code)
                yield frame
                return
            received = 0
            try:
                frames = await consume.receive_message(self.app, ctx, request)
                code = code_name(frames[0].status.code)  # the status frame comes first
                last = len(frames) - 1
                for i, frame in enumerate(frames):
                    received += 0 < i < last  # between the status and the delivery timestamp
                    yield frame
            finally:
                namespace = request.group.resource_namespace or ctx.namespace
                self.app.flow.charge_receive(namespace, request.group.name, received)
        finally:
            self.app.in_flight -= 1
            _answered("ReceiveMessage", code, time.perf_counter() - started)

    async def AckMessage(self, request: Any, context: Call) -> Any:
        return await self._unary("AckMessage", spb.AckMessageResponse, consume.ack_message, request, context)

    async def ChangeInvisibleDuration(self, request: Any, context: Call) -> Any:
        return await self._unary("ChangeInvisibleDuration", spb.ChangeInvisibleDurationResponse,
                                 consume.change_invisible_duration, request, context)  # fmt: skip

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Call) -> Any:
        return await self._unary("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueResponse,
                                 consume.forward_to_dead_letter, request, context)  # fmt: skip

    async def PullMessage(self, request: Any, context: Call) -> AsyncIterator[Any]:
        started = time.perf_counter()
        code = CANCELLED
        try:
            try:
                ctx = request_context(context)
                guard.admit(self.app, ctx, request)
            except Exception as exc:
                frame = spb.PullMessageResponse(status=status_of(exc, "PullMessage"))
                code = code_name(frame.status.code)
                yield frame
                return
            async for frame in consume.pull_message(self.app, ctx, request):
                if frame.HasField("status"):
                    code = code_name(frame.status.code)
                yield frame
        finally:
            _answered("PullMessage", code, time.perf_counter() - started)

    async def UpdateOffset(self, request: Any, context: Call) -> Any:
        return await self._unary("UpdateOffset", spb.UpdateOffsetResponse, consume.update_offset, request, context)

    async def GetOffset(self, request: Any, context: Call) -> Any:
        return await self._unary("GetOffset", spb.GetOffsetResponse, consume.get_offset, request, context)

    async def QueryOffset(self, request: Any, context: Call) -> Any:
        return await self._unary("QueryOffset", spb.QueryOffsetResponse, consume.query_offset, request, context)

    async def NotifyClientTermination(self, request: Any, context: Call) -> Any:
        async def handle(app: ProxyApp, ctx: RequestContext, req: Any) -> spb.NotifyClientTerminationResponse:
            app.sessions.terminate(ctx.client_id)
            return spb.NotifyClientTerminationResponse(status=OK)

        return await self._unary("NotifyClientTermination", spb.NotifyClientTerminationResponse, handle, request,
                                 context)  # fmt: skip

    async def Telemetry(self, request_iterator: Any, context: Call) -> AsyncIterator[Any]:
        try:
            ctx = request_context(context)
            if self.app.config.auth.enabled:
                guard.authenticate(self.app, ctx, None)
        except Exception as exc:
            yield spb.TelemetryCommand(status=status_of(exc, "Telemetry"))
            return
        async for command in telemetry.telemetry(self.app, ctx, request_iterator):
            yield command

    async def EndTransaction(self, request: Any, context: Call) -> Any:
        return await self._unary("EndTransaction", spb.EndTransactionResponse, transaction.end_transaction, request,
                                 context)  # fmt: skip

    async def RecallMessage(self, request: Any, context: Call) -> Any:
        return await self._unary("RecallMessage", spb.RecallMessageResponse, produce.recall_message, request, context)

    async def SyncLiteSubscription(self, request: Any, context: Call) -> Any:
        return await self._unary("SyncLiteSubscription", spb.SyncLiteSubscriptionResponse, lite.sync_lite_subscription,
                                 request, context)  # fmt: skip


def _answered(rpc: str, code: str, seconds: float) -> None:
    metrics.observe_rpc(rpc, code, seconds)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("rpc answered", extra=kv(rpc=rpc, code=code, ms=round(seconds * _MS_PER_S, 3)))
