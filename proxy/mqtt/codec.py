"""MQTT framing and data types (3.1.1 section 1.5 and 2.2, 5.0 section 1.5 and 2.1): pure functions.

A control packet is a fixed header and a body:

| size | field |
|---|---|
| 1 | packet type (high 4 bits) and flags (low 4 bits) |
| 1-4 | remaining length: the body's size, a Variable Byte Integer (7 bits per byte, low first, high bit = more) |
| remaining length | the body: variable header and payload, per packet type (proxy/mqtt/packets.py) |

Data types: two-byte integers big-endian, UTF-8 strings and binary data as a two-byte length then
the bytes, Variable Byte Integers as above (at most 4 bytes, at most 268,435,455).

`Framer` splits a byte stream into packets without copying a body twice and refuses a packet whose
announced size exceeds the limit *before* buffering it (a peer cannot make the proxy allocate what
it announces). `Cursor` reads a body's fields, raising `MqttError(MALFORMED_PACKET)` on anything
short, over-long or not well-formed UTF-8 (U+0000 included, as both specifications require).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from proxy.mqtt.codes import PACKET_TOO_LARGE, MqttError, malformed

MAX_VARINT = 268_435_455
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def varint(n: int) -> bytes:
    """The Variable Byte Integer of `n` (0..MAX_VARINT)."""
    assert 0 <= n <= MAX_VARINT, n
    if n < 128:
        return bytes((n,))
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def utf8(text: str) -> bytes:
    data = text.encode()
    return _U16.pack(len(data)) + data


def binary(data: bytes) -> bytes:
    return _U16.pack(len(data)) + data


def packet(first: int, body: bytes) -> bytes:
    """A whole packet: its first byte (type and flags) and its body."""
    n = len(body)
    if n < 128:
        return bytes((first, n)) + body
    return bytes((first,)) + varint(n) + body


def check_text(text: str, what: str) -> str:
    """A decoded string as MQTT allows it: no U+0000 (surrogates never decode)."""
    if "\x00" in text:
        raise malformed(f"{what} contains U+0000, which MQTT strings must not contain")
    return text


class Cursor:
    """Reads the fields of one packet body, front to back."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def left(self) -> int:
        return self.end - self.pos

    def u8(self) -> int:
        if self.pos >= self.end:
            raise malformed("the packet ends where a byte was expected")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        if self.pos + 2 > self.end:
            raise malformed("the packet ends inside a two-byte integer")
        (value,) = _U16.unpack_from(self.data, self.pos)
        self.pos += 2
        return int(value)

    def u32(self) -> int:
        if self.pos + 4 > self.end:
            raise malformed("the packet ends inside a four-byte integer")
        (value,) = _U32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(value)

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise malformed("a Variable Byte Integer longer than 4 bytes")

    def bytes_(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise malformed(f"the packet ends {self.pos + n - self.end} bytes before a field's end")
        value = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return value

    def binary(self) -> bytes:
        return self.bytes_(self.u16())

    def text(self, what: str) -> str:
        raw = self.binary()
        try:
            value = raw.decode()
        except UnicodeDecodeError:
            raise malformed(f"{what} is not well-formed UTF-8") from None
        return check_text(value, what)

    def rest(self) -> bytes:
        value = bytes(self.data[self.pos : self.end])
        self.pos = self.end
        return value


class Framer:
    """Splits received bytes into (first byte, body) packets; bounded by `max_packet_bytes` (a
    whole packet, fixed header included, as 5.0's Maximum Packet Size counts it)."""

    __slots__ = ("_buf", "max_packet_bytes")

    def __init__(self, max_packet_bytes: int) -> None:
        self._buf = bytearray()
        self.max_packet_bytes = max_packet_bytes

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """The complete packets `data` makes with what came before; the rest stays buffered.
        MqttError for a malformed remaining length or a packet over the limit (the connection
        ends: the stream cannot be resynchronised)."""
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 2:
                first = buf[pos]
                size = buf[pos + 1]
                head = 2
                if size & 0x80:
                    size &= 0x7F
                    shift = 7
                    while True:
                        if head == 5:
                            raise malformed("the remaining length is longer than 4 bytes")
                        if pos + head >= n:
                            return  # the length is not all here yet
                        byte = buf[pos + head]
                        head += 1
                        size |= (byte & 0x7F) << shift
                        if not byte & 0x80:
                            break
                        shift += 7
                if head + size > self.max_packet_bytes:
                    raise MqttError(PACKET_TOO_LARGE, f"a packet of {head + size} bytes; this server accepts "
                                    f"at most {self.max_packet_bytes}")  # fmt: skip
                if n - pos < head + size:
                    return
                body = bytes(buf[pos + head : pos + head + size])
                pos += head + size
                yield first, body
        finally:
            if pos:
                del buf[:pos]
