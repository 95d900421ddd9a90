"""An internal service on Sluice's own HTTP/2 gRPC stack (common/http2): the broker's. Both sides of
what proto/serve.py, proto/token.py and proto/rpc.py give the grpc.aio ones (the NameServer's and
navigation's), the same on the wire:

- serving (`register`): each unary method of a servicer is served from bytes: the cluster token
  checked (`token.refusal`: UNAUTHENTICATED with UNAUTHORIZED), the caller's request and client
  ids bound to the call's log lines (`x-mq-request-id`, `x-mq-client-id`), the request parsed
  (undecodable: BAD_REQUEST), the servicer awaited, and every exception sent as a status whose
  trailers carry its `apache.rocketmq.v2.Code` (`x-sluice-code`, `proto.rpc.wire_error`):
  UNAVAILABLE for a retriable error, FAILED_PRECONDITION for another, INTERNAL for an unexpected
  one (logged with its traceback). Every call is counted and timed per service, method and code
  (`sluice_internal_rpc_*`).
- calling (`error_from_status`): the `SluiceError` a failed call stands for, as `error_from_rpc`
  rebuilds it from a grpc.aio error: the class the servicer raised when its code came back, else
  `Unreachable` (the server could not be reached), `Unavailable` (deadline or cancellation),
  `TooManyRequests` (calls bounded on either side) or `InternalError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from common.codes import Code
from common.errors import (
    BadRequest,
    InternalError,
    SluiceError,
    TooManyRequests,
    Unavailable,
    Unreachable,
    error_for_code,
)
from common.http2.client import RpcError
from common.http2.grpcserver import Call, GrpcError, GrpcServer, Kind, StatusCode
from common.logs import MD_CLIENT_ID, MD_REQUEST_ID, bind_request
from proto import token
from proto.rpc import CODE_KEY, wire_error

log = logging.getLogger("sluice.rpc")

Impl = Callable[[Any, Call], Awaitable[Any]]


def register(server: GrpcServer, service: ServiceDescriptor, messages: ModuleType, servicer: object, *,
             label: str) -> None:  # fmt: skip
    """Serve every unary method of `service` that `servicer` implements (by the method's name),
    with request and response classes from `messages`; `label` names the service in metrics."""
    from common.metrics import observe_internal_rpc  # a server's: its clients never load prometheus

    for method in service.methods:
        impl = getattr(servicer, method.name, None)
        if impl is None or method.client_streaming or method.server_streaming:
            continue
        request_type = getattr(messages, method.input_type.name)
        server.add(f"/{service.full_name}/{method.name}", Kind.UNARY,
                   _unary(label, method.name, request_type, impl, observe_internal_rpc))  # fmt: skip


def _unary(label: str, name: str, request_type: Any, impl: Impl,
           observe: Callable[[str, str, str, float], None]) -> Callable[[bytes, Call], Awaitable[bytes]]:  # fmt: skip
    async def handler(raw: bytes, call: Call) -> bytes:
        started = time.perf_counter()
        headers = call.headers
        refused = token.refusal(headers.get(token.TOKEN_KEY))
        if refused is not None:
            observe(label, name, Code.UNAUTHORIZED.name, time.perf_counter() - started)
            raise GrpcError(StatusCode.UNAUTHENTICATED, refused, trailing=((CODE_KEY, str(int(Code.UNAUTHORIZED))),))
        request_id, client_id = headers.get(MD_REQUEST_ID, ""), headers.get(MD_CLIENT_ID, "")
        if request_id or client_id:
            bind_request(request_id, client_id)
        try:
            try:
                request = request_type.FromString(raw)
            except (DecodeError, RecursionError):
                raise BadRequest(f"the request is not a valid {request_type.DESCRIPTOR.full_name}") from None
            response = await impl(request, call)
        except SluiceError as exc:
            observe(label, name, exc.code.name, time.perf_counter() - started)
            raise status_of(exc) from None
        except Exception as exc:
            observe(label, name, Code.INTERNAL_SERVER_ERROR.name, time.perf_counter() - started)
            log.exception("internal rpc %s failed", name)
            raise status_of(exc) from None
        observe(label, name, Code.OK.name, time.perf_counter() - started)
        return bytes(response.SerializeToString())

    return handler


def status_of(exc: BaseException) -> GrpcError:
    """The status a call that raised `exc` ends with (as `proto.rpc.abort_with` sends it)."""
    code, message = wire_error(exc)
    if isinstance(exc, SluiceError):
        status = StatusCode.UNAVAILABLE if exc.retriable else StatusCode.FAILED_PRECONDITION
    else:
        status = StatusCode.INTERNAL
    return GrpcError(status, message, trailing=((CODE_KEY, str(int(code))),))


def error_from_status(exc: RpcError, target: str = "") -> SluiceError:
    """The SluiceError a failed internal call stands for."""
    where = f" from {target}" if target else ""
    coded = exc.trailers.get(CODE_KEY)
    if coded is not None:
        try:
            return error_for_code(int(coded), exc.message)
        except ValueError:
            pass
    if exc.code is StatusCode.UNAVAILABLE:
        return Unreachable(f"unavailable{where}: {exc.message}")
    if exc.code in (StatusCode.DEADLINE_EXCEEDED, StatusCode.CANCELLED):
        return Unavailable(f"{exc.code.name.lower()}{where}: {exc.message}")
    if exc.code is StatusCode.RESOURCE_EXHAUSTED:  # calls bounded on either side
        return TooManyRequests(f"too many calls{where}: {exc.message}")
    return InternalError(f"rpc failed{where}: {exc.code.name} {exc.message}")
