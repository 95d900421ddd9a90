"""Our `apache.rocketmq.v2` protos are wire-identical to the ones the official Python client ships.

Sluice writes its own .proto files (proto/apache/rocketmq/v2/); the official thin clients are
used unchanged, so every message, field number, type, presence, oneof, map, enum value and RPC
must match what `rocketmq-python-client` compiled (its `rocketmq.grpc_protocol` modules).

Both sets of generated modules register the same symbols (`apache.rocketmq.v2.Resource`, ...)
in protobuf's default descriptor pool, so one process cannot import both: the second import
raises `TypeError: duplicate symbol`. This process imports only OURS; everything touching the
client's modules runs in a child interpreter that answers in JSON.

1. `describe()` (one function, its source is sent to the child) dumps a schema from descriptors;
   the two dumps must be equal.
2. Messages encoded by us decode in the client to the same content and re-encode to the same
   bytes, and the client's encoding of that content decodes here to the same message.
"""

from __future__ import annotations

import base64
import inspect
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import text_format
from google.protobuf.message import Message

from proto.apache.rocketmq.v2 import admin_pb2, definition_pb2, service_pb2

CLIENT_MODULES = "rocketmq.grpc_protocol"
SHOWN_DIFFERENCES_MAX = 25


def describe(files: list[Any]) -> dict[str, Any]:
    """Everything about `files` (FileDescriptors) that the wire or generated APIs depend on.

    Self-contained (imports inside) because its source also runs in the client's interpreter.
    File paths and declaration order are left out: they legitimately differ.
    """
    import os

    from google.protobuf import descriptor_pb2

    type_name = descriptor_pb2.FieldDescriptorProto.Type.Name
    dump: dict[str, Any] = {"files": {}, "messages": {}, "enums": {}, "services": {}}

    def add_enum(enum: Any, file: str) -> None:
        dump["enums"][enum.full_name] = {
            "file": file,
            "closed": enum.is_closed,
            "values": {v.name: v.number for v in enum.values},
        }

    def add_message(msg: Any, file: str) -> None:
        raw = descriptor_pb2.DescriptorProto()
        msg.CopyToProto(raw)
        # proto3 `optional` wraps its field in a synthetic oneof; record presence instead.
        synthetic = {raw.oneof_decl[f.oneof_index].name for f in raw.field if f.proto3_optional}
        fields = {}
        for f in msg.fields:
            target = f.message_type or f.enum_type
            oneof = f.containing_oneof
            fields[f.name] = {
                "number": f.number,
                "type": type_name(f.type),
                "type_name": target.full_name if target else None,
                "repeated": f.is_repeated,
                "packed": f.is_packed,
                "has_presence": f.has_presence,
                "oneof": oneof.name if oneof and oneof.name not in synthetic else None,
                "json_name": f.json_name,
            }
        dump["messages"][msg.full_name] = {
            "file": file,
            "map_entry": msg.GetOptions().map_entry,
            "oneofs": sorted(o.name for o in msg.oneofs if o.name not in synthetic),
            "fields": fields,
        }
        for nested in msg.nested_types:
            add_message(nested, file)
        for enum in msg.enum_types:
            add_enum(enum, file)

    for fd in files:
        raw_file = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(raw_file)
        file = os.path.basename(fd.name)
        dump["files"][file] = {"package": fd.package, "syntax": raw_file.syntax}
        for msg in fd.message_types_by_name.values():
            add_message(msg, file)
        for enum in fd.enum_types_by_name.values():
            add_enum(enum, file)
        for service in fd.services_by_name.values():
            dump["services"][service.full_name] = {
                "file": file,
                "methods": {
                    m.name: {
                        "input": m.input_type.full_name,
                        "output": m.output_type.full_name,
                        "client_streaming": m.client_streaming,
                        "server_streaming": m.server_streaming,
                    }
                    for m in service.methods
                },
            }
    return dump


