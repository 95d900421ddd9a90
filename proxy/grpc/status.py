"""The edge's two helpers: build the request context from a call's headers, and turn any exception
into an `apache.rocketmq.v2.Status` — the one place where errors become protocol codes.

Application errors travel in the response's Status with gRPC status OK, as the official clients
expect. Anything that is not a SluiceError is INTERNAL_SERVER_ERROR, logged with its traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import cast

from common.codes import Code
from common.errors import ClientIdRequired, SluiceError, code_of
from common.http2.grpcserver import Call
from common.logs import bind_request, kv
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proxy.context import RequestContext

log = logging.getLogger("sluice.proxy")

H_CLIENT_ID = "x-mq-client-id"
H_NAMESPACE = "x-mq-namespace"
H_LANGUAGE = "x-mq-language"
H_VERSION = "x-mq-client-version"
H_REQUEST_ID = "x-mq-request-id"
H_AUTHORIZATION = "authorization"
H_DATE_TIME = "x-mq-date-time"


def status(code: Code, message: str = "") -> pb.Status:
    return pb.Status(code=cast(pb.Code, int(code)), message=message or code.name)


OK = status(Code.OK, "OK")


def status_of(exc: BaseException, rpc: str = "") -> pb.Status:
    code = code_of(exc)
    if isinstance(exc, SluiceError):
        return status(code, exc.message)
    log.error("unexpected error in %s", rpc or "rpc", exc_info=exc, extra=kv(rpc=rpc))
    return status(Code.INTERNAL_SERVER_ERROR, f"internal error ({type(exc).__name__}); see the proxy log")


_CODE_NAMES = {int(c): c.name for c in Code}


def code_name(code: int) -> str:
    """The Code name of a status code, for metric labels (unknown numbers as themselves)."""
    return _CODE_NAMES.get(code) or str(code)


def common_status(codes: Iterable[pb.Status]) -> pb.Status:
    """The top-level status of a batch: the entries' common status, or MULTIPLE_RESULTS."""
    items = list(codes)
    if not items:
        return OK
    first = items[0]
    if all(s.code == first.code for s in items):
        return first
    return status(Code.MULTIPLE_RESULTS, "entries have different results; see each entry")


def request_context(call: Call, *, require_client_id: bool = True) -> RequestContext:
    # The call's headers are a dict already (the last value of a repeated name wins).
    md = call.headers
    client_id = md.get(H_CLIENT_ID, "")
    if require_client_id and not client_id:
        raise ClientIdRequired("the x-mq-client-id header is missing; every official client sends it")
    request_id = md.get(H_REQUEST_ID, "")
    bind_request(request_id, client_id)
    remaining = call.time_remaining()
    return RequestContext(
        client_id=client_id,
        namespace=md.get(H_NAMESPACE, ""),
        language=md.get(H_LANGUAGE, ""),
        client_version=md.get(H_VERSION, ""),
        request_id=request_id,
        peer=call.peer_address,
        deadline=None if remaining is None else time.monotonic() + remaining,
        authorization=md.get(H_AUTHORIZATION, ""),
        date_time=md.get(H_DATE_TIME, ""),
    )
