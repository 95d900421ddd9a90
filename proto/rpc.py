"""How coded errors cross Sluice's internal gRPC services (broker, NameServer, navigation).

A server handler raises `SluiceError`s as usual; `@internal_rpc` turns any exception into a gRPC
error status whose trailing metadata carries the `apache.rocketmq.v2.Code` (`x-sluice-code`) and
whose details carry the readable message. The client side calls `error_from_rpc` to rebuild the
same `SluiceError` class, so a caller of a Cluster backend sees exactly what a Local one raises.
Unknown exceptions are logged with their traceback and sent as INTERNAL_SERVER_ERROR. Every call is
counted and timed per service, method and result code (`sluice_internal_rpc_*`, common/metrics.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from common.codes import Code
from common.errors import InternalError, SluiceError, Unavailable, Unreachable, code_of, error_for_code
from common.logs import MD_CLIENT_ID, MD_REQUEST_ID, bind_request

CODE_KEY = "x-sluice-code"
log = logging.getLogger("sluice.rpc")

R = TypeVar("R")


def wire_error(exc: BaseException) -> tuple[Code, str]:
    """The one map from an exception to what the internal services send: its code and message,
    whether as a call's status (`abort_with`) or as one entry's outcome of a batch. An exception
    that is not a SluiceError is INTERNAL_SERVER_ERROR (its caller logs its traceback)."""
    if isinstance(exc, SluiceError):
        return exc.code, exc.message
    return code_of(exc), f"internal error: {type(exc).__name__}: {exc}"


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    code, message = wire_error(exc)
    if isinstance(exc, SluiceError):
        status = grpc.StatusCode.UNAVAILABLE if exc.retriable else grpc.StatusCode.FAILED_PRECONDITION
    else:
        status = grpc.StatusCode.INTERNAL
    await context.abort(status, message, trailing_metadata=((CODE_KEY, str(int(code))),))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def internal_rpc(
    handler: Callable[..., Awaitable[R]],
) -> Callable[..., Awaitable[R]]:
    """Decorate a unary grpc.aio servicer method so every exception leaves as a coded status."""
    # Imported here, when a server's servicer is defined: clients of this module (`sluice admin`,
    # every RemoteBroker) never load prometheus_client through it.
    from common.metrics import observe_internal_rpc

    service, _, method = handler.__qualname__.rpartition(".")
    service = service.removesuffix("Servicer").removesuffix("Service").lower() or "internal"

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        started = time.perf_counter()
        _bind_caller(context)

        def observe(code: str) -> None:  # before the answer leaves: a caller that saw it sees it counted
            observe_internal_rpc(service, method, code, time.perf_counter() - started)

        try:
            result = await handler(self, request, context)
        except SluiceError as exc:
            observe(exc.code.name)
            await abort_with(context, exc)
        except grpc.aio.AbortError:
            observe(Code.INTERNAL_SERVER_ERROR.name)
            raise
        except Exception as exc:
            observe(Code.INTERNAL_SERVER_ERROR.name)
            log.exception("internal rpc %s failed", handler.__name__)
            await abort_with(context, exc)
        observe(Code.OK.name)
        return result

    return wrapper


def _bind_caller(context: grpc.aio.ServicerContext) -> None:
    """Log lines of this call carry the request id and client id of the client request behind it."""
    request_id = client_id = ""
    for key, value in context.invocation_metadata() or ():
        if key == MD_REQUEST_ID:
            request_id = value if isinstance(value, str) else value.decode("utf-8", "replace")
        elif key == MD_CLIENT_ID:
            client_id = value if isinstance(value, str) else value.decode("utf-8", "replace")
    if request_id or client_id:
        bind_request(request_id, client_id)


def error_from_rpc(exc: grpc.aio.AioRpcError | grpc.RpcError, target: str = "") -> SluiceError:
    """The SluiceError a failed internal call stands for."""
    where = f" from {target}" if target else ""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == CODE_KEY:
            try:
                return error_for_code(int(value), str(exc.details() or ""))
            except ValueError:
                break
    status = exc.code() if hasattr(exc, "code") else None
    if status is grpc.StatusCode.UNAVAILABLE:
        return Unreachable(f"unavailable{where}: {exc.details()}")
    if status in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return Unavailable(f"{status.name.lower() if status else 'unavailable'}{where}: {exc.details()}")
    return InternalError(f"rpc failed{where}: {status} {exc.details() if hasattr(exc, 'details') else exc}")
