"""MQTT clients for the end-to-end tests: paho-mqtt (3.1.1 and 5.0) behind a small synchronous
wrapper with bounded waits, and a raw socket client that speaks packets byte by byte (for what no
client library sends: malformed input, exact flags). Nothing here imports Sluice.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

WAIT_S = 15.0  # every wait of these helpers is bounded


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def new_id(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: dict[str, Any] = field(default_factory=dict)


class Paho:
    """A connected paho client; messages arrive in `messages`. `version` 4 (3.1.1) or 5."""

    def __init__(self, address: str, client_id: str | None = None, *, version: int = 5, clean: bool = True,
                 session_expiry: int | None = None, will: tuple[str, bytes, int, bool] | None = None,
                 will_props: Properties | None = None, keepalive: int = 30, username: str | None = None,
                 password: str | None = None, transport: str = "tcp", tls: str | None = None,
                 connect_props: Properties | None = None, wait: bool = True) -> None:  # fmt: skip
        self.client_id = client_id if client_id is not None else new_id()
        protocol = paho.MQTTv5 if version == 5 else paho.MQTTv311
        # No reconnection: a test sees the server's close (a takeover, a kick) instead of the client
        # coming back on its own.
        kwargs: dict[str, Any] = {"callback_api_version": CallbackAPIVersion.VERSION2, "client_id": self.client_id,
                                  "protocol": protocol, "transport": transport,
                                  "reconnect_on_failure": False}  # fmt: skip
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = paho.Client(**kwargs)
        if transport == "websockets":
            self.client.ws_set_options(path="/mqtt")
        if tls is not None:
            self.client.tls_set(ca_certs=tls)
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            self.client.will_set(*will, properties=will_props)
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connack: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.subacks: dict[int, list[Any]] = {}
        self.unsubacks: dict[int, list[Any]] = {}
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self._acks = threading.Condition()
        self.version = version
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        host, port = host_port(address)
        props = connect_props
        if version == 5 and session_expiry is not None:
            props = props or Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = session_expiry
        if version == 5:
            self.client.connect(host, port, keepalive, clean_start=clean, properties=props)
        else:
            self.client.connect(host, port, keepalive)
        self.client.loop_start()
        if wait:
            flags, rc, props = self.connack.get(timeout=WAIT_S)
            if getattr(rc, "is_failure", rc != 0):
                raise AssertionError(f"CONNECT refused: {rc}")
            self.session_present = bool(getattr(flags, "session_present", False))

    def _on_message(self, client: Any, _userdata: Any, msg: paho.MQTTMessage) -> None:
        props: dict[str, Any] = {}
        if msg.properties is not None:
            props = {k: v for k, v in msg.properties.json().items() if v is not None}
        self.messages.put(Received(msg.topic, msg.payload, msg.qos, bool(msg.retain), props))

    def _on_subscribe(self, client: Any, _userdata: Any, mid: int, codes: list[Any], props: Any) -> None:
        with self._acks:
            self.subacks[mid] = codes
            self._acks.notify_all()

    def _on_unsubscribe(self, client: Any, _userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self._acks:
            self.unsubacks[mid] = codes if isinstance(codes, list) else [codes]
            self._acks.notify_all()

    def _wait_ack(self, table: dict[int, list[Any]], mid: int) -> list[Any]:
        with self._acks:
            if not self._acks.wait_for(lambda: mid in table, timeout=WAIT_S):
                raise AssertionError(f"no acknowledgement for packet {mid} within {WAIT_S} s")
            return table.pop(mid)

    def subscribe(self, topic: str, qos: int = 1, *, no_local: bool = False, retain_as_published: bool = False,
                  retain_handling: int = 0, identifier: int | None = None) -> list[Any]:  # fmt: skip
        if self.version == 5:
            options = SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=retain_as_published,
                                       retainHandling=retain_handling)  # fmt: skip
            props = None
            if identifier is not None:
                props = Properties(PacketTypes.SUBSCRIBE)
                props.SubscriptionIdentifier = identifier
            _, mid = self.client.subscribe(topic, options=options, properties=props)
        else:
            _, mid = self.client.subscribe(topic, qos)
        return self._wait_ack(self.subacks, mid)

    def unsubscribe(self, topic: str) -> list[Any]:
        _, mid = self.client.unsubscribe(topic)
        return self._wait_ack(self.unsubacks, mid)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False,
                props: Properties | None = None) -> paho.MQTTMessageInfo:  # fmt: skip
        info = self.client.publish(topic, payload, qos, retain, properties=props)
        if qos:
            info.wait_for_publish(timeout=WAIT_S)
            if not info.is_published():
                raise AssertionError(f"publish to {topic} not acknowledged within {WAIT_S} s")
        return info

    def get(self, timeout_s: float = WAIT_S) -> Received:
        return self.messages.get(timeout=timeout_s)

    def take(self, n: int, timeout_s: float = WAIT_S) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        out: list[Received] = []
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(out)} of {n} messages within {timeout_s} s: {out[:5]}")
            try:
                out.append(self.messages.get(timeout=left))
            except queue.Empty:
                continue
        return out

    def quiet(self, seconds: float) -> list[Received]:
        """What arrives within `seconds` (tests that expect nothing more)."""
        time.sleep(seconds)
        out = []
        while not self.messages.empty():
            out.append(self.messages.get_nowait())
        return out

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """End the connection without DISCONNECT (as a client that crashed)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


