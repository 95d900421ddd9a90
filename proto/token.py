"""The cluster token: only cluster members and admins may call the internal gRPC services.

When a token is configured, every internal server (broker, NameServer, navigation) refuses a call
whose `x-sluice-cluster-token` metadata does not carry it (`refusal`; the grpc.aio servers through
`server_interceptors`, the broker's through proto/h2rpc.py), with gRPC UNAUTHENTICATED and the
apache.rocketmq.v2 code UNAUTHORIZED (so the caller raises `Unauthorized`, see proto/rpc.py), and
every internal client (`RemoteBroker`, the NameServer and navigation clients, `sluice admin`)
sends it. The client-facing proxy port is not affected (clients sign their requests instead).

The token is one value per process, configured once at start-up by `sluice/main.py` from the
environment: `SLUICE_CLUSTER_TOKEN`, or the first line of the file named by
`SLUICE_CLUSTER_TOKEN_FILE` (a Kubernetes secret mount). It is process-wide on purpose: every
internal client in a process speaks for the same cluster member, and the token must never sit on
a command line (visible in `ps`) or be logged.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from common.codes import Code
from common.config import ConfigError
from proto.rpc import CODE_KEY

TOKEN_KEY = "x-sluice-cluster-token"
ENV_TOKEN = "SLUICE_CLUSTER_TOKEN"
ENV_TOKEN_FILE = "SLUICE_CLUSTER_TOKEN_FILE"

_token = ""


def configure(token: str) -> None:
    """Set this process's cluster token ("" turns the check and the header off)."""
    global _token
    _token = token


def from_environment(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    path = env.get(ENV_TOKEN_FILE, "")
    if path:
        try:
            return Path(path).read_text().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise ConfigError(f"{ENV_TOKEN_FILE}={path}: cannot read a token from it ({exc})") from None
    return env.get(ENV_TOKEN, "").strip()


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    return [_RequireToken()] if _token else []


def channel(address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
    """An insecure channel to an internal server that sends this process's token on every call."""
    if not _token:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=[_SendToken(_token)])


def refusal(given: str | bytes | None) -> str | None:
    """Why a call whose token metadata is `given` (None: absent) is refused, or None when it may
    go on (the right token, or no token configured). Every internal server asks this."""
    if not _token:
        return None
    if given is None:
        return f"this internal service requires the cluster token; set {ENV_TOKEN} or {ENV_TOKEN_FILE}"
    if hmac.compare_digest(given.encode() if isinstance(given, str) else bytes(given), _token.encode()):
        return None
    return "the cluster token is wrong; use the cluster's SLUICE_CLUSTER_TOKEN"


class _RequireToken(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        given = next((v for k, v in handler_call_details.invocation_metadata or () if k == TOKEN_KEY), None)
        refused = refusal(given)
        return handler if refused is None else _refuse(handler, refused)


def _refuse(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    """A handler that refuses the call, of the same kind as the method's (a unary one would not
    answer a streaming call properly)."""

    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message,
                            trailing_metadata=((CODE_KEY, str(int(Code.UNAUTHORIZED))),))  # fmt: skip

    if handler is not None and handler.request_streaming:
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(abort)
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler is not None and handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


def call_metadata() -> tuple[tuple[str, str], ...]:
    """Metadata carrying this process's token, for calls the channel's interceptor does not see
    (it handles unary calls only: streaming calls pass this themselves)."""
    return ((TOKEN_KEY, _token),) if _token else ()


class _SendToken(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self._pair = (TOKEN_KEY, token)

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        metadata = list(client_call_details.metadata or ())
        metadata.append(self._pair)
        details = client_call_details._replace(metadata=metadata)
        return await continuation(details, request)
