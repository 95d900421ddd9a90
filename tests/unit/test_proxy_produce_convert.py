"""SendMessage conversion at the edge (proxy/grpc/convert.py): `outgoing` encodes a client's
message straight into its record (`common.record.outgoing`), which decodes to exactly what the
client sent, or refuses it with the error the message alone earns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import record
from common.errors import IllegalMessageTag, SluiceError
from common.record import SYSPROP_LITE_TOPIC, SYSPROP_PRIORITY
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proxy.grpc import convert

PROPS = settings(deadline=None, derandomize=True, database=None, max_examples=300)
PEER = "10.0.0.9:4711"

texts = st.text(max_size=6)


@st.composite
def messages(draw: st.DrawFn) -> pb.Message:
    m = pb.Message()
    m.topic.name = "orders"
    m.body = draw(st.binary(max_size=8))
    for k, v in draw(st.dictionaries(texts, texts, max_size=3)).items():
        m.user_properties[k] = v
    sp = m.system_properties
    sp.message_id = draw(texts)
    sp.message_type = draw(st.sampled_from([pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION,
                                            pb.MESSAGE_TYPE_UNSPECIFIED]))  # fmt: skip
    if draw(st.booleans()):
        sp.tag = draw(texts)
    if draw(st.booleans()):
        sp.message_group = draw(texts)
    sp.keys.extend(draw(st.lists(texts, max_size=2)))
    sp.born_timestamp.seconds = draw(st.integers(0, 2_000_000_000))
    sp.born_timestamp.nanos = draw(st.integers(0, 999_999_999))
    sp.born_host = draw(st.sampled_from(["", "10.1.2.3"]))
    sp.body_encoding = draw(st.sampled_from([pb.IDENTITY, pb.GZIP, pb.ENCODING_UNSPECIFIED]))
    rare = draw(st.sampled_from(["", "", "", "trace", "recovery", "delivery", "type", "lite", "priority"]))
    if rare == "trace":
        sp.trace_context = draw(texts)
    elif rare == "recovery":
        sp.orphaned_transaction_recovery_duration.seconds = 5
    elif rare == "delivery":
        sp.delivery_timestamp.seconds = 1_900_000_000
    elif rare == "type":
        sp.message_type = 99  # a type this proxy does not know  # type: ignore[assignment]
    elif rare == "lite":
        sp.message_type = pb.LITE
        sp.lite_topic = "chat-1"
    elif rare == "priority":
        sp.message_type = pb.PRIORITY
        sp.priority = 3
    return m


@PROPS
@given(messages())
def test_the_record_decodes_to_what_the_client_sent(msg: pb.Message) -> None:
    sp = msg.system_properties
    try:
        data = convert.outgoing(msg, PEER)
    except SluiceError:
        assert sp.message_type == 99 or (sp.HasField("tag") and sp.tag == "")
        return
    rec = record.decode(data)
    assert (rec.topic, rec.queue_id, rec.store_host, rec.queue_offset) == ("", 0, "", 0)  # the broker's to write
    assert (rec.body, rec.message_id, rec.keys, rec.properties) == (
        msg.body, sp.message_id, tuple(sp.keys), dict(msg.user_properties)
    )  # fmt: skip
    assert rec.message_type == (sp.message_type or pb.NORMAL)
    assert rec.tag == (sp.tag if sp.HasField("tag") else None)
    assert rec.message_group == (sp.message_group or None)
    assert rec.born_timestamp_ms == sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000
    assert rec.born_host == (sp.born_host or PEER)
    assert rec.flags == (record.FLAG_BODY_GZIP if sp.body_encoding == pb.GZIP else 0)
    assert rec.delivery_timestamp_ms == (sp.delivery_timestamp.seconds * 1000 if sp.HasField("delivery_timestamp")
                                         else 0)  # fmt: skip
    expected = {}
    if sp.HasField("trace_context"):
        expected[convert.SYSPROP_TRACE_CONTEXT] = sp.trace_context
    if sp.HasField("orphaned_transaction_recovery_duration"):
        expected[convert.SYSPROP_TX_RECOVERY_MS] = "5000"
    if sp.HasField("lite_topic"):
        expected[SYSPROP_LITE_TOPIC] = sp.lite_topic
    if sp.HasField("priority"):
        expected[SYSPROP_PRIORITY] = str(sp.priority)
    assert rec.system_properties == expected


def test_a_set_but_empty_tag_is_refused_and_an_unset_one_is_none() -> None:
    tagged, untagged = pb.Message(), pb.Message()
    tagged.system_properties.tag = ""
    with pytest.raises(IllegalMessageTag):
        convert.outgoing(tagged, PEER)
    assert record.decode(convert.outgoing(untagged, PEER)).tag is None
