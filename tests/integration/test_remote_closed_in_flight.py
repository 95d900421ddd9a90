"""A RemoteBroker closed while a call is in flight (the directory replaces the client of a broker
group whose primary moved, or the proxy stops) fails that call as Unavailable, like any broker that
does not answer. grpc.aio cancels calls in flight on a closed channel with asyncio.CancelledError;
raised as it was, it ended the caller's task as if the caller had been cancelled: the separated
proxy's AMQP metadata refresher stopped for good at a failover, silently, and printed a traceback
when the proxy stopped (seen in the failover schedules across hosts). Real gRPC on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from broker.client.remote import RemoteBroker
from common.errors import Unavailable
from proto.sluice.internal.v1 import broker_pb2 as pb
from proto.sluice.internal.v1 import broker_pb2_grpc as pb_grpc

WAIT_S = 10.0


class _Silent(pb_grpc.BrokerServicer):
    """A broker that takes BrokerInfo calls and never answers them."""

    def __init__(self) -> None:
        self.called = asyncio.Event()

    async def BrokerInfo(self, request: pb.BrokerInfoRequest, context: Any) -> pb.BrokerInfoResponse:
        self.called.set()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")


async def _closed_in_flight() -> BaseException | None:
    server = grpc.aio.server()
    silent = _Silent()
    pb_grpc.add_BrokerServicer_to_server(silent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    remote = RemoteBroker("b1", f"127.0.0.1:{port}", timeout_s=WAIT_S)
    try:
        call = asyncio.create_task(remote.broker_info())
        await asyncio.wait_for(silent.called.wait(), WAIT_S)
        await remote.close()
        done, _ = await asyncio.wait({call}, timeout=WAIT_S)
        assert done, "the call did not end when its client closed"
        assert not call.cancelled(), "the call ended as cancelled: its caller's task would end with it"
        return call.exception()
    finally:
        await remote.close()
        await server.stop(None)


def test_a_call_in_flight_when_the_client_closes_fails_as_unavailable() -> None:
    error = asyncio.run(_closed_in_flight())
    assert isinstance(error, Unavailable), repr(error)
    with pytest.raises(Unavailable, match="closed"):
        raise error