# Runs first in the child: import the client's modules, or report that the package is absent.
# Then come describe()'s source (its annotations name `Any`, hence the __future__ import) and a
# task that reads JSON from stdin and prints its JSON answer.
CHILD_PRELUDE = f"""from __future__ import annotations
import base64, json, sys
try:
    from {CLIENT_MODULES} import admin_pb2, definition_pb2, service_pb2
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] != "rocketmq":
        raise
    print(json.dumps({{"skip": f"official client not installed: {{exc}}"}}))
    sys.exit(0)
FILES = [definition_pb2.DESCRIPTOR, service_pb2.DESCRIPTOR, admin_pb2.DESCRIPTOR]
"""

CHILD_DESCRIBE = """
print(json.dumps(describe(FILES)))
"""

CHILD_ROUND_TRIP = """
from google.protobuf import descriptor_pool, message_factory, text_format
answers = []
for sample in json.load(sys.stdin):
    cls = message_factory.GetMessageClass(
        descriptor_pool.Default().FindMessageTypeByName(sample["type"]))
    decoded = cls.FromString(base64.b64decode(sample["data"]))
    encoded = text_format.Parse(sample["text"], cls()).SerializeToString(deterministic=True)
    answers.append({
        "decoded_text": text_format.MessageToString(decoded),
        "reencoded": base64.b64encode(decoded.SerializeToString(deterministic=True)).decode(),
        "encoded_from_text": base64.b64encode(encoded).decode(),
    })
print(json.dumps(answers))
"""


