"""The consume path's edge pieces: routing a receipt handle by its envelope, delivered frames, acks.

An ack routes each handle by its broker name alone (the broker decodes the payload): a handle with
a malformed payload must still come back INVALID_RECEIPT_HANDLE, from the broker. A delivered
message is written straight into its response frame: the frame must carry exactly the Message
`convert.delivered` builds.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client import receipt
from broker.client.api import AckResult, CallContext, StoredMessage
from common.codes import Code
from common.errors import InvalidReceiptHandle
from common.model import MessageType
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.context import RequestContext
from proxy.grpc import consume, convert
from tests.helpers.records import delivered

NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@given(broker=NAMES, qid=st.integers(0, 1 << 31), offset=st.integers(0, 1 << 62))
def test_broker_of_reads_the_broker_of_a_valid_handle(broker: str, qid: int, offset: int) -> None:
    text = receipt.ReceiptHandle(broker, qid, offset, 3, 1_700_000_000_000, 7, 9).encode()
    assert receipt.broker_of(text) == broker == receipt.decode(text).broker


@pytest.mark.parametrize("text", ["", "plain", "~AQAA", "b~" + "A" * 600])
def test_broker_of_refuses_a_handle_without_a_broker(text: str) -> None:
    with pytest.raises(InvalidReceiptHandle):
        receipt.broker_of(text)


def test_a_malformed_payload_is_left_to_the_broker_which_refuses_it() -> None:
    text = "broker-a~!!not-base64!!"
    assert receipt.broker_of(text) == "broker-a"  # routed to its broker...
    with pytest.raises(InvalidReceiptHandle, match="malformed"):
        receipt.decode(text)  # ...whose resolve decodes it and refuses it


def _stored(**changes: object) -> StoredMessage:
    fields: dict[str, object] = dict(
        topic="%NS%orders", queue_id=2, queue_offset=41, body=b"x" * 100, message_id="01ABC",
        message_type=MessageType.FIFO,
        tag="TagA", keys=("k1", "k2"), message_group="g1", properties={"a": "1", "b": "2"},
        system_properties={"TRACE_CONTEXT": "tc"}, born_timestamp_ms=1_700_000_000_123, born_host="10.0.0.1",
        store_timestamp_ms=1_700_000_000_456, store_host="10.0.0.2:8081", delivery_timestamp_ms=1_700_000_009_789,
        delivery_attempt=2, body_gzip=True, receipt_handle="broker-a~AQ", invisible_until_ms=1,
    )  # fmt: skip
    fields.update(changes)
    return delivered(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "msg",
    [
        _stored(),
        _stored(
            tag=None,
            keys=(),
            message_group=None,
            properties={},
            system_properties={},
            body_gzip=False,
            delivery_timestamp_ms=0,
            receipt_handle="",
            delivery_attempt=0,
            message_type=MessageType.NORMAL,
        ),
        _stored(topic="%DLQ%g", system_properties={"DLQ_ORIGIN_TOPIC": "orders"}),
    ],
)
def test_a_frame_filled_in_place_carries_the_delivered_message(msg: StoredMessage) -> None:
    frame = spb.ReceiveMessageResponse()
    convert.fill_delivered(frame.message, msg, "")
    built = convert.delivered(msg, "")
    assert frame.WhichOneof("content") == "message"
    assert frame.message == built
    wire = spb.ReceiveMessageResponse(message=built).SerializeToString(deterministic=True)  # map order
    assert frame.SerializeToString(deterministic=True) == wire
    sp = frame.message.system_properties
    assert sp.delivery_attempt == max(1, msg.delivery_attempt)
    assert sp.born_timestamp.ToMilliseconds() == msg.born_timestamp_ms
    assert sp.HasField("delivery_timestamp") == bool(msg.delivery_timestamp_ms)
    if msg.delivery_timestamp_ms:
        assert sp.delivery_timestamp.ToMilliseconds() == msg.delivery_timestamp_ms
    assert dict(frame.message.user_properties) == msg.properties


class _Consumer:
    """Answers each ack with the result given for its handle (what ConsumerService.ack returns)."""

    def __init__(self, results: dict[str, AckResult]) -> None:
        self.results = results
        self.asked: list[tuple[str, str, list[str]]] = []

    async def ack(self, ctx: CallContext, group: str, topic: str, handles: list[str]) -> list[AckResult]:
        self.asked.append((group, topic, handles))
        return [self.results[h] for h in handles]


def _ack(results: dict[str, AckResult]) -> tuple[spb.AckMessageResponse, _Consumer]:
    consumer = _Consumer(results)
    app = cast(ProxyApp, SimpleNamespace(consumer=consumer, config=ProxyConfig()))
    ctx = RequestContext(request_id="r1", client_id="cid", language="PYTHON", client_version="5", peer="127.0.0.1")
    request = spb.AckMessageRequest(
        group=pb.Resource(name="g"),
        topic=pb.Resource(name="t"),
        entries=[spb.AckMessageEntry(message_id=f"m{i}", receipt_handle=h) for i, h in enumerate(results)],
    )
    return asyncio.run(consume.ack_message(app, ctx, request)), consumer


def test_an_ack_answers_every_entry_with_its_handle_and_status() -> None:
    response, consumer = _ack({"b~1": AckResult("b~1"), "b~2": AckResult("b~2")})
    assert consumer.asked == [("g", "t", ["b~1", "b~2"])]
    assert [(e.message_id, e.receipt_handle, e.status.code, e.status.message) for e in response.entries] == [
        ("m0", "b~1", Code.OK, "OK"),
        ("m1", "b~2", Code.OK, "OK"),
    ]
    assert (response.status.code, response.status.message) == (Code.OK, "OK")


def test_an_ack_with_mixed_results_is_multiple_results_with_each_entrys_code() -> None:
    bad = AckResult("b~2", InvalidReceiptHandle("this handle is spent"))
    response, _ = _ack({"b~1": AckResult("b~1"), "b~2": bad})
    assert [(e.status.code, e.status.message) for e in response.entries] == [
        (Code.OK, "OK"),
        (Code.INVALID_RECEIPT_HANDLE, "this handle is spent"),
    ]
    assert response.status.code == Code.MULTIPLE_RESULTS


def test_an_ack_failing_alike_answers_that_failure_at_the_top() -> None:
    bad = AckResult("b~1", InvalidReceiptHandle(""))
    response, _ = _ack({"b~1": bad})
    assert (response.status.code, response.status.message) == (Code.INVALID_RECEIPT_HANDLE, "InvalidReceiptHandle")
    assert response.entries[0].status == response.status
