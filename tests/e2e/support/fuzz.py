"""A structure-aware fuzzer of `apache.rocketmq.v2.MessagingService`, ours (tests/e2e/test_fuzz.py runs
a CI-sized batch per topology, tests/bench/fuzz_bench.py a long run with memory figures).

Requests come from hypothesis strategies built from the protobuf descriptors of every RPC's
request: each field is left unset or given an adversarial value of its type (empty, huge and
foreign-script names next to the test's real topic and group; extreme numbers; unknown enum
numbers; Durations and Timestamps out of protobuf's range; forged receipt handles and transaction
ids; bodies past the limit). A share of the requests is then mutated at the byte level (truncated,
bytes flipped, garbage inserted or appended), so that the server also sees what does not parse.
Every unary and server-streaming RPC is called with its raw bytes; Telemetry gets a stream of one
to three commands, and some streams are cancelled right after the first reply.

`call` classifies each answer as an `Outcome` string: `status:<Code name>` for a response status,
`grpc:<StatusCode name>` for a gRPC-level error, `hang` when the call outlived its deadline.
`BAD_OUTCOMES` are what client input must never get: INTERNAL or UNKNOWN of either kind, a lost
connection, a hang.

This module imports only the official client's protobuf modules (see tests/e2e/conftest.py).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor as d
from google.protobuf.message import DecodeError, Message
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

SERVICE = spb.DESCRIPTOR.services_by_name["MessagingService"]
METHODS: dict[str, d.MethodDescriptor] = {m.name: m for m in SERVICE.methods}
BAD_STATUS = {"INTERNAL_ERROR", "INTERNAL_SERVER_ERROR"}
BAD_GRPC = {"UNKNOWN", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
DEADLINE_S = 3.0  # every call's deadline; long polls are answered before it
MAX_DEPTH = 4

Outcome = str


def is_bad(outcome: Outcome) -> bool:
    kind, _, name = outcome.partition(":")
    return (
        outcome == "hang"
        or (kind == "status" and (name in BAD_STATUS or name.isdigit()))
        or (kind == "grpc" and name in BAD_GRPC)
    )


@dataclass(frozen=True)
class Target:
    address: str
    topic: str  # an existing NORMAL topic
    group: str  # an existing group
    brokers: tuple[str, ...]


# -- strategies -------------------------------------------------------------------------------------

_INT32 = (0, 1, -1, 7, 2**31 - 1, -(2**31))
_INT64 = (*_INT32, 2**63 - 1, -(2**63), 10**15)
_UINT32 = (0, 1, 2**32 - 1)
_UINT64 = (0, 1, 2**64 - 1)
_UNKNOWN_ENUMS = (13, 99, 2**31 - 1, -1)


def _names(target: Target) -> st.SearchStrategy[str]:
    real = st.sampled_from([target.topic, target.group, *target.brokers])  # to get past the name checks
    return st.one_of(
        real,
        real,
        st.sampled_from([target.topic, target.group, *target.brokers, "", " ", "%", "a%b", "%DLQ%x", "rmq_sys_x",
                         "t" * 200, "t" * 70_000, "тема", "主题", "🦆", "a\x00b", "../../etc", "*", "||"]),
        st.text(max_size=24),
    )  # fmt: skip


def _handles(target: Target) -> st.SearchStrategy[str]:
    """Receipt handles, transaction ids and recall handles as an attacker would forge them."""
    payload = st.binary(max_size=64).map(lambda b: base64.urlsafe_b64encode(b).decode())
    broker = st.sampled_from([*target.brokers, "no-such-broker", "", "x" * 300])
    return st.one_of(
        st.builds(lambda b, p, sep: f"{b}{sep}{p}", broker, payload, st.sampled_from(["~", "~t", "~r", "@", ""])),
        st.sampled_from(["", "~", "garbage", "x" * 5000]),
    )


def _scalar(field: d.FieldDescriptor, target: Target) -> st.SearchStrategy[Any]:
    t = field.type
    if t == d.FieldDescriptor.TYPE_STRING:
        if "handle" in field.name or field.name == "transaction_id":
            return _handles(target)
        return _names(target)
    if t == d.FieldDescriptor.TYPE_BYTES:
        small = st.binary(max_size=48)  # a body past the limit in about one bytes field of eight
        return st.one_of(small, small, small, st.sampled_from([b"", b"x" * (4 * 1024 * 1024 + 1)]))
    if t == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == d.FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from(known + list(_UNKNOWN_ENUMS))
    if t in (d.FieldDescriptor.TYPE_INT32, d.FieldDescriptor.TYPE_SINT32, d.FieldDescriptor.TYPE_SFIXED32):
        return st.one_of(st.sampled_from(_INT32), st.integers(-(2**31), 2**31 - 1))
    if t in (d.FieldDescriptor.TYPE_INT64, d.FieldDescriptor.TYPE_SINT64, d.FieldDescriptor.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(_INT64), st.integers(-(2**63), 2**63 - 1))
    if t in (d.FieldDescriptor.TYPE_UINT32, d.FieldDescriptor.TYPE_FIXED32):
        return st.sampled_from(_UINT32)
    if t in (d.FieldDescriptor.TYPE_UINT64, d.FieldDescriptor.TYPE_FIXED64):
        return st.sampled_from(_UINT64)
    if t in (d.FieldDescriptor.TYPE_FLOAT, d.FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    raise TypeError(f"no strategy for field {field.full_name} of type {t}")


def _time_fields() -> st.SearchStrategy[tuple[int, int]]:
    """(seconds, nanos) of a Duration or Timestamp: sensible, negative, out of range, inconsistent."""
    seconds = st.one_of(st.sampled_from([0, 1, 3, 20, -1, 10**9, 315_576_000_001, 2**63 - 1, -(2**63)]),
                        st.integers(-(10**6), 10**6))  # fmt: skip
    nanos = st.sampled_from([0, 1, 999_999_999, 1_000_000_000, -1, 2**31 - 1, -(2**31)])
    return st.tuples(seconds, nanos)


def message_strategy(desc: d.Descriptor, target: Target, depth: int = 0) -> st.SearchStrategy[Message]:
    cls = _class(desc)
    if desc.full_name in ("google.protobuf.Duration", "google.protobuf.Timestamp"):
        sensible = st.tuples(st.integers(0, 30), st.just(0))
        return st.one_of(sensible, sensible, _time_fields()).map(lambda sn: cls(seconds=sn[0], nanos=sn[1]))
    if desc.full_name == "apache.rocketmq.v2.Resource":  # mostly real names, to get past the name checks
        real = st.sampled_from([target.topic, target.group])
        name = st.one_of(real, real, real, _names(target))
        namespace = st.sampled_from(["", "", "", "", "ns1", "%", "n" * 200])
        return st.builds(lambda n, ns: cls(name=n, resource_namespace=ns), name, namespace)
    if depth >= MAX_DEPTH:
        return st.just(cls())
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            parts[field.name] = st.dictionaries(_scalar(key, target), _scalar(value, target), max_size=3)
        elif field.message_type is not None:
            inner = message_strategy(field.message_type, target, depth + 1)
            parts[field.name] = st.lists(inner, max_size=3) if _repeated(field) else inner
        else:
            scalar = _scalar(field, target)
            parts[field.name] = st.lists(scalar, max_size=3) if _repeated(field) else scalar
    chosen = {name: st.one_of(st.none(), strategy) for name, strategy in parts.items()}
    return st.fixed_dictionaries(chosen).map(lambda values: _build(cls, desc, values))


def _repeated(field: d.FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _class(desc: d.Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)  # type: ignore[no-any-return]


def _build(cls: type[Message], desc: d.Descriptor, values: dict[str, Any]) -> Message:
    msg = cls()
    for name, value in values.items():
        if value is None:
            continue
        field = desc.fields_by_name[name]
        target = getattr(msg, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for k, v in value.items():
                target[k] = v
        elif _repeated(field) and field.message_type is None:
            target.extend(value)
        elif _repeated(field):
            for item in value:
                target.add().CopyFrom(item)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    """Byte-level mutation: each op (kind, position, value) truncates, flips, inserts or appends."""
    out = bytearray(data)
    for kind, position, value in ops:
        at = position % (len(out) + 1)
        if kind == 0:
            del out[at:]
        elif kind == 1 and out:
            out[at % len(out)] ^= value or 0xFF
        elif kind == 2:
            out[at:at] = bytes([value]) * (1 + value % 5)
        else:
            out += bytes([0x80 | value, 0x80, 0x80, 0x80, 0x80, 0x80])  # an unterminated varint
    return bytes(out)


_MUTATIONS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1,
                      max_size=3)  # fmt: skip


@dataclass(frozen=True)
class Request:
    rpc: str
    payloads: tuple[bytes, ...]  # one for unary and server-streaming RPCs, 0-3 commands for Telemetry
    metadata: tuple[tuple[str, str], ...]
    cancel_early: bool = False  # Telemetry: cancel the stream after its first reply

    def __repr__(self) -> str:
        sizes = [len(p) for p in self.payloads]
        return f"Request({self.rpc}, bytes={sizes}, md={self.metadata}, cancel_early={self.cancel_early})"


def _payload(desc: d.Descriptor, target: Target) -> st.SearchStrategy[bytes]:
    serialized = message_strategy(desc, target).map(lambda m: m.SerializeToString())
    mutated = st.tuples(serialized, _MUTATIONS).map(lambda pair: mutate(*pair))
    return st.one_of(serialized, serialized, serialized, serialized, serialized, mutated, st.binary(max_size=32))


def _metadata() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    fine = f"fuzz-{uuid.uuid4().hex[:8]}@1@0@fuzz"
    client_id = st.sampled_from([fine, fine, fine, fine, fine, "", "c" * 2000, "a b!~"])
    namespace = st.sampled_from(["", "", "", "", "ns1", "%", "n" * 200])
    language = st.sampled_from(["PYTHON", "JAVA", "", "KLINGON"])

    def build(cid: str, ns: str, lang: str) -> tuple[tuple[str, str], ...]:
        md = [("x-mq-language", lang), ("x-mq-namespace", ns), ("x-mq-request-id", str(uuid.uuid4()))]
        return tuple(md + ([("x-mq-client-id", cid)] if cid else []))

    return st.builds(build, client_id, namespace, language)


def requests(target: Target, rpc: str | None = None) -> st.SearchStrategy[Request]:
    """Requests for `rpc`, or for any RPC of the service."""
    if rpc is None:
        return st.sampled_from(sorted(METHODS)).flatmap(lambda name: requests(target, name))
    method = METHODS[rpc]
    payload = _payload(method.input_type, target)
    if method.client_streaming:
        return st.builds(lambda ps, md, cancel: Request(rpc, tuple(ps), md, cancel),
                         st.lists(payload, max_size=3), _metadata(), st.booleans())  # fmt: skip
    return st.builds(lambda p, md: Request(rpc, (p,), md), payload, _metadata())


# -- calling ------------------------------------------------------------------------------------------


def _status_outcome(rpc: str, frame: bytes) -> Outcome | None:
    """The response status of one reply frame, if it carries one."""
    response_class = _class(METHODS[rpc].output_type)
    try:
        response = response_class.FromString(frame)
    except DecodeError:
        return "unparseable-reply"
    if not response.HasField("status"):
        return None
    try:
        return "status:" + pb.Code.Name(response.status.code)
    except ValueError:
        return f"status:{response.status.code}"


def call(channel: grpc.Channel, request: Request) -> Outcome:
    method = METHODS[request.rpc]
    path = f"/{SERVICE.full_name}/{method.name}"
    md = list(request.metadata)
    try:
        if method.client_streaming:
            return _telemetry(channel, path, request)
        if method.server_streaming:
            outcome: Outcome | None = None
            for frame in channel.unary_stream(path)(request.payloads[0], metadata=md, timeout=DEADLINE_S):
                outcome = outcome or _status_outcome(request.rpc, frame)
            return outcome or "no-status"
        return _status_outcome(request.rpc, channel.unary_unary(path)(request.payloads[0], metadata=md,
                                                                      timeout=DEADLINE_S)) or "no-status"  # fmt: skip
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        return "hang" if code == grpc.StatusCode.DEADLINE_EXCEEDED else f"grpc:{code.name}"


def _telemetry(channel: grpc.Channel, path: str, request: Request) -> Outcome:
    done = threading.Event()

    def commands() -> Iterator[bytes]:
        yield from request.payloads
        done.wait(0.5)  # leave the stream open a moment for the replies, then close it

    stream = channel.stream_stream(path)(commands(), metadata=list(request.metadata), timeout=DEADLINE_S)
    outcomes = []
    try:
        for frame in stream:
            outcomes.append(_status_outcome(request.rpc, frame))
            if request.cancel_early:
                stream.cancel()
                return "cancelled-by-client"
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED and request.cancel_early:  # type: ignore[attr-defined]
            return "cancelled-by-client"
        raise
    finally:
        done.set()
    bad = [o for o in outcomes if o is not None and is_bad(o)]
    return bad[0] if bad else next((o for o in outcomes if o is not None), "status:none")
