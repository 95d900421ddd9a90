"""`broker.client.grpc_convert`: every BrokerApi dataclass survives dataclass → proto → bytes → proto → dataclass.

Values are drawn by hypothesis within the wire ranges (int32 ids and counts, int64 offsets and
times, valid UTF-8 text). Also: None travels as an absent optional field (not ""), absent
sub-messages and UNSPECIFIED enums decode to the dataclass defaults, and unknown enum numbers from
the wire are a BadRequest, never a crash. No network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import grpc_convert as convert
from broker.client.api import (
    AckResult,
    BackoffKind,
    BrokerInfo,
    ConsumeFrom,
    FilterKind,
    FilterSpec,
    GroupInfo,
    GroupQueueStatus,
    GroupSpec,
    GroupStatus,
    OffsetPolicy,
    PopRequest,
    PullResult,
    QueueStatus,
    RetryPolicy,
    SendResult,
    StoredMessage,
    TopicSpec,
    TopicStatus,
)
from common import record
from common.errors import (
    BadRequest,
    ConsumerGroupNotFound,
    InternalError,
    InvalidReceiptHandle,
    MessageCorrupted,
    TooManyRequests,
)
from common.model import MessageType, Permission
from proto.sluice.internal.v1 import broker_pb2 as pb
from tests.helpers.records import delivered

T = TypeVar("T")

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # no lone surrogates: not UTF-8
SMALL_MAP = st.dictionaries(TEXT, TEXT, max_size=4)
MESSAGE_TYPES = st.sampled_from(list(MessageType))

topic_specs = st.builds(
    TopicSpec,
    name=TEXT,
    queue_count=INT32,
    message_types=st.frozensets(MESSAGE_TYPES),
    permission=st.sampled_from(list(Permission)),
)
retry_policies = st.builds(
    RetryPolicy,
    kind=st.sampled_from(list(BackoffKind)),
    initial_ms=INT64,
    max_ms=INT64,
    multiplier=st.floats(allow_nan=False),
    customized_ms=st.lists(INT64, max_size=5).map(tuple),
)
group_specs = st.builds(
    GroupSpec,
    name=TEXT,
    fifo=st.booleans(),
    max_delivery_attempts=INT32,
    retry_policy=retry_policies,
    consume_from=st.sampled_from(list(ConsumeFrom)),
    consume_from_timestamp_ms=INT64,
)
group_infos = st.builds(GroupInfo, spec=group_specs, created_ms=INT64)
topic_statuses = st.builds(
    TopicStatus,
    spec=topic_specs,
    queues=st.lists(st.builds(QueueStatus, INT32, INT64, INT64, INT64), max_size=4).map(tuple),
    local_bytes=INT64,
    delivered=INT64,
)
group_statuses = st.builds(
    GroupStatus,
    info=group_infos,
    queues=st.lists(st.builds(GroupQueueStatus, TEXT, INT32, INT64, INT64, INT64, INT64, INT64), max_size=4).map(tuple),
)
# A delivered message within its record's ranges (unsigned queue id, offsets and times; a tag or a
# message group is absent or has characters): the internal stream carries the record's bytes.
U32 = st.integers(min_value=0, max_value=2**32 - 1)
U63 = st.integers(min_value=0, max_value=2**63 - 1)
NAME = st.none() | TEXT.filter(bool)
stored_messages = st.builds(
    delivered,
    topic=TEXT,
    queue_id=U32,
    queue_offset=U63,
    body=st.binary(max_size=64),
    message_id=TEXT,
    message_type=MESSAGE_TYPES,
    tag=NAME,
    keys=st.lists(TEXT, max_size=3).map(tuple),
    message_group=NAME,
    properties=SMALL_MAP,
    system_properties=SMALL_MAP,
    born_timestamp_ms=U63,
    born_host=TEXT,
    store_timestamp_ms=U63,
    store_host=TEXT,
    delivery_timestamp_ms=U63,
    delivery_attempt=INT32,
    body_gzip=st.booleans(),
    receipt_handle=TEXT,
    invisible_until_ms=INT64,
)
filter_specs = st.builds(FilterSpec, kind=st.sampled_from(list(FilterKind)), expression=TEXT)
pop_requests = st.builds(
    PopRequest,
    group=TEXT,
    topic=TEXT,
    queue_id=st.none() | INT32,
    max_messages=INT32,
    invisible_ms=INT64,
    filter=filter_specs,
    long_poll_ms=INT64,
)
send_results = st.builds(SendResult, TEXT, INT32, INT64, TEXT, TEXT)
pull_results = st.builds(PullResult, st.lists(stored_messages, max_size=3), INT64, INT64, INT64)
broker_infos = st.builds(BrokerInfo, TEXT, INT64, INT64, INT64, INT64, INT64, INT64, INT64)


def through_wire(value: T, to_pb: Callable[[T], Any], from_pb: Callable[[Any], T]) -> T:
    """dataclass → proto → bytes → proto → dataclass."""
    message = to_pb(value)
    decoded = type(message).FromString(message.SerializeToString())
    return from_pb(decoded)


# (strategy, to_pb, from_pb) for every dataclass that crosses the internal RPC.
ROUND_TRIPS: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], Any], Callable[[Any], Any]]] = {
    "TopicSpec": (topic_specs, convert.topic_spec_to_pb, convert.topic_spec_from_pb),
    "TopicStatus": (topic_statuses, convert.topic_status_to_pb, convert.topic_status_from_pb),
    "RetryPolicy": (retry_policies, convert.retry_policy_to_pb, convert.retry_policy_from_pb),
    "GroupSpec": (group_specs, convert.group_spec_to_pb, convert.group_spec_from_pb),
    "GroupInfo": (group_infos, convert.group_info_to_pb, convert.group_info_from_pb),
    "GroupStatus": (group_statuses, convert.group_status_to_pb, convert.group_status_from_pb),
    "StoredMessage": (stored_messages, convert.stored_to_pb, convert.stored_from_pb),
    "SendResult": (send_results, convert.send_result_to_pb, convert.send_result_from_pb),
    "FilterSpec": (filter_specs, convert.filter_to_pb, convert.filter_from_pb),
    "PopRequest": (pop_requests, convert.pop_request_to_pb, convert.pop_request_from_pb),
    "PullResult": (pull_results, convert.pull_result_to_pb, convert.pull_result_from_pb),
    "BrokerInfo": (broker_infos, convert.broker_info_to_pb, convert.broker_info_from_pb),
}


@pytest.mark.parametrize("kind", sorted(ROUND_TRIPS))
def test_round_trip(kind: str) -> None:
    strategy, to_pb, from_pb = ROUND_TRIPS[kind]

    @settings(max_examples=60, deadline=None)
    @given(strategy)
    def check(value: Any) -> None:
        assert through_wire(value, to_pb, from_pb) == value

    check()


@pytest.mark.parametrize("policy", list(OffsetPolicy))
def test_offset_policy_round_trip(policy: OffsetPolicy) -> None:
    assert convert.offset_policy_from_pb(convert.offset_policy_to_pb(policy)) is policy


def test_every_dataclass_field_has_a_proto_field() -> None:
    """A field added to a dataclass in broker/client/api.py must be added to broker.proto too."""
    pairs: list[tuple[Any, Any]] = [
        (TopicSpec, pb.TopicSpec),
        (RetryPolicy, pb.RetryPolicy),
        (GroupSpec, pb.GroupSpec),
        (GroupInfo, pb.GroupInfo),
        (QueueStatus, pb.QueueStatus),
        (TopicStatus, pb.TopicStatus),
        (GroupQueueStatus, pb.GroupQueueStatus),
        (GroupStatus, pb.GroupStatus),
        (SendResult, pb.SendResult),
        (FilterSpec, pb.FilterSpec),
        (PopRequest, pb.PopRequest),
        (PullResult, pb.PullResult),
        (BrokerInfo, pb.BrokerInfoResponse),
    ]
    for cls, message in pairs:
        names = cls._fields if issubclass(cls, tuple) else [f.name for f in dataclasses.fields(cls)]  # NamedTuple
        assert set(names) == set(message.DESCRIPTOR.fields_by_name), cls.__name__


ERROR_CLASSES = st.sampled_from([InvalidReceiptHandle, ConsumerGroupNotFound, TooManyRequests, InternalError])


@settings(max_examples=60, deadline=None)
@given(TEXT, st.none() | st.builds(lambda cls, text: cls(text or "x"), ERROR_CLASSES, TEXT))
def test_an_ack_result_carries_its_error_class_and_message_over_the_wire(handle: str, error: Any) -> None:
    """AckResult holds the error itself; the wire holds its code and message (the broker edge's
    one map, `proto.rpc.wire_error`), from which the client rebuilds the same class."""
    back = through_wire(AckResult(handle, error), convert.ack_result_to_pb, convert.ack_result_from_pb)
    assert back.receipt_handle == handle and back.ok is (error is None)
    if error is not None:
        assert type(back.error) is type(error) and back.error.message == error.message
    assert set(pb.AckResult.DESCRIPTOR.fields_by_name) == {"receipt_handle", "ok", "error_code", "error_message"}


def test_none_travels_as_absent_optional_field() -> None:
    assert not convert.pop_request_to_pb(PopRequest("g", "t", queue_id=None)).HasField("queue_id")
    assert convert.pop_request_to_pb(PopRequest("g", "t", queue_id=0)).HasField("queue_id")


def test_absent_and_unspecified_decode_to_defaults() -> None:
    assert convert.group_spec_from_pb(pb.GroupSpec(name="g")) == GroupSpec("g", fifo=False, max_delivery_attempts=0)
    assert convert.pop_request_from_pb(pb.PopRequest(group="g", topic="t")).filter == FilterSpec()
    assert convert.filter_or_default(pb.PullRequest()) == FilterSpec()


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        (convert.topic_spec_from_pb, pb.TopicSpec(name="t", queue_count=1, message_types=[9], permission=4)),
        (convert.topic_spec_from_pb, pb.TopicSpec(name="t", queue_count=1, message_types=[1], permission=0)),
        (convert.group_spec_from_pb, pb.GroupSpec(name="g", consume_from=9)),  # type: ignore[arg-type]
        (convert.retry_policy_from_pb, pb.RetryPolicy(kind=5)),  # type: ignore[arg-type]
        (convert.filter_from_pb, pb.FilterSpec(kind=3)),  # type: ignore[arg-type]
        (convert.offset_policy_from_pb, pb.OFFSET_POLICY_UNSPECIFIED),
    ],
)
def test_unknown_enum_numbers_are_bad_requests(decode: Callable[[Any], Any], message: Any) -> None:
    with pytest.raises(BadRequest, match="unknown"):
        decode(message)


def _read_back(topic: str = "orders", store_host: str = "10.0.0.2:8081") -> StoredMessage:
    """A delivery of a record as a store read leaves it: decoded from its sealed bytes (`raw`)."""
    sent = record.received([record.outgoing(b"body", "01ID", tag="TagA", properties={"p": "1"})], topic, 3,
                           store_host)[0]  # fmt: skip
    buf = record.encode_one(sent, 1 << 20)
    record.seal(buf, 41, 4096, 1_700_000_000_000)
    return StoredMessage(record.decode(bytes(buf)), 2, "handle", 99, "broker-address:1")


def test_a_delivered_record_crosses_the_stream_as_its_stored_bytes() -> None:
    msg = _read_back()
    wire = convert.stored_to_pb(msg)
    assert wire.record == msg.record.raw  # unchanged: no field re-encoded
    assert not wire.store_host  # the record names its store host
    back = convert.stored_from_pb(pb.StoredMessage.FromString(wire.SerializeToString()))
    assert back == msg and back.record.raw == msg.record.raw
    assert (back.queue_offset, back.store_timestamp_ms, back.tag, back.properties) == (41, 1_700_000_000_000, "TagA",
                                                                                      {"p": "1"})  # fmt: skip


def test_a_record_without_a_store_host_is_delivered_with_the_brokers_address() -> None:
    msg = _read_back(store_host="")
    assert msg.store_host == "broker-address:1"
    wire = convert.stored_to_pb(msg)
    assert wire.store_host == "broker-address:1"
    assert convert.stored_from_pb(wire).store_host == "broker-address:1"


def test_a_record_not_read_from_bytes_is_encoded_and_sealed_for_the_stream() -> None:
    """A tiered archive's row, a transaction check's copy: no `raw`; the stream carries its encoding."""
    msg = _read_back()
    rec = dataclasses.replace(msg.record, topic="elsewhere", raw=b"")
    copy = StoredMessage(rec, 1)
    back = convert.stored_from_pb(convert.stored_to_pb(copy))
    assert back == copy and back.topic == "elsewhere"


def test_corrupt_record_bytes_are_refused_naming_the_stream() -> None:
    raw = bytearray(_read_back().record.raw)
    raw[-1] ^= 0xFF
    with pytest.raises(MessageCorrupted, match=r"delivered message.*CRC"):
        convert.stored_from_pb(pb.StoredMessage(record=bytes(raw)))
