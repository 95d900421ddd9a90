"""tests/bench/mqtt_floor.py's storeless server: what it answers is what the floor's figures count."""

from __future__ import annotations

import asyncio
import struct

from tests.bench.mqtt_floor import CONNACK, FloorConnection


def _packet(first: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((first, len(body))) + body


def _str(text: str) -> bytes:
    return struct.pack(">H", len(text)) + text.encode()


CONNECT = _packet(0x10, _str("MQTT") + b"\x04\x02\x00\x3c" + _str("c"))


async def _client(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(CONNECT)
    assert await reader.readexactly(4) == CONNACK
    return reader, writer


def test_a_qos1_publish_is_acknowledged_and_reaches_the_subscriber_of_its_topic() -> None:
    asyncio.run(_publish_and_deliver())


async def _publish_and_deliver() -> None:
    topics: dict[bytes, list[FloorConnection]] = {}
    dirty: list[FloorConnection] = []
    server = await asyncio.get_running_loop().create_server(lambda: FloorConnection(topics, dirty), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sub_r, sub_w = await _client(port)
        sub_w.write(_packet(0x82, b"\x00\x05" + _str("a/b") + b"\x01"))
        assert await sub_r.readexactly(5) == b"\x90\x03\x00\x05\x01"  # SUBACK, packet id 5, QoS 1 granted
        pub_r, pub_w = await _client(port)
        publish = _packet(0x32, _str("a/b") + b"\x00\x07" + b"hi")
        pub_w.write(publish[:4])  # a packet split across reads is put together
        await pub_w.drain()
        await asyncio.sleep(0.05)
        pub_w.write(publish[4:] + _packet(0x30, _str("a/c") + b"no one"))  # QoS 0, to no subscriber
        assert await pub_r.readexactly(4) == b"\x40\x02\x00\x07"  # PUBACK of packet id 7
        # The subscriber's copy: QoS 1, its own packet id 1, the same topic and payload.
        assert await sub_r.readexactly(11) == _packet(0x32, _str("a/b") + b"\x00\x01" + b"hi")
        for w in (sub_w, pub_w):
            w.close()
    finally:
        server.close()
        await server.wait_closed()
