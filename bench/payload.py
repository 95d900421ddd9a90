"""Pre-serialised SendMessage requests, so the load generator spends its CPU on calls, not protobuf.

A real `SendMessageRequest` is built and serialised once per second (the template), with two
fixed-width placeholders: the message id (`system_properties.message_id`, 34 characters, the
width of the official clients' ids) and the born time in nanoseconds (user property
`bench-born-ns`, 19 digits). Every message of a request is then the template's bytes with those
two placeholders overwritten, and the request is

    repeated Message messages = 1:   for each message: 0x0A, varint(length), message bytes

which is byte for byte what `SerializeToString` gives for the same messages (checked when a
template is built). Building a 32-message request costs ~1 µs per message instead of ~4 µs
(protobuf, add + set fields) — a difference that matters when the generator shares 2 cores with
the server it measures.

Invariant: placeholders are fixed width, so every message of a template has the same length.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb

BORN_PROPERTY = "bench-born-ns"
RUN_PROPERTY = "bench-run"
MESSAGE_ID_CHARS = 34
BORN_NS_DIGITS = 19
TEMPLATE_REFRESH_S = 1.0
_ID_PLACEHOLDER = b"I" * MESSAGE_ID_CHARS
_BORN_PLACEHOLDER = b"9" * BORN_NS_DIGITS
_FIELD_MESSAGES = 0x0A  # field 1, wire type 2 (length-delimited)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def new_run_id() -> str:
    return os.urandom(6).hex()


class MessageIds:
    """Unique, fixed-width message ids: "01" + 8 hex digits of this generator + a 24-digit counter."""

    def __init__(self) -> None:
        self._prefix = "01" + os.urandom(4).hex().upper()
        self._next = 0

    def take(self) -> bytes:
        self._next += 1
        return f"{self._prefix}{self._next:024X}".encode()


@dataclass(frozen=True)
class _Template:
    # The message bytes cut around the placeholders: parts[0] + X + parts[1] + Y + parts[2],
    # where X/Y are the id and the born time in the order they occur in the bytes.
    parts: tuple[bytes, bytes, bytes]
    id_first: bool
    header: bytes  # 0x0A + varint(message length)
    built_at_s: float


class SendPayload:
    """Builds SendMessageRequest bytes of `batch` messages with `size_bytes` bodies for one topic."""

    def __init__(self, topic: str, namespace: str, size_bytes: int, run_id: str) -> None:
        if size_bytes < 1:
            raise ValueError("the body must be at least 1 byte")
        self.topic = topic
        self.namespace = namespace
        self.body = (b"sluice-bench-" * (size_bytes // 13 + 1))[:size_bytes]
        self.run_id = run_id
        self.ids = MessageIds()
        self._host = _local_host()
        self._template = self._build_template()

    def request(self, batch: int) -> bytes:
        """One request's bytes; every message gets a fresh id and the current born time."""
        t = self._template
        now_s = time.monotonic()
        if now_s - t.built_at_s >= TEMPLATE_REFRESH_S:
            t = self._template = self._build_template()
        born = str(time.time_ns()).encode()
        out: list[bytes] = []
        for _ in range(batch):
            mid = self.ids.take()
            first, second = (mid, born) if t.id_first else (born, mid)
            out += (t.header, t.parts[0], first, t.parts[1], second, t.parts[2])
        return b"".join(out)

    def message(self, message_id: str, born_ns: int) -> pb.Message:
        """The same message built with protobuf (the reference the template must equal)."""
        m = pb.Message()
        m.topic.name = self.topic
        if self.namespace:
            m.topic.resource_namespace = self.namespace
        m.body = self.body
        m.user_properties[RUN_PROPERTY] = self.run_id
        m.user_properties[BORN_PROPERTY] = str(born_ns)
        sp = m.system_properties
        sp.message_id = message_id
        sp.message_type = pb.NORMAL
        sp.body_encoding = pb.IDENTITY
        sp.born_timestamp.seconds = born_ns // 1_000_000_000  # whole seconds, as the Python client
        sp.born_host = self._host
        sp.queue_id = 0
        return m

    def _build_template(self) -> _Template:
        born_ns = time.time_ns()
        raw = self.message(_ID_PLACEHOLDER.decode(), int(_BORN_PLACEHOLDER)).SerializeToString(deterministic=True)
        # The real born_timestamp seconds, then locate the placeholders in the serialised bytes.
        msg = pb.Message.FromString(raw)
        msg.system_properties.born_timestamp.seconds = born_ns // 1_000_000_000
        raw = msg.SerializeToString(deterministic=True)
        i, b = raw.find(_ID_PLACEHOLDER), raw.find(_BORN_PLACEHOLDER)
        assert i >= 0 and b >= 0 and raw.count(_ID_PLACEHOLDER) == 1 and raw.count(_BORN_PLACEHOLDER) == 1
        (lo, lo_len), (hi, hi_len) = sorted(((i, MESSAGE_ID_CHARS), (b, BORN_NS_DIGITS)))
        parts = (raw[:lo], raw[lo + lo_len : hi], raw[hi + hi_len :])
        template = _Template(parts, i < b, bytes([_FIELD_MESSAGES]) + varint(len(raw)), time.monotonic())
        self._check(template, msg)
        return template

    def _check(self, t: _Template, reference: pb.Message) -> None:
        mid, born = b"01" + b"A" * (MESSAGE_ID_CHARS - 2), b"1" * BORN_NS_DIGITS
        first, second = (mid, born) if t.id_first else (born, mid)
        built = t.header + t.parts[0] + first + t.parts[1] + second + t.parts[2]
        reference.system_properties.message_id = mid.decode()
        reference.user_properties[BORN_PROPERTY] = born.decode()
        parsed = spb.SendMessageRequest.FromString(built)
        assert len(parsed.messages) == 1 and parsed.messages[0] == reference, "send template does not round-trip"


def _local_host() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
