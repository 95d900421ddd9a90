"""RemoteBroker coalesces concurrent sends into one SendBatch call (our HTTP/2 gRPC client and
server on loopback, in one process): each send still gets its own results or its own error, a lone
send is a call of its own, sends beyond the pending bound are refused, and a broker that goes away
fails the sends in flight as unavailable and is used again once it is back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker.client.api import TopicSpec
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.service import BrokerServicer
from common.errors import BadRequest, SluiceError, TooManyRequests, TopicNotFound
from common.http2.grpcserver import GrpcServer
from common.model import MessageType
from proto.sluice.internal.v1 import broker_pb2 as pb
from tests.helpers.broker_fixtures import serve_in_process
from tests.helpers.records import outgoing

TIMEOUT_S = 20.0
TOPIC = "batch-topic"


class _Counting(BrokerServicer):
    """The real servicer, counting the sends of each SendBatch call it serves."""

    def __init__(self, api: LocalBroker) -> None:
        super().__init__(api)
        self.batches: list[int] = []  # sends per SendBatch call

    async def SendBatch(self, request: pb.SendBatchRequest, context: Any) -> pb.SendBatchResponse:
        self.batches.append(len(request.sends))
        return await super().SendBatch(request, context)


def _messages(tag: str, n: int) -> list[bytes]:
    return [outgoing(body=f"{tag}-{i}".encode(), message_id=f"{tag}-{i}") for i in range(n)]


async def _serve(tmp_path: Path) -> tuple[LocalBroker, GrpcServer, _Counting, RemoteBroker]:
    broker = LocalBroker(BrokerConfig(name="batch-broker", data_dir=tmp_path / "b"))
    await broker.start()
    await broker.create_topic(TopicSpec(TOPIC, 4))
    servicer = _Counting(broker)
    server, port = await serve_in_process(servicer)
    return broker, server, servicer, RemoteBroker("batch-broker", f"127.0.0.1:{port}", reconnect_backoff_max_s=0.2)


async def _concurrent_sends(remote: RemoteBroker) -> list[Any]:
    """Five sends started together: three good ones to different queues, a missing topic, a bad queue."""
    return await asyncio.gather(
        remote.send(TOPIC, 0, _messages("a", 3)),
        remote.send(TOPIC, 1, _messages("b", 2)),
        remote.send("no-such-topic", 0, _messages("c", 1)),
        remote.send(TOPIC, 99, _messages("d", 1)),
        remote.send(TOPIC, 0, _messages("e", 2)),
        return_exceptions=True,
    )


def _check_outcomes(results: list[Any]) -> None:
    a, b, missing, bad_queue, e = results
    assert [r.message_id for r in a] == ["a-0", "a-1", "a-2"] and {r.queue_id for r in a} == {0}
    assert [r.queue_offset for r in a] == [0, 1, 2]
    assert [r.message_id for r in b] == ["b-0", "b-1"] and [r.queue_offset for r in b] == [0, 1]
    assert isinstance(missing, TopicNotFound)
    assert isinstance(bad_queue, BadRequest) and "queue 99" in bad_queue.message
    assert [r.queue_offset for r in e] == [3, 4]  # after a's three in queue 0


def test_concurrent_sends_share_one_call_with_their_own_outcomes(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, server, servicer, remote = await _serve(tmp_path)
        try:
            _check_outcomes(await _concurrent_sends(remote))
            assert servicer.batches == [5]
            # Later sends, alone or together; each is readable where its result says.
            (only,) = await remote.send(TOPIC, 2, _messages("f", 1))
            g, h = await asyncio.gather(
                remote.send(TOPIC, 3, _messages("g", 2)), remote.send(TOPIC, 3, _messages("h", 1))
            )
            assert servicer.batches == [5, 1, 2]
            assert [r.queue_offset for r in [*g, *h]] == [0, 1, 2]
            stored = await broker.get_message(TOPIC, "f-0")
            assert [(m.queue_id, m.queue_offset, m.body) for m in stored] == [(2, only.queue_offset, b"f-0")]
            assert [m.message_type for m in stored] == [MessageType.NORMAL]
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))


def test_sends_after_close_fail_as_unavailable(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, server, _, remote = await _serve(tmp_path)
        try:
            await remote.close()
            with pytest.raises(SluiceError) as err:
                await remote.send(TOPIC, 0, _messages("x", 1))
            assert err.value.retriable
        finally:
            await server.shutdown(0)
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))


def test_sends_beyond_max_pending_are_refused_and_the_queue_drains(tmp_path: Path) -> None:
    """Five sends made at once with room for two waiting: the two are stored, the other three are
    TOO_MANY_REQUESTS at once (nothing queued without bound behind the broker); once the queue has
    drained, sends are accepted again."""

    async def scenario() -> None:
        broker, server, _, remote = await _serve(tmp_path)
        bounded = RemoteBroker("batch-broker", remote.address, max_pending_sends=2)
        try:
            results = await asyncio.gather(
                *(bounded.send(TOPIC, 0, _messages(f"p{i}", 1)) for i in range(5)), return_exceptions=True
            )
            assert [r[0].message_id for r in results[:2]] == ["p0-0", "p1-0"]
            for refused in results[2:]:
                assert isinstance(refused, TooManyRequests) and "max_pending_sends" in refused.message
            (later,) = await bounded.send(TOPIC, 0, _messages("q", 1))
            assert later.queue_offset == 2
        finally:
            await bounded.close()
            await remote.close()
            await server.shutdown(0)
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))


def test_a_broker_that_goes_away_fails_the_sends_then_is_used_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, server, servicer, remote = await _serve(tmp_path)
        port = int(remote.address.rpartition(":")[2])
        try:
            await remote.send(TOPIC, 0, _messages("before", 1))
            await server.shutdown(0)  # the connection ends under the client
            with pytest.raises(SluiceError) as err:
                await remote.send(TOPIC, 0, _messages("down", 1))
            assert err.value.retriable, err.value
            server, _ = await serve_in_process(servicer, port)  # the broker is back on its address
            deadline = asyncio.get_running_loop().time() + TIMEOUT_S / 2
            while True:  # the channel reconnects after its backoff; sends fail as unavailable until then
                try:
                    (after,) = await remote.send(TOPIC, 0, _messages("after", 1))
                    break
                except SluiceError as exc:
                    assert exc.retriable and asyncio.get_running_loop().time() < deadline, exc
                    await asyncio.sleep(0.1)
            assert after.queue_offset >= 1
            assert [m.body for m in await broker.get_message(TOPIC, "after-0")] == [b"after-0"]
        finally:
            await remote.close()
            await server.shutdown(0)
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))
