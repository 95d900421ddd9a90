"""Across the internal broker RPC (real gRPC on loopback, in one process): the broker's log lines of
a proxied call carry the caller's request id and client id (a lone send on the send stream too),
and every call is counted per service, method and result code."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from broker.client.api import OutgoingMessage, SendResult, TopicSpec
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.service import BrokerServicer
from common.errors import TopicNotFound
from common.logs import RequestContextFilter, bind_request, current_request
from proto.sluice.internal.v1 import broker_pb2_grpc as pb_grpc

TIMEOUT_S = 20.0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(RequestContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("sluice.broker")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def _count(method: str, code: str) -> float:
    labels = {"service": "broker", "method": method, "code": code}
    return REGISTRY.get_sample_value("sluice_internal_rpc_requests_total", labels) or 0.0


def test_request_and_client_ids_cross_the_internal_rpc(tmp_path: Path, captured: _Records) -> None:
    async def scenario() -> None:
        broker = LocalBroker(BrokerConfig(name="ctx-broker", data_dir=tmp_path / "b"))
        await broker.start()
        server = grpc.aio.server()
        pb_grpc.add_BrokerServicer_to_server(BrokerServicer(broker), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        remote = RemoteBroker("ctx-broker", f"127.0.0.1:{port}")
        try:
            ok_before, missing_before = _count("CreateTopic", "OK"), _count("GetTopic", "TOPIC_NOT_FOUND")

            async def proxied_call() -> None:  # one client RPC served by a proxy, in its own task
                bind_request("req-42", "client-7")
                await remote.create_topic(TopicSpec("ctx-topic", 2))

            await asyncio.create_task(proxied_call())
            await remote.create_topic(TopicSpec("ctx-other", 1))  # no client request behind it
            with pytest.raises(TopicNotFound):
                await remote.get_topic("nope")
            assert _count("CreateTopic", "OK") == ok_before + 2
            assert _count("GetTopic", "TOPIC_NOT_FOUND") == missing_before + 1
        finally:
            await remote.close()
            await server.stop(None)
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    saved = {r.kv["topic"]: r for r in captured.records if r.getMessage() == "topic saved"}  # type: ignore[attr-defined]
    assert (saved["ctx-topic"].request_id, saved["ctx-topic"].client_id) == ("req-42", "client-7")  # type: ignore[attr-defined]
    assert (saved["ctx-other"].request_id, saved["ctx-other"].client_id) == ("", "")  # type: ignore[attr-defined]


class _SeesRequest(LocalBroker):
    """The real broker, noting the request and client id each send is served under."""

    def __init__(self, config: BrokerConfig) -> None:
        super().__init__(config)
        self.seen: dict[str, tuple[str, str]] = {}  # first message id -> (request id, client id)

    async def send(self, topic: str, queue_id: int, messages: list[OutgoingMessage]) -> list[SendResult]:
        self.seen[messages[0].message_id] = current_request()
        return await super().send(topic, queue_id, messages)


def test_a_lone_send_on_the_stream_carries_its_request_and_client_ids(tmp_path: Path) -> None:
    async def scenario() -> _SeesRequest:
        broker = _SeesRequest(BrokerConfig(name="ctx-broker", data_dir=tmp_path / "b"))
        await broker.start()
        server = grpc.aio.server()
        pb_grpc.add_BrokerServicer_to_server(BrokerServicer(broker), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        remote = RemoteBroker("ctx-broker", f"127.0.0.1:{port}")
        try:
            await remote.create_topic(TopicSpec("ctx-send", 2))

            async def proxied_send(request_id: str, message_id: str) -> None:
                bind_request(request_id, "client-7")
                await remote.send("ctx-send", 0, [OutgoingMessage(body=b"x", message_id=message_id)])

            await asyncio.create_task(proxied_send("req-1", "lone"))
            # Two sends leaving together in one stream request serve two client requests: neither's ids.
            await asyncio.gather(proxied_send("req-2", "pair-a"), proxied_send("req-3", "pair-b"))
            await remote.send("ctx-send", 1, [OutgoingMessage(body=b"y", message_id="no-request")])
        finally:
            await remote.close()
            await server.stop(None)
            await broker.close()
        return broker

    broker = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert broker.seen == {
        "lone": ("req-1", "client-7"),
        "pair-a": ("", ""),
        "pair-b": ("", ""),
        "no-request": ("", ""),
    }
