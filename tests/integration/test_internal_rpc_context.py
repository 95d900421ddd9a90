"""Across the internal broker RPC (our HTTP/2 gRPC client and server on loopback, in one process):
the broker's log lines of a proxied call carry the caller's request id and client id (a lone send
too), each send of a batch its own context, and every call is counted per service, method and
result code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from broker.client.api import (
    NO_CONTEXT,
    AckResult,
    CallContext,
    FilterSpec,
    GroupSpec,
    OffsetPolicy,
    PullResult,
    SendResult,
    TopicSpec,
    TransactionResolution,
    TransactionSource,
)
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.service import BrokerServicer
from common import record
from common.codes import Code
from common.errors import ConsumerGroupNotFound, RequestTimeout, SluiceError, TopicNotFound
from common.http2.client import Channel
from common.http2.grpcserver import GrpcServer
from common.logs import RequestContextFilter, bind_request, current_request
from common.model import MessageType
from proto.sluice.internal.v1 import broker_pb2 as pb
from tests.helpers.broker_fixtures import serve_in_process
from tests.helpers.records import outgoing

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
        server, port = await serve_in_process(BrokerServicer(broker))
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
            await server.shutdown(0)
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
        self.contexts: dict[str, CallContext] = {}  # first message id or handle -> the call's context

    async def send(
        self, topic: str, queue_id: int, records: Sequence[bytes], *, ctx: CallContext = NO_CONTEXT
    ) -> list[SendResult]:
        first = record.decode(records[0]).message_id
        self.seen[first] = current_request()
        self.contexts[first] = ctx
        return await super().send(topic, queue_id, records, ctx=ctx)

    async def ack(
        self, group: str, topic: str, receipt_handles: list[str], *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        self.contexts[receipt_handles[0]] = ctx
        return await super().ack(group, topic, receipt_handles, ctx=ctx)

    async def nack(self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        self.contexts["nack"] = ctx
        return await super().nack(group, topic, receipt_handle, ctx=ctx)

    async def renew(
        self, group: str, topic: str, receipt_handles: list[str], invisible_ms: int, *, ctx: CallContext = NO_CONTEXT
    ) -> list[AckResult]:
        self.contexts["renew"] = ctx
        return await super().renew(group, topic, receipt_handles, invisible_ms, ctx=ctx)

    async def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        self.contexts["forward_to_dead_letter"] = ctx
        await super().forward_to_dead_letter(group, topic, receipt_handle, ctx=ctx)

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource, *, ctx: CallContext = NO_CONTEXT,
    ) -> None:  # fmt: skip
        self.contexts["end_transaction"] = ctx
        await super().end_transaction(topic, message_id, transaction_id, resolution, source, ctx=ctx)

    async def recall(self, topic: str, recall_handle: str, *, ctx: CallContext = NO_CONTEXT) -> str:
        self.contexts["recall"] = ctx
        return await super().recall(topic, recall_handle, ctx=ctx)

    async def pull(
        self, group: str, topic: str, queue_id: int, offset: int, max_messages: int, filter: FilterSpec,
        long_poll_ms: int = 0, *, ctx: CallContext = NO_CONTEXT,
    ) -> PullResult:  # fmt: skip
        self.contexts["pull"] = ctx
        return await super().pull(group, topic, queue_id, offset, max_messages, filter, long_poll_ms, ctx=ctx)

    async def get_offset(self, group: str, topic: str, queue_id: int, *, ctx: CallContext = NO_CONTEXT) -> int:
        self.contexts["get_offset"] = ctx
        return await super().get_offset(group, topic, queue_id, ctx=ctx)

    async def update_offset(
        self, group: str, topic: str, queue_id: int, offset: int, *, ctx: CallContext = NO_CONTEXT
    ) -> None:
        self.contexts["update_offset"] = ctx
        await super().update_offset(group, topic, queue_id, offset, ctx=ctx)

    async def query_offset(
        self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0, *, ctx: CallContext = NO_CONTEXT
    ) -> int:
        self.contexts["query_offset"] = ctx
        return await super().query_offset(topic, queue_id, policy, timestamp_ms, ctx=ctx)


async def _served(tmp_path: Path, **remote_options: float) -> tuple[_SeesRequest, GrpcServer, RemoteBroker]:
    """A `_SeesRequest` broker served over the internal service on loopback, and a client of it."""
    broker = _SeesRequest(BrokerConfig(name="ctx-broker", data_dir=tmp_path / "b"))
    await broker.start()
    server, port = await serve_in_process(BrokerServicer(broker))
    return broker, server, RemoteBroker("ctx-broker", f"127.0.0.1:{port}", **remote_options)


def test_a_lone_send_carries_its_request_and_client_ids(tmp_path: Path) -> None:
    async def scenario() -> _SeesRequest:
        broker, server, remote = await _served(tmp_path)
        try:
            await remote.create_topic(TopicSpec("ctx-send", 2))

            async def proxied_send(request_id: str, message_id: str) -> None:
                bind_request(request_id, "client-7")
                await remote.send("ctx-send", 0, [outgoing(body=b"x", message_id=message_id)])

            await asyncio.create_task(proxied_send("req-1", "lone"))
            # Two sends leaving together in one call serve two client requests: neither's ids.
            await asyncio.gather(proxied_send("req-2", "pair-a"), proxied_send("req-3", "pair-b"))
            await remote.send("ctx-send", 1, [outgoing(body=b"y", message_id="no-request")])
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()
        return broker

    broker = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert broker.seen == {
        "lone": ("req-1", "client-7"),
        "pair-a": ("", ""),
        "pair-b": ("", ""),
        "no-request": ("", ""),
    }


def test_a_call_context_reaches_the_broker_with_its_ids_and_deadline(tmp_path: Path) -> None:
    """The context the proxy's edge builds goes to BrokerApi as it is: over the internal RPC its ids
    travel as metadata and its deadline as the call's timeout, and the broker's service rebuilds it.
    A send whose deadline has already passed is refused (REQUEST_TIMEOUT) and not stored."""

    sent_deadline: list[float] = []

    async def scenario() -> _SeesRequest:
        broker, server, remote = await _served(tmp_path, timeout_s=30.0)
        try:
            await remote.create_topic(TopicSpec("ctx-deadline", 1))
            ctx = CallContext("req-9", "client-9", "ns", deadline=time.monotonic() + 3.0)
            with pytest.raises(ConsumerGroupNotFound):  # served all the same: the broker saw the context
                await remote.ack("no-group", "ctx-deadline", ["a-handle"], ctx=ctx)
            sent_deadline.append(ctx.deadline or 0.0)
            late = CallContext("req-10", "client-9", deadline=time.monotonic() - 0.1)
            with pytest.raises(RequestTimeout):
                await remote.send("ctx-deadline", 0, [outgoing(body=b"x", message_id="late")], ctx=late)
            with pytest.raises(RequestTimeout):  # the same refusal from the broker in this process
                await broker.send("ctx-deadline", 0, [outgoing(body=b"x", message_id="late")], ctx=late)
            assert (await broker.topic_status("ctx-deadline")).queues[0].max_offset == 0  # nothing stored
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()
        return broker

    broker = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    seen = broker.contexts["a-handle"]
    assert (seen.request_id, seen.client_id) == ("req-9", "client-9")
    # The broker saw the caller's deadline (3 s from then; one process, one monotonic clock), not
    # the client's 30 s default timeout; the late send never reached it. The service rebuilds it as
    # its own now + the call's time remaining, so it can land a little later than the one sent:
    # by the time between the call's arrival and that read (67 ms once on a loaded machine).
    assert seen.deadline is not None and seen.deadline <= sent_deadline[0] + 1.0
    assert seen.deadline > sent_deadline[0] - 3.0
    assert broker.contexts["late"] is not None  # the in-process call reached it, and refused


def test_each_send_of_a_batch_carries_its_own_context(tmp_path: Path) -> None:
    """Sends that leave together in one SendBatch call serve different client requests: each reaches
    the broker with its own ids, namespace and deadline (the time its client had left as it left)."""

    async def scenario() -> tuple[_SeesRequest, float]:
        broker, server, remote = await _served(tmp_path, timeout_s=30.0)
        try:
            await remote.create_topic(TopicSpec("ctx-each", 1))
            sent_at = time.monotonic()
            a = CallContext("req-a", "client-a", "ns-a", deadline=sent_at + 4.0)
            b = CallContext("req-b", "client-b")  # no deadline
            await asyncio.gather(
                remote.send("ctx-each", 0, [outgoing(body=b"a", message_id="each-a")], ctx=a),
                remote.send("ctx-each", 0, [outgoing(body=b"b", message_id="each-b")], ctx=b),
            )
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()
        return broker, sent_at

    broker, sent_at = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    seen_a, seen_b = broker.contexts["each-a"], broker.contexts["each-b"]
    assert (seen_a.request_id, seen_a.client_id, seen_a.namespace) == ("req-a", "client-a", "ns-a")
    assert seen_a.deadline is not None and sent_at < seen_a.deadline <= sent_at + 4.05  # its own 4 s, one clock
    assert (seen_b.request_id, seen_b.client_id, seen_b.namespace, seen_b.deadline) == ("req-b", "client-b", "", None)


def test_a_send_whose_deadline_passed_in_a_batch_is_refused_alone(tmp_path: Path) -> None:
    """A send whose client has no time left when the broker serves it is REQUEST_TIMEOUT and not
    stored; the other send of the same SendBatch call is stored."""

    async def scenario() -> tuple[list[pb.SendOutcome], int]:
        broker, server, remote = await _served(tmp_path)
        try:
            await remote.create_topic(TopicSpec("ctx-late", 1))
            late = pb.SendRequest(topic="ctx-late", queue_id=0, records=[outgoing(body=b"x", message_id="l")])
            late.context.client_id, late.context.remaining_ms = "client-late", 0
            fine = pb.SendRequest(topic="ctx-late", queue_id=0, records=[outgoing(body=b"y", message_id="f")])
            fine.context.remaining_ms = 10_000
            channel = Channel(remote.address)
            try:
                raw = await channel.unary(
                    "/sluice.internal.v1.Broker/SendBatch",
                    pb.SendBatchRequest(sends=[late, fine]).SerializeToString(),
                    timeout_s=10.0,
                )
            finally:
                await channel.close()
            answer = pb.SendBatchResponse.FromString(raw)
            stored = (await broker.topic_status("ctx-late")).queues[0].max_offset
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()
        return list(answer.outcomes), stored

    outcomes, stored = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    assert outcomes[0].error_code == Code.REQUEST_TIMEOUT and not outcomes[0].results
    assert outcomes[1].error_code == 0 and [r.message_id for r in outcomes[1].results] == ["f"]
    assert stored == 1


def test_every_messaging_call_carries_its_context(tmp_path: Path) -> None:
    """nack, renew, forward to dead letter, end transaction, recall, pull and the offset calls reach the broker with the
    context of the client request they serve (ids as metadata, deadline as the call's timeout), as
    send, pop, ack and change-invisible do. The calls fail (unknown handles): the broker saw them all the same."""
    methods = ("nack", "renew", "forward_to_dead_letter", "end_transaction", "recall", "pull", "get_offset",
               "update_offset", "query_offset")  # fmt: skip

    async def scenario() -> tuple[_SeesRequest, float]:
        broker, server, remote = await _served(tmp_path, timeout_s=30.0)
        deadline = time.monotonic() + 5.0
        ctx = CallContext("req-m", "client-m", "ns-m", deadline=deadline)
        try:
            await remote.create_topic(TopicSpec("ctx-calls", 1, frozenset(MessageType)))
            await remote.create_group(GroupSpec("ctx-group"))
            calls = (
                remote.nack("ctx-group", "ctx-calls", "bad-handle", ctx=ctx),
                remote.renew("ctx-group", "ctx-calls", ["bad-handle"], 1000, ctx=ctx),
                remote.forward_to_dead_letter("ctx-group", "ctx-calls", "bad-handle", ctx=ctx),
                remote.end_transaction(
                    "ctx-calls", "mid", "bad-tx", TransactionResolution.ROLLBACK, TransactionSource.CLIENT, ctx=ctx
                ),
                remote.recall("ctx-calls", "bad-recall", ctx=ctx),
                remote.pull("ctx-group", "ctx-calls", 0, 0, 1, FilterSpec(), ctx=ctx),
                remote.get_offset("ctx-group", "ctx-calls", 0, ctx=ctx),
                remote.update_offset("ctx-group", "ctx-calls", 0, 0, ctx=ctx),
                remote.query_offset("ctx-calls", 0, OffsetPolicy.END, ctx=ctx),
            )
            for call in calls:
                with contextlib.suppress(SluiceError):
                    await call
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()
        return broker, deadline

    broker, deadline = asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
    for method in methods:
        seen = broker.contexts[method]
        assert (seen.request_id, seen.client_id) == ("req-m", "client-m"), method
        # The caller's deadline (5 s), not the client's 30 s default timeout (gRPC rounds a timeout up to its unit).
        assert seen.deadline is not None and deadline - 5.0 < seen.deadline <= deadline + 1.0, method
