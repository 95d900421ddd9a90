#!/usr/bin/env python3
"""The floor of a pure-Python MQTT server on this machine, against Mosquitto, with mqtt_bench.py's
client and its publish and fanout phases (docs/benchmarks.md).

    .venv/bin/python tests/bench/mqtt_floor.py [--seconds 8] [--rounds 1] [--publishers 4] [--window 32]
        [--fanout-window 8] [--payload 256] [--subscribers 100]

The floor is the cheapest thing any pure-Python MQTT 3.1.1 broker could be: one asyncio.Protocol on
uvloop (TCP_NODELAY, 127.0.0.1) that stores nothing and logs nothing. It answers CONNECT (CONNACK 0),
PINGREQ and SUBSCRIBE (SUBACK granting the requested QoS; exact topic filters only, no wildcards),
closes on DISCONNECT, acknowledges QoS 1 PUBLISHes at once and forwards every PUBLISH to the
subscribers of its exact topic as a QoS 1 PUBLISH with a per-subscriber packet id; subscribers'
PUBACKs are read and dropped. It parses every whole packet of each chunk received and writes all the
replies and deliveries the chunk caused in one `transport.write` per connection. Left out: sessions,
retained messages, wills, QoS 2 (closes the connection), UNSUBSCRIBE, any inflight limit (Mosquitto
here keeps 32 per subscriber) and any flow control (a slow subscriber's deliveries pile up in its
transport's buffer, as Mosquitto's max_queued_messages 0 lets its queue grow).

If even the floor cannot reach Mosquitto's rate with the same client, no pure-Python broker can. The
client's own CPU is read over each measured window too: at Mosquitto's rate, the two cores less the
client's share are what any server has per message (printed as the budget). The floor runs as a
child process (this file with `--serve PORT`) so that its CPU is read from /proc as Mosquitto's is;
both are stopped by PID and the temp dir is removed. Phases and rounds alternate between the two
servers as in mqtt_bench.py; on a shared machine compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uvloop
from client_bench import _popen_server, _stop_group, _wait_port
from mqtt_bench import Row, Target, add_load_arguments, best_round, phase_fanout, phase_publish, start_mosquitto, table

from tests.helpers.procs import LOOPBACK, free_port

CORES = os.cpu_count() or 1
CONNACK = b"\x20\x02\x00\x00"
PINGRESP = b"\xd0\x00"


# -- the floor server ------------------------------------------------------------------------------


def _fixed_header(first: int, size: int) -> bytes:
    """The first byte and the remaining length (variable byte integer) of a packet."""
    out = bytearray((first,))
    while size > 0x7F:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


class FloorConnection(asyncio.Protocol):
    """One client connection; the topic table and the list of connections with replies to write are
    shared by all connections of the server."""

    transport: asyncio.Transport

    def __init__(self, topics: dict[bytes, list[FloorConnection]], dirty: list[FloorConnection]) -> None:
        self.topics, self.dirty = topics, dirty
        self.buffer = b""  # the start of a packet not yet whole
        self.out = bytearray()  # replies and deliveries of the chunk being handled
        self.packet_id = 0  # of the last delivery to this connection
        self.subscribed: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._unsubscribe()

    def _unsubscribe(self) -> None:
        for topic in self.subscribed:
            subs = self.topics.get(topic, [])
            if self in subs:
                subs.remove(self)
                if not subs:
                    del self.topics[topic]
        self.subscribed.clear()

    def data_received(self, data: bytes) -> None:
        if self.buffer:
            data, self.buffer = self.buffer + data, b""
        out, dirty, end, pos = self.out, self.dirty, len(data), 0
        dirty.append(self)
        while pos + 2 <= end:
            first, size, shift, at = data[pos], 0, 0, pos + 1
            while at < end:  # the remaining length
                byte = data[at]
                size |= (byte & 0x7F) << shift
                shift, at = shift + 7, at + 1
                if byte < 0x80:
                    break
            else:
                break
            body_end = at + size
            if body_end > end:
                break
            pos, kind = body_end, first & 0xF0
            if kind == 0x30:  # PUBLISH
                topic_end = at + 2 + (data[at] << 8 | data[at + 1])
                qos = (first >> 1) & 3
                if qos == 1:
                    out += b"\x40\x02" + data[topic_end : topic_end + 2]
                elif qos:
                    self.transport.close()  # QoS 2 is not supported
                    break
                subs = self.topics.get(data[at + 2 : topic_end])
                if subs:
                    payload = data[topic_end + 2 * qos : body_end]
                    head = _fixed_header(0x32, topic_end - at + 2 + len(payload)) + data[at:topic_end]
                    for sub in subs:
                        if not sub.out:
                            dirty.append(sub)
                        sub.packet_id = sub.packet_id % 65535 + 1
                        sub.out += head
                        sub.out += sub.packet_id.to_bytes(2, "big")
                        sub.out += payload
            elif kind == 0x40:  # PUBACK of a delivery: nothing kept, nothing to do
                pass
            elif kind == 0x10:  # CONNECT
                out += CONNACK
            elif kind == 0x80:  # SUBSCRIBE: packet id, then (filter, requested QoS) pairs
                packet_id, granted, at = data[at : at + 2], bytearray(), at + 2
                while at < body_end:
                    topic_end = at + 2 + (data[at] << 8 | data[at + 1])
                    topic = data[at + 2 : topic_end]
                    subs = self.topics.setdefault(topic, [])
                    if self not in subs:
                        subs.append(self)
                        self.subscribed.append(topic)
                    granted.append(data[topic_end] & 3)
                    at = topic_end + 1
                out += _fixed_header(0x90, 2 + len(granted)) + packet_id + granted
            elif kind == 0xC0:  # PINGREQ
                out += PINGRESP
            elif kind == 0xE0:  # DISCONNECT
                self._unsubscribe()
                self.transport.close()
                break
        if pos < end:
            self.buffer = data[pos:]
        for conn in dirty:  # one write per connection for the whole chunk
            if conn.out:
                chunk, conn.out = conn.out, bytearray()
                if not conn.transport.is_closing():
                    conn.transport.write(chunk)
        dirty.clear()


def serve(port: int) -> None:
    """Run the floor server on 127.0.0.1:`port` until killed."""

    async def run() -> None:
        topics: dict[bytes, list[FloorConnection]] = {}
        dirty: list[FloorConnection] = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: FloorConnection(topics, dirty), LOOPBACK, port, backlog=1024)
        gc.freeze()  # the start-up's objects out of the collector's way
        await server.serve_forever()

    uvloop.run(run())


# -- the run ---------------------------------------------------------------------------------------


def start_floor(root: Path) -> Target:
    port = free_port()
    proc = _popen_server("floor", [sys.executable, str(Path(__file__).resolve()), "--serve", str(port)], root)
    _wait_port(port, proc, "floor server")
    return Target("floor", port, lambda: [proc.pid] if proc.poll() is None else [], lambda: _stop_group(proc))


@dataclass
class ClientSampled(Target):
    """A target whose CPU samples also take this process's (the client's) CPU at the same instants."""

    client_cpu: list[float] = field(default_factory=list)

    def cpu_s(self) -> float:
        self.client_cpu.append(time.process_time())
        return super().cpu_s()


def sampled(t: Target) -> ClientSampled:
    return ClientSampled(t.name, t.port, t.pids, t.stop)


def floor_ratios(rows: list[Row], client_us: dict[int, float]) -> list[str]:
    """Per phase, the floor's best round against Mosquitto's: rate and server CPU per message, and
    the CPU per message two cores leave a server at Mosquitto's rate beside the client."""
    out = []
    for phase in ("publish", "fanout"):
        f, m = best_round(rows, "floor", phase), best_round(rows, "mosquitto", phase)
        if f and m and m.rate and m.us_per:
            out.append(
                f"{phase}: floor {f.rate / m.rate:.2f}x Mosquitto's msg/s; server CPU {f.us_per:.1f} vs "
                f"{m.us_per:.1f} us per message ({f.us_per / m.us_per:.2f}x)"
            )
            client = client_us[id(m)]
            out.append(
                f"{phase}: at Mosquitto's {m.rate:,.0f}/s the client took {client:.1f} us per message, which "
                f"leaves a server {CORES * 1e6 / m.rate - client:.1f} us per message of {CORES} cores"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--serve", type=int, metavar="PORT", help="run the floor server only (the script does)")
    add_load_arguments(parser)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return 0
    rows: list[Row] = []
    client_us: dict[int, float] = {}  # by id(row): the client's CPU per message in that window
    with tempfile.TemporaryDirectory(prefix="mqtt-floor-") as tmp:
        targets = [sampled(start_floor(Path(tmp)))]
        try:
            targets.append(sampled(start_mosquitto(Path(tmp))))
            for _ in range(args.rounds):
                for phase, run in (("publish", phase_publish), ("fanout", phase_fanout)):
                    for t in targets:
                        print(f"{t.name}: {phase} ...", file=sys.stderr, flush=True)
                        t.client_cpu.clear()
                        row = asyncio.run(run(t, args))
                        rows.append(row)
                        client_us[id(row)] = (t.client_cpu[1] - t.client_cpu[0]) * 1e6 / max(1, row.count)
        finally:
            for t in targets:
                t.stop()
    print(table(rows))
    for line in floor_ratios(rows, client_us):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
