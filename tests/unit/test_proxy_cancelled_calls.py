"""A call whose client gives up before the proxy answers is counted (issue 43 item 7): a broker cut
off from the network made sends wait for their clients' deadlines, and `_unary` counted none of
them, so the proxy's metrics showed no failed or slow send at all."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from common import metrics
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.grpc import servicer
from proxy.grpc.servicer import MessagingServicer


def _count(rpc: str, code: str) -> float:
    return REGISTRY.get_sample_value("sluice_proxy_rpc_requests_total", {"rpc": rpc, "code": code}) or 0.0


def test_a_call_cancelled_on_its_deadline_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics.configure(metrics.MetricsConfig())
    monkeypatch.setattr(servicer, "request_context", lambda context: object())
    monkeypatch.setattr(servicer.guard, "admit", lambda app, ctx, request: None)
    app = SimpleNamespace(in_flight=0)
    edge = MessagingServicer(cast(ProxyApp, app))
    started = asyncio.Event()

    async def hung_broker(app: Any, ctx: Any, request: Any) -> Any:
        started.set()
        await asyncio.Event().wait()  # the broker never answers

    async def scenario() -> None:
        call = asyncio.create_task(edge._unary("SendMessage", spb.SendMessageResponse, hung_broker, None, None))
        await started.wait()
        call.cancel()  # what gRPC does when the client's deadline passes
        with pytest.raises(asyncio.CancelledError):
            await call

    before = _count("SendMessage", "CANCELLED")
    asyncio.run(scenario())
    assert _count("SendMessage", "CANCELLED") == before + 1
    assert app.in_flight == 0
