"""MQTT traffic for fault tests: publishers at QoS 1 and 2 and a persistent subscriber, each a small
asyncio client of its own (MQTT 3.1.1, clean session 0) that reconnects through any of the given
addresses and keeps its MQTT state across connections, as the specification asks of a client:

- a publisher sends one message at a time; a PUBLISH not acknowledged when its connection ends is
  sent again with DUP and the same packet id (QoS 2: PUBREL again once PUBREC came). A message is
  *acknowledged* (recorded in the `History`) at its PUBACK (QoS 1) or PUBREC (QoS 2);
- the subscriber records each delivery; a QoS 2 PUBLISH is delivered on receipt and its packet id
  kept until PUBREL (a DUP of a kept id is not delivered again), and once its PUBCOMP is sent the
  message counts as acked: a later delivery of it is an ack undone (`History.redelivered_after_ack`).

Nothing here imports Sluice; the packets are written and read by hand (support/mqtt.py's helpers).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.e2e.support.history import History
from tests.e2e.support.mqtt import connect_packet, host_port, packet, publish_packet, subscribe_packet

RECONNECT_PAUSE_S = 0.2
ANSWER_TIMEOUT_S = 10.0  # a PUBLISH not answered this long: the connection is given up and made again


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def read(self) -> tuple[int, bytes]:
        first = (await self.reader.readexactly(1))[0]
        size, shift = 0, 0
        while True:
            byte = (await self.reader.readexactly(1))[0]
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        return first, await self.reader.readexactly(size)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.writer.close()


async def connect(addresses: Sequence[str], client_id: str, stop: asyncio.Event) -> Conn | None:
    """A connection with a session (clean 0) through the first address that answers, trying them
    in turn until `stop`; None once stopped."""
    i = 0
    while not stop.is_set():
        host, port = host_port(addresses[i % len(addresses)])
        i += 1
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            conn = Conn(reader, writer)
            conn.send(connect_packet(client_id, clean=False, keepalive=30))
            first, body = await asyncio.wait_for(conn.read(), 10)
            if first == 0x20 and body[1] == 0:
                return conn
            conn.close()
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        await asyncio.sleep(RECONNECT_PAUSE_S)
    return None


@dataclass
class Publisher:
    addresses: Sequence[str]
    client_id: str
    topics: Sequence[str]
    qos: int
    history: History
    sent: int = 0
    failures: int = 0  # connections lost mid-exchange
    longest_gap_s: float = 0.0  # longest time without an acknowledged publish

    async def run(self, stop: asyncio.Event) -> None:
        conn: Conn | None = None
        pid = 0
        pending: tuple[int, str, str] | None = None  # (pid, topic, body) not yet acknowledged
        released = False  # QoS 2: PUBREC came, PUBREL (re)sent, waiting for PUBCOMP
        last_ack = time.monotonic()
        while not stop.is_set() or pending is not None:
            if conn is None:
                conn = await connect(self.addresses, self.client_id, asyncio.Event())
                assert conn is not None
                if pending is not None:  # resume the exchange the last connection left
                    p, topic, body = pending
                    if released:
                        conn.send(packet(0x62, struct.pack(">H", p)))
                    else:
                        conn.send(publish_packet(topic, body.encode(), self.qos, p, dup=True))
            try:
                if pending is None:
                    pid = pid % 65535 + 1
                    topic = self.topics[self.sent % len(self.topics)]
                    body = f"{self.client_id}-{self.sent}"
                    self.sent += 1
                    pending, released = (pid, topic, body), False
                    conn.send(publish_packet(topic, body.encode(), self.qos, pid))
                first, data = await asyncio.wait_for(conn.read(), ANSWER_TIMEOUT_S)
                got_pid = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 0
                if pending is None or got_pid != pending[0]:
                    continue
                if self.qos == 1 and first == 0x40:
                    self.history.sent(pending[2])
                    pending = None
                elif self.qos == 2 and first == 0x50:
                    if not released:
                        self.history.sent(pending[2])
                    released = True
                    conn.send(packet(0x62, struct.pack(">H", got_pid)))
                elif self.qos == 2 and first == 0x70:
                    pending = None
                if pending is None or released:
                    now = time.monotonic()
                    self.longest_gap_s = max(self.longest_gap_s, now - last_ack)
                    last_ack = now
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                self.failures += 1
                conn.close()
                conn = None
        if conn is not None:
            conn.send(b"\xe0\x00")
            conn.close()


@dataclass
class Subscriber:
    addresses: Sequence[str]
    client_id: str
    topic_filter: str
    qos: int
    history: History
    received: int = 0
    failures: int = 0
    kept: set[int] = field(default_factory=set)  # QoS 2 packet ids delivered, waiting for PUBREL
    bodies: dict[int, str] = field(default_factory=dict)
    qos_of: dict[str, int] = field(default_factory=dict)

    async def subscribe(self) -> None:
        """Make the session and its subscription (then disconnect: what comes next waits for it)."""
        conn = await connect(self.addresses, self.client_id, asyncio.Event())
        assert conn is not None
        conn.send(subscribe_packet([(self.topic_filter, self.qos)]))
        first, _ = await asyncio.wait_for(conn.read(), 10)
        assert first == 0x90
        conn.send(b"\xe0\x00")
        conn.close()

    async def run(self, stop: asyncio.Event) -> None:
        conn: Conn | None = None
        while not stop.is_set():
            if conn is None:
                conn = await connect(self.addresses, self.client_id, stop)
                if conn is None:
                    return
            try:
                first, data = await asyncio.wait_for(conn.read(), 1.0)
            except TimeoutError:
                continue
            except (OSError, asyncio.IncompleteReadError):
                self.failures += 1
                conn.close()
                conn = None
                continue
            kind, qos = first & 0xF0, (first >> 1) & 0x03
            if kind == 0x30:
                (n,) = struct.unpack(">H", data[:2])
                pos = 2 + n
                pid = struct.unpack(">H", data[pos : pos + 2])[0] if qos else 0
                body = data[pos + (2 if qos else 0) :].decode()
                if qos == 2 and pid in self.kept:
                    conn.send(packet(0x50, struct.pack(">H", pid)))  # a DUP of one delivered: PUBREC again
                    continue
                self.received += 1
                self.qos_of[body] = qos
                self.history.delivered(body, (qos, hash(body)))
                if qos == 1:
                    conn.send(packet(0x40, struct.pack(">H", pid)))
                elif qos == 2:
                    self.kept.add(pid)
                    self.bodies[pid] = body
                    conn.send(packet(0x50, struct.pack(">H", pid)))
            elif kind == 0x60:  # PUBREL: the exchange ends here
                (pid,) = struct.unpack(">H", data[:2])
                body = self.bodies.pop(pid, "")
                self.kept.discard(pid)
                conn.send(packet(0x70, struct.pack(">H", pid)))
                if body:
                    self.history.acked(body, (2, hash(body)))
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(b"\xe0\x00")
            conn.close()


def qos2_duplicates(history: History, subscriber: Subscriber) -> list[str]:
    """QoS 2 messages delivered more than once (exactly once is the contract)."""
    return [b for b, n in history.deliveries.items() if n > 1 and subscriber.qos_of.get(b) == 2]
