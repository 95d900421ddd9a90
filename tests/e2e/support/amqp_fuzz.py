"""A fuzzer of the AMQP edge: after a real handshake, a connection gets a generated sequence of
frames (any method of the spec with generated arguments, content headers with generated sizes
and property bytes, body frames, heartbeats, raw bytes, byte-mutated valid frames) on channels
0-3. The server must answer with a connection close carrying a reply code of the spec, or keep
the connection open; an abrupt close (a crash of the connection's task) is a bug."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st
from pamqp import commands, frame

from tests.e2e.support.amqp import RawClient

# Reply codes the spec defines for connection.close / channel.close.
SPEC_CODES = {200, 311, 312, 313, 320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540, 541}
METHODS = sorted(commands.INDEX_MAPPING.values(), key=lambda c: c.index)

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bit": st.booleans(),
    "octet": st.integers(0, 255),
    "short": st.integers(0, 65535),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**64 - 1),
    "shortstr": st.text(max_size=40),
    "longstr": st.binary(max_size=200),
    "table": st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(st.integers(-(2**31), 2**31 - 1), st.text(max_size=20), st.booleans()),
        max_size=4,
    ),
}


@st.composite
def method_frame(draw: st.DrawFn, channel: int) -> bytes:
    cls = draw(st.sampled_from(METHODS))
    values = {a: draw(_VALUES[cls.amqp_type(a)]) for a in cls.__slots__ if cls.amqp_type(a) in _VALUES}
    method = cls.__new__(cls)
    for name, value in values.items():
        setattr(method, name, value)
    try:
        return frame.marshal(method, channel)
    except Exception:  # a value pamqp will not encode: the class and method ids with raw bytes
        payload = struct.pack(">I", cls.index) + draw(st.binary(max_size=64))
        return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


@st.composite
def content_frames(draw: st.DrawFn, channel: int) -> bytes:
    size = draw(st.integers(0, 300))
    props = draw(st.one_of(st.just(b"\x00\x00"), st.binary(max_size=40)))
    header = struct.pack(">HHQ", draw(st.sampled_from([60, 60, 60, 10, 0])), 0, size) + props
    out = struct.pack(">BHI", 2, channel, len(header)) + header + b"\xce"
    for chunk in draw(st.lists(st.binary(min_size=1, max_size=200), max_size=3)):
        out += struct.pack(">BHI", 3, channel, len(chunk)) + chunk + b"\xce"
    return out


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for where, value in edits:
        if out:
            out[where % len(out)] = value
    return bytes(out)


@st.composite
def frames(draw: st.DrawFn) -> list[bytes]:
    """One connection's frames after the handshake (often opening channel 1 first)."""
    out: list[bytes] = []
    if draw(st.booleans()):
        out.append(frame.marshal(commands.Channel.Open(), 1))
        if draw(st.booleans()):
            out.append(frame.marshal(commands.Basic.Publish(exchange="", routing_key="fuzz"), 1))
    for _ in range(draw(st.integers(1, 6))):
        channel = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
        kind = draw(st.sampled_from(["method", "method", "content", "heartbeat", "raw", "mutated"]))
        if kind == "method":
            out.append(draw(method_frame(channel)))
        elif kind == "content":
            out.append(draw(content_frames(channel)))
        elif kind == "heartbeat":
            out.append(struct.pack(">BHI", 8, channel, 0) + b"\xce")
        elif kind == "raw":
            out.append(draw(st.binary(min_size=1, max_size=64)))
        else:
            valid = draw(method_frame(channel))
            out.append(_mutate(valid, draw(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                                    min_size=1, max_size=3))))  # fmt: skip
    return out


def send(endpoint: str, data: list[bytes], quiet_s: float = 0.2) -> str:
    """Send one connection's frames; the outcome: `close:<code>`, `open`, or `abrupt` (a bug)."""
    client = RawClient(endpoint)
    try:
        client.open()
        client.sock.settimeout(quiet_s)
        try:
            for part in data:
                client.send(part)
            while True:  # until the server closes the connection, or is quiet (still open)
                _, value = client.read()
                if isinstance(value, commands.Connection.Close):
                    client.send_method(0, commands.Connection.CloseOk())
                    return f"close:{value.reply_code}"
        except TimeoutError:
            return "open"
        except (EOFError, ConnectionResetError, BrokenPipeError):
            return "abrupt"
        except Exception as exc:  # a frame our reader cannot parse: what the server sent is suspect
            return f"unreadable:{type(exc).__name__}"
    finally:
        client.close()


def is_bad(outcome: str) -> bool:
    if outcome.startswith("close:"):
        return int(outcome.split(":")[1]) not in SPEC_CODES
    return outcome != "open"
