"""Transactions at the edge: EndTransaction, and the RecoverOrphanedTransactionCommand pushed to producers.

EndTransaction: the topic names are checked as everywhere, the transaction id must be present
(INVALID_TRANSACTION_ID otherwise), and the resolution and source numbers must
be known; the call then goes to the broker named by the transaction id. A resolution of
UNSPECIFIED (a Python TransactionChecker may answer it) leaves the transaction pending.
"""

from __future__ import annotations

import asyncio

from broker.client.api import TransactionCheck, TransactionResolution, TransactionSource
from common.errors import BadRequest, InvalidTransactionId
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy import names
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.core.checkback import Deliver
from proxy.grpc import convert
from proxy.grpc.status import OK

_RESOLUTIONS = {r.value: r for r in TransactionResolution}
_SOURCES = {s.value: s for s in TransactionSource}


async def end_transaction(
    app: ProxyApp, ctx: RequestContext, request: spb.EndTransactionRequest
) -> spb.EndTransactionResponse:
    _, topic = convert.resource_name(request.topic, ctx.namespace)
    if not request.transaction_id:
        raise InvalidTransactionId("the request carries no transaction id: send the one of the send receipt")
    if len(request.transaction_id) > app.config.input.max_handle_bytes:
        raise InvalidTransactionId(f"the transaction id is {len(request.transaction_id)} characters long; Sluice's "
                                   f"are at most {app.config.input.max_handle_bytes}")  # fmt: skip
    resolution = _RESOLUTIONS.get(int(request.resolution))
    if resolution is None:
        raise BadRequest(f"unknown transaction resolution {request.resolution}; use COMMIT (1) or ROLLBACK (2)")
    source = _SOURCES.get(int(request.source), TransactionSource.UNSPECIFIED)
    await app.producer.end_transaction(ctx, topic, request.message_id, request.transaction_id, resolution, source)
    return spb.EndTransactionResponse(status=OK)


def producer_topics(ctx: RequestContext, settings: pb.Settings) -> dict[str, str]:
    """Cluster-wide topic -> namespace of the topics a producer's Settings declare."""
    out: dict[str, str] = {}
    for t in settings.publishing.topics:
        if t.name:
            ns = t.resource_namespace or ctx.namespace
            out[names.wrap(ns, t.name)] = ns
    return out


def stream_deliver(out: asyncio.Queue[spb.TelemetryCommand | None], max_queued: int) -> Deliver:
    """A `Deliver` that enqueues a RecoverOrphanedTransactionCommand on one Telemetry stream."""

    def deliver(check: TransactionCheck, namespace: str) -> bool:
        if out.qsize() >= max_queued:
            return False
        command = spb.RecoverOrphanedTransactionCommand(
            message=convert.delivered(check.message, namespace), transaction_id=check.transaction_id
        )
        out.put_nowait(spb.TelemetryCommand(recover_orphaned_transaction_command=command))
        return True

    return deliver
