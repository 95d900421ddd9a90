"""SendMessage conversion at the edge (proxy/grpc/convert.py): the column-wise `outgoing_many`
builds the same `OutgoingMessage`s as `outgoing` message by message, and declines (None) every
request it cannot convert alike, so the caller falls back to `outgoing`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


def one_by_one(msgs: list[pb.Message]) -> list[object]:
    return [convert.outgoing(m, PEER) for m in msgs]


@PROPS
@given(st.lists(messages(), min_size=1, max_size=6))
def test_outgoing_many_equals_outgoing_or_declines(msgs: list[pb.Message]) -> None:
    got = convert.outgoing_many(msgs, PEER)
    sps = [m.system_properties for m in msgs]
    needs_one_by_one = any(
        sp.HasField("trace_context") or sp.HasField("orphaned_transaction_recovery_duration")
        or sp.HasField("delivery_timestamp") or sp.message_type == 99 or sp.HasField("lite_topic")
        or sp.HasField("priority") or not sp.born_host
        for sp in sps
    )  # fmt: skip
    if needs_one_by_one:
        assert got is None
        return
    assert got == one_by_one(msgs)


def test_each_message_gets_its_own_system_properties() -> None:
    m = pb.Message(body=b"x")
    m.system_properties.message_id = "id"
    m.system_properties.born_host = "h"
    a, b = convert.outgoing_many([m, m], PEER) or []
    a.system_properties["x"] = "y"
    assert b.system_properties == {}


def test_a_set_but_empty_tag_is_kept_empty_and_an_unset_one_is_none() -> None:
    tagged, untagged = pb.Message(), pb.Message()
    tagged.system_properties.tag = ""
    for m in (tagged, untagged):
        m.system_properties.born_host = "h"
    first, second = convert.outgoing_many([tagged, untagged], PEER) or []
    assert first.tag == "" and second.tag is None
