"""The consume path's edge pieces: routing a receipt handle by its envelope, and delivered frames.

An ack routes each handle by its broker name alone (the broker decodes the payload): a handle with
a malformed payload must still come back INVALID_RECEIPT_HANDLE, from the broker. A delivered
message is written straight into its response frame: the frame must carry exactly the Message
`convert.delivered` builds.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import receipt
from broker.api import StoredMessage
from common.errors import InvalidReceiptHandle
from common.model import MessageType
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.grpc import convert

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
    return StoredMessage(**fields)  # type: ignore[arg-type]


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