# -- raw packets -----------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def connect_packet(client_id: str, *, version: int = 4, clean: bool = True, keepalive: int = 30,
                   props: bytes = b"\x00", flags: int | None = None, username: str | None = None,
                   password: str | None = None) -> bytes:  # fmt: skip
    f = (0x02 if clean else 0) if flags is None else flags
    f |= (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = utf8("MQTT") + bytes((version, f)) + struct.pack(">H", keepalive)
    if version == 5:
        body += props
    payload = utf8(client_id) + (utf8(username) if username is not None else b"")
    return packet(0x10, body + payload + (utf8(password) if password is not None else b""))


def publish_packet(topic: str | bytes, payload: bytes, qos: int = 0, pid: int = 1, *, version: int = 4,
                   retain: bool = False, dup: bool = False, props: bytes = b"\x00") -> bytes:  # fmt: skip
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    body = utf8(topic) + (struct.pack(">H", pid) if qos else b"") + (props if version == 5 else b"")
    return packet(first, body + payload)


def subscribe_packet(filters: Iterable[tuple[str, int]], pid: int = 1, *, version: int = 4) -> bytes:
    body = struct.pack(">H", pid) + (b"\x00" if version == 5 else b"")
    for f, options in filters:
        body += utf8(f) + bytes((options,))
    return packet(0x82, body)


class Raw:
    """A socket speaking MQTT packets as written, reading them back whole; over TLS when given the
    certificate (PEM) to trust."""

    def __init__(self, address: str, timeout_s: float = WAIT_S, *, tls: str | None = None) -> None:
        host, port = host_port(address)
        sock = socket.create_connection((host, port), timeout=timeout_s)
        if tls is not None:
            sock = ssl.create_default_context(cafile=tls).wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self._buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, timeout_s: float = WAIT_S) -> tuple[int, bytes] | None:
        """The next packet (first byte, body); None when the server closed the connection."""
        self.sock.settimeout(timeout_s)
        while True:
            parsed = self._parse()
            if parsed is not None:
                return parsed
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not chunk:
                return None
            self._buf += chunk

    def _parse(self) -> tuple[int, bytes] | None:
        if len(self._buf) < 2:
            return None
        size, shift, i = 0, 0, 1
        while True:
            if i >= len(self._buf):
                return None
            byte = self._buf[i]
            size |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                break
            shift += 7
        if len(self._buf) < i + size:
            return None
        first, body = self._buf[0], self._buf[i : i + size]
        self._buf = self._buf[i + size :]
        return first, body

    def closed(self, timeout_s: float = WAIT_S) -> bool:
        """The server closes the connection (after whatever it still sends) within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.read(deadline - time.monotonic()) is None:
                    return True
            except TimeoutError:
                return False
        return False

    def close(self) -> None:
        self.sock.close()
