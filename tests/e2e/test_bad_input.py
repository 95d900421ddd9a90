"""Bad input at the protocol edge: raw requests through the official client's generated stubs, to a
proxy. Each gets its `Code` in the response Status (never a gRPC error, never a crash), and the
proxy keeps serving: a normal send succeeds right after. Merged and separated topologies."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.e2e.support import raw
from tests.e2e.support.cluster import Cluster

Stub = service_pb2_grpc.MessagingServiceStub


@dataclass(frozen=True)
class Target:
    address: str  # one proxy
    topic: str  # NORMAL
    group: str
    max_body: int  # what the proxy tells clients in Settings
    brokers: list[str]


@pytest.fixture(scope="module")
def target(cluster: Cluster) -> Target:
    topic = cluster.create_topic(f"bad-input-{cluster.kind}", queues=2)
    group = cluster.create_group(f"bad-input-{cluster.kind}")
    max_body = raw.advertised_settings(cluster.first_proxy, topic).publishing.max_body_size
    return Target(cluster.first_proxy, topic, group, max_body, cluster.brokers)


@pytest.fixture
def s(target: Target) -> Iterator[Stub]:
    with raw.stub(target.address) as stub:
        yield stub
        # Whatever came before, the proxy still serves a well-formed request.
        ok = raw.send(stub, raw.message(target.topic, b"still serving"))
        assert [raw.code_name(e.status.code) for e in ok.entries] == ["OK"], ok


def send_code(s: Stub, *messages: pb.Message, metadata: raw.Metadata | None = None) -> str:
    response = raw.send(s, *messages, metadata=metadata)
    entries = {raw.code_name(e.status.code) for e in response.entries}
    assert entries <= {raw.code_name(response.status.code)}, response  # one message: entry = top level
    return raw.code_name(response.status.code)


def receive_code(s: Stub, request: spb.ReceiveMessageRequest, metadata: raw.Metadata | None = None) -> str:
    statuses, messages = raw.receive(s, request, metadata=metadata)
    assert len(statuses) == 1 and not messages, (statuses, messages)  # exactly one status frame on failure
    return raw.code_name(statuses[0].code)


# -- missing or malformed fields -------------------------------------------------------------------


def test_no_client_id_header(s: Stub, target: Target) -> None:
    no_id = raw.headers(client_id=None)
    assert send_code(s, raw.message(target.topic), metadata=no_id) == "CLIENT_ID_REQUIRED"
    assert receive_code(s, raw.receive_request(target.topic, target.group), metadata=no_id) == "CLIENT_ID_REQUIRED"
    route = raw.query_route(s, target.topic, metadata=no_id)
    assert raw.code_name(route.status.code) == "CLIENT_ID_REQUIRED"
    heartbeat = s.Heartbeat(spb.HeartbeatRequest(client_type=pb.PRODUCER), metadata=no_id, timeout=raw.RPC_TIMEOUT_S)
    assert raw.code_name(heartbeat.status.code) == "CLIENT_ID_REQUIRED"
    settings = spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))
    replies = list(s.Telemetry(iter([settings]), metadata=no_id, timeout=raw.RPC_TIMEOUT_S))
    assert [raw.code_name(r.status.code) for r in replies] == ["CLIENT_ID_REQUIRED"]


def test_no_topic(s: Stub, target: Target) -> None:
    assert send_code(s, raw.message("")) == "ILLEGAL_TOPIC"
    assert raw.code_name(raw.query_route(s, "").status.code) == "ILLEGAL_TOPIC"
    assert receive_code(s, raw.receive_request("", target.group)) == "ILLEGAL_TOPIC"


def test_malformed_topic_name(s: Stub, target: Target) -> None:
    for name in ("not a topic!", "t" * 200, "tópico"):
        assert send_code(s, raw.message(name)) == "ILLEGAL_TOPIC", name
        assert raw.code_name(raw.query_route(s, name).status.code) == "ILLEGAL_TOPIC", name
        assert receive_code(s, raw.receive_request(name, target.group)) == "ILLEGAL_TOPIC", name


def test_no_consumer_group(s: Stub, target: Target) -> None:
    assert receive_code(s, raw.receive_request(target.topic, "")) == "ILLEGAL_CONSUMER_GROUP"
    ack = s.AckMessage(spb.AckMessageRequest(topic=raw.resource(target.topic),
                                             entries=[spb.AckMessageEntry(message_id="x", receipt_handle="x")]),
                       metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
    assert raw.code_name(ack.status.code) == "ILLEGAL_CONSUMER_GROUP"


def test_malformed_or_unknown_consumer_group(s: Stub, target: Target) -> None:
    assert receive_code(s, raw.receive_request(target.topic, "not a group!")) == "ILLEGAL_CONSUMER_GROUP"
    assert receive_code(s, raw.receive_request(target.topic, f"{target.group}-nope")) == "CONSUMER_GROUP_NOT_FOUND"


def test_a_batch_with_a_bad_message_is_refused_as_a_whole(s: Stub, target: Target, cluster: Cluster) -> None:
    # The official clients send one message per request; a batch is stored all or nothing, as in the
    # reference proxy, and every entry reports why.
    topic = cluster.create_topic(f"{target.topic}-batch", queues=2)
    response = raw.send(s, raw.message(topic, b"fine"), raw.message(topic, b""))
    assert raw.code_name(response.status.code) == "MESSAGE_BODY_EMPTY"
    assert [raw.code_name(e.status.code) for e in response.entries] == ["MESSAGE_BODY_EMPTY"] * 2
    assert sum(q["messages"] for q in cluster.admin("topic", "describe", topic)) == 0


def test_no_messages_in_a_send(s: Stub, target: Target) -> None:
    assert send_code(s) == "MESSAGE_CORRUPTED"


def test_no_message_id(s: Stub, target: Target) -> None:
    msg = raw.message(target.topic)
    msg.system_properties.message_id = ""
    assert send_code(s, msg) == "ILLEGAL_MESSAGE_ID"


def test_illegal_tag(s: Stub, target: Target) -> None:
    msg = raw.message(target.topic)
    msg.system_properties.tag = "a||b"
    assert send_code(s, msg) == "ILLEGAL_MESSAGE_TAG"


# -- unknown enum values ---------------------------------------------------------------------------


def test_unknown_message_type(s: Stub, target: Target) -> None:
    assert send_code(s, raw.message(target.topic, message_type=99)) == "BAD_REQUEST"


def test_unknown_filter_type(s: Stub, target: Target) -> None:
    request = raw.receive_request(target.topic, target.group, filter_type=9, expression="TagA")
    assert receive_code(s, request) == "ILLEGAL_FILTER_EXPRESSION"


# -- bodies and properties -------------------------------------------------------------------------


def test_empty_body(s: Stub, target: Target) -> None:
    assert send_code(s, raw.message(target.topic, b"")) == "MESSAGE_BODY_EMPTY"


def test_body_one_byte_over_the_advertised_limit(s: Stub, target: Target) -> None:
    assert send_code(s, raw.message(target.topic, b"x" * (target.max_body + 1))) == "MESSAGE_BODY_TOO_LARGE"


def test_too_many_properties(s: Stub, target: Target) -> None:
    many = {f"key{i}": "value" for i in range(1000)}
    assert send_code(s, raw.message(target.topic, properties=many)) == "MESSAGE_PROPERTIES_TOO_LARGE"


def test_properties_too_large(s: Stub, target: Target) -> None:
    big = {"big": "v" * (64 * 1024)}
    assert send_code(s, raw.message(target.topic, properties=big)) == "MESSAGE_PROPERTIES_TOO_LARGE"


def test_message_type_the_topic_does_not_accept(s: Stub, target: Target) -> None:
    fifo = raw.message(target.topic, message_type=pb.FIFO, group="g1")
    assert send_code(s, fifo) == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


# -- consumption -----------------------------------------------------------------------------------


def test_illegal_sql_filter(s: Stub, target: Target) -> None:
    for expression in ("a >>> (", "", "a = 'unterminated"):
        request = raw.receive_request(target.topic, target.group, filter_type=pb.SQL, expression=expression)
        assert receive_code(s, request) == "ILLEGAL_FILTER_EXPRESSION", expression


def test_illegal_invisible_duration(s: Stub, target: Target) -> None:
    request = raw.receive_request(target.topic, target.group)
    request.invisible_duration.CopyFrom(Duration(seconds=0))
    assert receive_code(s, request) == "ILLEGAL_INVISIBLE_TIME"


def test_bad_receipt_handles(s: Stub, target: Target, cluster: Cluster) -> None:
    def ack(handle: str, topic: str = target.topic, *, times: int = 1) -> tuple[str, list[str]]:
        entries = [spb.AckMessageEntry(message_id="id", receipt_handle=handle)] * times
        response = s.AckMessage(spb.AckMessageRequest(group=raw.resource(target.group), topic=raw.resource(topic),
                                                      entries=entries),
                                metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
        return raw.code_name(response.status.code), [raw.code_name(e.status.code) for e in response.entries]

    for handle in ("", "garbage", "broker-a~AAAA", "broker-a~" + "A" * 48, "x" * 5000):
        assert ack(handle) == ("INVALID_RECEIPT_HANDLE", ["INVALID_RECEIPT_HANDLE"]), handle
        change = s.ChangeInvisibleDuration(
            spb.ChangeInvisibleDurationRequest(group=raw.resource(target.group), topic=raw.resource(target.topic),
                                               receipt_handle=handle, invisible_duration=Duration(seconds=10),
                                               message_id="id"),
            metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S,
        )  # fmt: skip
        assert raw.code_name(change.status.code) == "INVALID_RECEIPT_HANDLE", handle
        assert change.receipt_handle == handle  # the Python client reads it even on failure

    # A real handle, spent by its ack, is refused afterwards.
    topic = cluster.create_topic(f"{target.topic}-spent", queues=2)
    raw.send(s, raw.message(topic, b"to be acked twice"))
    messages: list[pb.Message] = []
    for broker in target.brokers * 3:  # the message is on one broker; a receive pops from the one it names
        messages = raw.receive(s, raw.receive_request(topic, target.group, broker=broker))[1]
        if messages:
            break
    assert len(messages) == 1, messages
    handle = messages[0].system_properties.receipt_handle
    assert ack(handle, target.topic) == ("INVALID_RECEIPT_HANDLE", ["INVALID_RECEIPT_HANDLE"])  # other topic
    assert ack(handle, topic) == ("OK", ["OK"])
    assert ack(handle, topic) == ("INVALID_RECEIPT_HANDLE", ["INVALID_RECEIPT_HANDLE"])

    # One handle twice in one request: the first entry acks the message, the second is refused.
    raw.send(s, raw.message(topic, b"acked twice in one request"))
    for broker in target.brokers * 3:
        messages = raw.receive(s, raw.receive_request(topic, target.group, broker=broker))[1]
        if messages:
            break
    assert len(messages) == 1, messages
    handle = messages[0].system_properties.receipt_handle
    assert ack(handle, topic, times=2) == ("MULTIPLE_RESULTS", ["OK", "INVALID_RECEIPT_HANDLE"])
    assert ack(handle, topic) == ("INVALID_RECEIPT_HANDLE", ["INVALID_RECEIPT_HANDLE"])  # it was acked


# -- namespaces ------------------------------------------------------------------------------------


def test_topic_of_another_namespace_is_not_found(s: Stub, target: Target, cluster: Cluster) -> None:
    # Namespace A's topic `ns-topic` is the cluster-wide topic `A%ns-topic` (what admin creates).
    suffix = target.topic.rsplit("-", 1)[1]
    cluster.create_topic(f"nsA{suffix}%ns-topic", queues=2)
    ns_a, ns_b = f"nsA{suffix}", f"nsB{suffix}"

    def route(namespace: str, *, header_only: bool = False) -> str:
        md = raw.headers(namespace=namespace)
        response = raw.query_route(s, "ns-topic", namespace="" if header_only else namespace, metadata=md)
        return raw.code_name(response.status.code)

    def send(namespace: str, *, header_only: bool = False) -> str:
        msg = raw.message("ns-topic", namespace="" if header_only else namespace)
        return send_code(s, msg, metadata=raw.headers(namespace=namespace))

    assert route(ns_a) == "OK"
    assert route(ns_a, header_only=True) == "OK"  # Node sends the namespace only as a header
    assert send(ns_a) == "OK"
    assert send(ns_a, header_only=True) == "OK"
    assert route(ns_b) == "TOPIC_NOT_FOUND"
    assert route(ns_b, header_only=True) == "TOPIC_NOT_FOUND"
    assert send(ns_b) == "TOPIC_NOT_FOUND"
    assert route("") == "TOPIC_NOT_FOUND"  # no namespace: the plain name is not the namespaced topic
    routed = raw.query_route(s, "ns-topic", namespace=ns_a, metadata=raw.headers(namespace=ns_a))
    assert {(q.topic.name, q.topic.resource_namespace) for q in routed.message_queues} == {("ns-topic", ns_a)}


def test_unknown_topic(s: Stub, target: Target) -> None:
    assert send_code(s, raw.message(f"{target.topic}-nope")) == "TOPIC_NOT_FOUND"


# -- malformed handles and lite subscriptions of normal topics --------------------------------------


def test_recall_and_lite_subscription_bad_input(s: Stub, target: Target) -> None:
    md, timeout = raw.headers(), raw.RPC_TIMEOUT_S
    recall = s.RecallMessage(spb.RecallMessageRequest(topic=raw.resource(target.topic), recall_handle="h"),
                             metadata=md, timeout=timeout)  # fmt: skip
    assert raw.code_name(recall.status.code) == "BAD_REQUEST"  # malformed handle (recall: test_timers.py)
    lite = s.SyncLiteSubscription(spb.SyncLiteSubscriptionRequest(topic=raw.resource(target.topic),
                                                                  group=raw.resource(target.group),
                                                                  lite_topic_set=["x"]),
                                  metadata=md, timeout=timeout)  # fmt: skip
    # target.topic is a NORMAL topic: lite consumers bind to LITE topics (docs/lite-topics.md)
    assert raw.code_name(lite.status.code) == "BAD_REQUEST" and "not a LITE topic" in lite.status.message


# -- transactions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("transaction_id", ["", "tx", "broker-a~tnot-base64!", "no-such-broker~tAQAAAAAAAAAAhwAAAA"])
def test_end_transaction_with_a_bad_transaction_id(s: Stub, target: Target, transaction_id: str) -> None:
    end = s.EndTransaction(spb.EndTransactionRequest(topic=raw.resource(target.topic), message_id="id",
                                                     transaction_id=transaction_id, resolution=pb.COMMIT),
                           metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
    assert raw.code_name(end.status.code) == "INVALID_TRANSACTION_ID"
    assert end.status.message