def run_in_client(task: str, stdin: Any = None) -> Any:
    """Run `task` in a child interpreter that has imported the client's modules; its JSON answer."""
    script = CHILD_PRELUDE + textwrap.dedent(inspect.getsource(describe)) + task
    proc = subprocess.run(
        # -P: keep the working directory (this repository, with our `proto` package) off sys.path.
        [sys.executable, "-P", "-c", script],
        input=json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"client interpreter failed:\n{proc.stderr}"
    answer = json.loads(proc.stdout)
    if isinstance(answer, dict) and "skip" in answer:
        pytest.skip(answer["skip"])
    return answer


def differences(ours: Any, theirs: Any, path: str = "") -> Iterator[str]:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(ours.keys() | theirs.keys()):
            where = f"{path}/{key}"
            if key not in ours:
                yield f"{where}: missing in ours; client has {theirs[key]!r}"
            elif key not in theirs:
                yield f"{where}: only in ours: {ours[key]!r}"
            else:
                yield from differences(ours[key], theirs[key], where)
    elif ours != theirs:
        yield f"{path}: ours={ours!r} client={theirs!r}"


OUR_FILES = [definition_pb2.DESCRIPTOR, service_pb2.DESCRIPTOR, admin_pb2.DESCRIPTOR]


def test_schema_matches_official_client() -> None:
    ours = describe(OUR_FILES)
    theirs = run_in_client(CHILD_DESCRIBE)

    diff = list(differences(ours, theirs))
    shown = "\n".join(diff[:SHOWN_DIFFERENCES_MAX])
    more = f"\n... and {len(diff) - SHOWN_DIFFERENCES_MAX} more" if len(diff) > SHOWN_DIFFERENCES_MAX else ""
    assert not diff, f"{len(diff)} differences from the official client's schema:\n{shown}{more}"

    # Guard against two equal but empty dumps.
    assert len(ours["messages"]) > 60
    assert len(ours["services"]["apache.rocketmq.v2.MessagingService"]["methods"]) == 17
    assert set(ours["services"]["apache.rocketmq.v2.Admin"]["methods"]) == {"ChangeLogLevel"}


def send_message_request() -> Message:
    """What a producer sends: one NORMAL-ish message rich in properties, one FIFO, one DELAY."""
    req = service_pb2.SendMessageRequest()
    msg = req.messages.add()
    msg.topic.resource_namespace = "ns"
    msg.topic.name = "orders"
    msg.user_properties["region"] = "eu-west"
    msg.user_properties["Ünïcode"] = "värde ✓"
    msg.user_properties["empty"] = ""
    sp = msg.system_properties
    sp.tag = "TagA"
    sp.keys.extend(["k1", "k2"])
    sp.message_id = "01A1B2C3D4E5F60718293A4B5C"
    sp.body_digest.type = definition_pb2.MD5
    sp.body_digest.checksum = "5D41402ABC4B2A76B9719D911017C592"
    sp.body_encoding = definition_pb2.IDENTITY
    sp.message_type = definition_pb2.NORMAL
    sp.born_timestamp.seconds = 1_700_000_000
    sp.born_timestamp.nanos = 123_000_000
    sp.born_host = "app-host-1"
    sp.queue_id = 3
    sp.trace_context = "00-abc-def-01"
    sp.lite_topic = "lite-1"
    sp.priority = 0  # proto3 optional: present although zero
    msg.body = b"\x00\x01binary\xff\xfe body"

    fifo = req.messages.add()
    fifo.topic.name = "orders"
    fifo.system_properties.message_type = definition_pb2.FIFO
    fifo.system_properties.message_group = "customer-42"
    fifo.body = b"fifo"

    delay = req.messages.add()
    delay.topic.name = "reminders"
    delay.system_properties.message_type = definition_pb2.DELAY
    delay.system_properties.delivery_timestamp.seconds = 1_800_000_000
    delay.system_properties.orphaned_transaction_recovery_duration.seconds = 30
    delay.body = b"later"
    return req


def received_message() -> Message:
    """A ReceiveMessage frame as the server delivers it."""
    frame = service_pb2.ReceiveMessageResponse()
    msg = frame.message
    msg.topic.name = "orders"
    msg.user_properties["a"] = "b"
    sp = msg.system_properties
    sp.message_id = "01A1B2C3D4E5F60718293A4B5C"
    sp.body_digest.type = definition_pb2.MD5
    sp.body_digest.checksum = "ABC"
    sp.body_encoding = definition_pb2.GZIP
    sp.message_type = definition_pb2.PRIORITY
    sp.store_timestamp.seconds = 1_700_000_001
    sp.store_host = "broker-0"
    sp.receipt_handle = "rh:v1:0:3:17"
    sp.queue_id = 0
    sp.queue_offset = 0  # present although zero
    sp.invisible_duration.seconds = 30
    sp.delivery_attempt = 1
    sp.dead_letter_queue.topic = "orders"
    sp.dead_letter_queue.message_id = "01ORIGINAL"
    sp.priority = 7
    msg.body = b"\x1f\x8b gzip-ish"
    return frame


def telemetry_settings() -> Message:
    """The server's answer to a push consumer's Settings on the Telemetry stream."""
    cmd = service_pb2.TelemetryCommand()
    cmd.status.code = definition_pb2.OK
    cmd.status.message = "OK"
    s = cmd.settings
    s.client_type = definition_pb2.PUSH_CONSUMER
    s.access_point.scheme = definition_pb2.IPv4
    s.access_point.addresses.add(host="127.0.0.1", port=8081)
    s.backoff_policy.max_attempts = 16
    s.backoff_policy.customized_backoff.next.add(seconds=1)
    s.backoff_policy.customized_backoff.next.add(seconds=5, nanos=500_000_000)
    s.request_timeout.seconds = 3
    sub = s.subscription
    sub.group.name = "g1"
    entry = sub.subscriptions.add()
    entry.topic.name = "orders"
    entry.expression.type = definition_pb2.TAG
    entry.expression.expression = "TagA || TagB"
    sub.fifo = False  # present although false
    sub.receive_batch_size = 32
    sub.long_polling_timeout.seconds = 30
    sub.lite_subscription_quota = 100
    sub.max_lite_topic_size = 64
    s.user_agent.language = definition_pb2.PYTHON
    s.user_agent.version = "5.1.2"
    s.metric.on = False
    return cmd


def producer_settings() -> Message:
    cmd = service_pb2.TelemetryCommand()
    cmd.settings.publishing.topics.add(name="orders")
    cmd.settings.publishing.max_body_size = 4 * 1024 * 1024
    cmd.settings.publishing.validate_message_type = True
    backoff = cmd.settings.backoff_policy
    backoff.max_attempts = 3
    backoff.exponential_backoff.initial.nanos = 10_000_000
    backoff.exponential_backoff.max.seconds = 1
    backoff.exponential_backoff.multiplier = 2.0
    return cmd


def query_route_response() -> Message:
    resp = service_pb2.QueryRouteResponse()
    resp.status.code = definition_pb2.OK
    mq = resp.message_queues.add()
    mq.topic.name = "orders"
    mq.id = 0
    mq.permission = definition_pb2.READ_WRITE
    mq.broker.name = "broker-a"
    mq.broker.id = 0
    mq.broker.endpoints.scheme = definition_pb2.DOMAIN_NAME
    mq.broker.endpoints.addresses.add(host="sluice.local", port=8081)
    # A packed repeated enum.
    mq.accept_message_types.extend([definition_pb2.NORMAL, definition_pb2.FIFO, definition_pb2.LITE])
    return resp


def sync_lite_subscription() -> Message:
    req = service_pb2.SyncLiteSubscriptionRequest()
    req.action = definition_pb2.COMPLETE_ADD
    req.topic.name = "parent"
    req.group.name = "g-lite"
    req.lite_topic_set.extend(["a", "b"])
    req.version = 0  # present although zero
    req.offset_option.policy = definition_pb2.OffsetOption.LAST  # oneof member with value 0
    return req


def small_messages() -> list[Message]:
    nack = service_pb2.ChangeInvisibleDurationRequest(receipt_handle="rh", message_id="m", suspend=False)
    nack.invisible_duration.seconds = 10
    pull = service_pb2.PullMessageResponse(next_offset=0)
    ack = service_pb2.AckMessageRequest()
    ack.entries.add(message_id="m", receipt_handle="rh", lite_topic="lt")
    send_result = service_pb2.SendMessageResponse()
    send_result.entries.add(message_id="m", transaction_id="tx", offset=2**40, recall_handle="rc")
    send_result.entries[0].status.code = definition_pb2.MESSAGE_BODY_TOO_LARGE
    level = admin_pb2.ChangeLogLevelRequest(level=admin_pb2.ChangeLogLevelRequest.WARN)
    return [nack, pull, ack, send_result, level]


def test_encoded_messages_round_trip_through_official_client() -> None:
    samples = [
        send_message_request(),
        received_message(),
        telemetry_settings(),
        producer_settings(),
        query_route_response(),
        sync_lite_subscription(),
        *small_messages(),
    ]
    payload = [
        {
            "type": m.DESCRIPTOR.full_name,
            "data": base64.b64encode(m.SerializeToString(deterministic=True)).decode(),
            "text": text_format.MessageToString(m),
        }
        for m in samples
    ]
    answers = run_in_client(CHILD_ROUND_TRIP, payload)

    assert len(answers) == len(samples)
    for ours, sent, answer in zip(samples, payload, answers, strict=True):
        name = sent["type"]
        # Field names and values the client reads from our bytes are the ones we wrote
        # (bytes alone could not tell two swapped same-typed field numbers apart).
        assert answer["decoded_text"] == sent["text"], f"{name}: client decoded different content"
        # Nothing was kept as unknown fields or lost: re-encoding gives our exact bytes.
        assert answer["reencoded"] == sent["data"], f"{name}: client re-encoded different bytes"
        # The client's own encoding of the same content decodes here to the same message.
        theirs = type(ours).FromString(base64.b64decode(answer["encoded_from_text"]))
        assert theirs == ours, f"{name}: client encoding decodes differently here"
        assert answer["encoded_from_text"] == sent["data"], f"{name}: client encodes different bytes"
