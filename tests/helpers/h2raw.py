"""A raw HTTP/2 client for conformance and hostile-input tests: it writes whatever frames a test
builds (malformed ones included) and reads the server's frames one by one.

Independent of the server under test: frames are packed here with struct, header blocks encoded
with the `hpack` package's encoder and decoded with its decoder. Imports nothing of Sluice, so the
end-to-end tests may use it against a real proxy.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
READ_TIMEOUT_S = 5.0


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", (len(payload) << 8) | kind) + bytes([flags]) + struct.pack(">I", stream) + payload


def settings(*pairs: tuple[int, int], ack: bool = False) -> bytes:
    return frame(SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def code(self) -> int:
        """The error code of a GOAWAY or RST_STREAM."""
        return int(struct.unpack_from(">I", self.payload, 4 if self.kind == GOAWAY else 0)[0])


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, host: str, port: int, *, handshake: bool = True) -> RawClient:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        if handshake:
            client.send(PREFACE + settings())
        return client

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def headers_block(self, path: str, *extra: tuple[str, str], method: str = "POST") -> bytes:
        fields = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "test"),
                  ("content-type", "application/grpc"), ("te", "trailers"), *extra]  # fmt: skip
        return bytes(self.encoder.encode(fields))

    def request(self, sid: int, path: str, body: bytes | None, *extra: tuple[str, str]) -> None:
        """HEADERS, and DATA with the body as one gRPC message ending the stream (None: no DATA yet)."""
        self.send(frame(HEADERS, END_HEADERS, sid, self.headers_block(path, *extra)))
        if body is not None:
            self.send(frame(DATA, END_STREAM, sid, grpc_message(body)))

    async def read(self, timeout_s: float = READ_TIMEOUT_S) -> Frame | None:
        """The next frame, or None when the server closed the connection."""
        try:
            async with asyncio.timeout(timeout_s):
                head = await self.reader.readexactly(9)
                word, flags, sid = struct.unpack(">IBI", head)
                payload = await self.reader.readexactly(word >> 8)
        except asyncio.IncompleteReadError:
            return None
        except ConnectionResetError:
            return None
        return Frame(word & 0xFF, flags, sid & 0x7FFFFFFF, payload)

    async def until(self, kind: int, stream: int | None = None, timeout_s: float = READ_TIMEOUT_S) -> Frame | None:
        """Frames up to the first of `kind` (on `stream` when given); None when the connection closed
        first. SETTINGS from the server are acknowledged on the way."""
        while (got := await self.read(timeout_s)) is not None:
            if got.kind == SETTINGS and not got.flags & ACK:
                self.send(settings(ack=True))
            if got.kind == kind and (stream is None or got.stream == stream):
                return got
        return None

    async def response(self, sid: int, timeout_s: float = READ_TIMEOUT_S) -> tuple[list[tuple[str, str]], bytes]:
        """Every header field of a stream's answer (headers and trailers) and its DATA, to its end."""
        fields: list[tuple[str, str]] = []
        data = b""
        while (got := await self.read(timeout_s)) is not None:
            if got.kind == SETTINGS and not got.flags & ACK:
                self.send(settings(ack=True))
            if got.stream != sid:
                continue
            if got.kind == HEADERS:
                fields += [(str(n), str(v)) for n, v in self.decoder.decode(got.payload)]
            elif got.kind == DATA:
                data += got.payload
            elif got.kind == RST_STREAM:
                raise AssertionError(f"stream {sid} reset with code {got.code}")
            if got.kind in (HEADERS, DATA) and got.flags & END_STREAM:
                return fields, data
        raise AssertionError("the connection closed before the stream ended")

    async def closed(self, timeout_s: float = READ_TIMEOUT_S) -> bool:
        """Whether the server closes the connection (reading and dropping frames until then)."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()
