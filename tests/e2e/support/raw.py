"""Raw `apache.rocketmq.v2` requests through the official client's generated stubs.

For what a well-behaved client never sends (bad input at the protocol edge) and for reading what
the server tells clients (Telemetry settings). Uses `rocketmq.grpc_protocol` — never Sluice's own
protobuf modules, which cannot live in this process next to the client's.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc

RPC_TIMEOUT_S = 10.0
Metadata = list[tuple[str, str]]


def headers(*, client_id: str | None = "e2e-raw@1@0@raw", namespace: str | None = "") -> Metadata:
    """What the Python client sends (minus the signature), with parts left out on request."""
    md = [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
          ("x-mq-request-id", str(uuid.uuid4()))]  # fmt: skip
    if client_id is not None:
        md.append(("x-mq-client-id", client_id))
    if namespace is not None:
        md.append(("x-mq-namespace", namespace))
    return md


@contextmanager
def stub(address: str) -> Iterator[service_pb2_grpc.MessagingServiceStub]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(address, options=options) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


def code_name(code: int) -> str:
    try:
        return pb.Code.Name(code)
    except ValueError:
        return str(code)


def resource(name: str, namespace: str = "") -> pb.Resource:
    return pb.Resource(name=name, resource_namespace=namespace)


def message(
    topic: str, body: bytes = b"raw body", *, message_type: int = pb.NORMAL, namespace: str = "",
    group: str | None = None, properties: dict[str, str] | None = None,
) -> pb.Message:  # fmt: skip
    msg = pb.Message(topic=resource(topic, namespace), body=body)
    sp = msg.system_properties
    sp.message_id = uuid.uuid4().hex.upper()
    sp.message_type = message_type
    sp.body_encoding = pb.IDENTITY
    sp.born_timestamp.GetCurrentTime()
    sp.born_host = "127.0.0.1"
    if group is not None:
        sp.message_group = group
    msg.user_properties.update(properties or {})
    return msg


def send(
    s: service_pb2_grpc.MessagingServiceStub, *messages: pb.Message, metadata: Metadata | None = None
) -> spb.SendMessageResponse:
    return s.SendMessage(spb.SendMessageRequest(messages=list(messages)),
                         metadata=headers() if metadata is None else metadata, timeout=RPC_TIMEOUT_S)  # fmt: skip


def receive_request(
    topic: str, group: str, *, broker: str = "", filter_type: int = pb.TAG, expression: str = "*",
    invisible_s: int = 15, long_poll_s: int = 1, batch: int = 16, namespace: str = "",
) -> spb.ReceiveMessageRequest:  # fmt: skip
    return spb.ReceiveMessageRequest(
        group=resource(group, namespace),
        message_queue=pb.MessageQueue(topic=resource(topic, namespace), id=0, broker=pb.Broker(name=broker)),
        filter_expression=pb.FilterExpression(type=filter_type, expression=expression),
        batch_size=batch,
        invisible_duration=Duration(seconds=invisible_s),
        long_polling_timeout=Duration(seconds=long_poll_s),
    )


def receive(
    s: service_pb2_grpc.MessagingServiceStub, request: spb.ReceiveMessageRequest, *, metadata: Metadata | None = None
) -> tuple[list[pb.Status], list[pb.Message]]:
    """All frames of one ReceiveMessage: (status frames, messages). The stream must end by itself."""
    statuses, messages = [], []
    for frame in s.ReceiveMessage(request, metadata=headers() if metadata is None else metadata,
                                  timeout=RPC_TIMEOUT_S):  # fmt: skip
        if frame.HasField("status"):
            statuses.append(frame.status)
        elif frame.HasField("message"):
            messages.append(frame.message)
    return statuses, messages


def advertised_settings(address: str, topic: str) -> pb.Settings:
    """Open Telemetry as a Python producer does, send its Settings, return the server's reply."""
    settings = pb.Settings(client_type=pb.PRODUCER, request_timeout=Duration(seconds=3))
    settings.publishing.topics.add(name=topic)
    settings.publishing.max_body_size = 128 * 1024 * 1024
    settings.publishing.validate_message_type = True
    settings.user_agent.language = pb.PYTHON
    settings.user_agent.version = "5.1.2"
    outbox: queue.Queue[spb.TelemetryCommand | None] = queue.Queue()
    outbox.put(spb.TelemetryCommand(settings=settings))
    done = threading.Event()

    def commands() -> Iterator[spb.TelemetryCommand]:
        while (cmd := outbox.get()) is not None:
            yield cmd
        done.wait(RPC_TIMEOUT_S)

    with stub(address) as s:
        call = s.Telemetry(commands(), metadata=headers(client_id="e2e-settings-probe@1@0@x"), timeout=RPC_TIMEOUT_S)
        try:
            reply: spb.TelemetryCommand = next(iter(call))
        finally:
            done.set()
            outbox.put(None)
            call.cancel()
    assert reply.status.code == pb.OK, f"settings reply status {code_name(reply.status.code)}"
    assert reply.WhichOneof("command") == "settings", f"telemetry reply without settings: {reply}"
    return reply.settings


def assert_drained(
    address: str, brokers: list[str], topic: str, group: str, *, filter_type: int = pb.TAG, expression: str = "*",
    namespace: str = "",
) -> None:  # fmt: skip
    """Nothing is left for `group` on any broker: a receive naming each broker (the proxy pops from
    that broker first, then from the topic's others) long-polls and finds nothing. Deterministic,
    unlike the Python client, which picks a queue at random for each receive."""
    with stub(address) as s:
        for broker in brokers:
            request = receive_request(topic, group, broker=broker, filter_type=filter_type, expression=expression,
                                      namespace=namespace)  # fmt: skip
            statuses, messages = receive(s, request, metadata=headers(namespace=namespace))
            leftovers = [(m.system_properties.message_id, m.system_properties.tag, m.body[:20]) for m in messages]
            assert not messages, f"broker {broker} still delivers {leftovers} to {group}"
            assert [code_name(st.code) for st in statuses] == ["MESSAGE_NOT_FOUND"]


def query_route(
    s: service_pb2_grpc.MessagingServiceStub, topic: str, *, namespace: str = "", metadata: Metadata | None = None
) -> spb.QueryRouteResponse:
    return s.QueryRoute(spb.QueryRouteRequest(topic=resource(topic, namespace)),
                        metadata=headers() if metadata is None else metadata, timeout=RPC_TIMEOUT_S)  # fmt: skip
