"""Helpers of the AMQP end-to-end tests: pika connections to a cluster's AMQP endpoints, and a
raw AMQP client (pamqp frames over a socket) for what a well-behaved client library never sends."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pika
from pamqp import commands, frame

from tests.e2e.support.cluster import Cluster

WAIT_S = 20.0


def params(endpoint: str, **kw: Any) -> pika.ConnectionParameters:
    host, port = endpoint.rsplit(":", 1)
    return pika.ConnectionParameters(host, int(port), **kw)


@contextmanager
def connect(endpoint: str, **kw: Any) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(params(endpoint, **kw))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


def endpoints(cluster: Cluster) -> list[str]:
    assert cluster.amqp, "the cluster was started without AMQP"
    return cluster.amqp


def drain(ch: Any, queue: str, count: int, *, ack: bool = True) -> list[tuple[Any, Any, bytes]]:
    """`count` messages consumed from `queue` (acknowledged unless `ack` is False), within WAIT_S."""
    got: list[tuple[Any, Any, bytes]] = []
    deadline = time.monotonic() + WAIT_S
    for method, props, body in ch.consume(queue, inactivity_timeout=1.0):
        if method is not None:
            got.append((method, props, body))
            if ack:
                ch.basic_ack(method.delivery_tag)
        if len(got) >= count or time.monotonic() > deadline:
            break
    ch.cancel()
    return got


class RawClient:
    """A socket speaking AMQP frame by frame (pamqp encodes and decodes)."""

    def __init__(self, endpoint: str) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: Any) -> None:
        self.send(frame.marshal(method, channel))

    def read(self) -> tuple[int, Any]:
        """(channel, frame) of the next frame; raises EOFError when the server closed the socket."""
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack(">I", self.buf[3:7])[0]
                if len(self.buf) >= size + 8 or self.buf.startswith(b"AMQP"):
                    used, channel, value = frame.unmarshal(self.buf)
                    self.buf = self.buf[used:]
                    return channel, value
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.buf += chunk

    def read_bytes(self) -> bytes:
        """Whatever arrives until the server closes the socket."""
        out = self.buf
        while chunk := self.sock.recv(65536):
            out += chunk
        return out

    def read_method(self, kind: type) -> Any:
        while True:
            _, value = self.read()
            if isinstance(value, kind):
                return value
            if isinstance(value, commands.Connection.Close):
                raise AssertionError(f"connection closed: {value.reply_code} {value.reply_text}")

    def open(self, user: str = "guest", secret: str = "guest") -> None:
        """The handshake (as guest unless told), up to connection.open-ok."""
        self.send(b"AMQP\x00\x00\x09\x01")
        self.read_method(commands.Connection.Start)
        response = f"\x00{user}\x00{secret}"
        self.send_method(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response=response,
                                                        locale="en_US"))  # fmt: skip
        tune = self.read_method(commands.Connection.Tune)
        self.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                       heartbeat=0))  # fmt: skip
        self.send_method(0, commands.Connection.Open(virtual_host="/"))
        self.read_method(commands.Connection.OpenOk)
