"""The proxy's HTTP/2 edge against hostile clients, both topologies, on the real processes: a rapid
reset attack and a CONTINUATION flood each end their own connection with GOAWAY
ENHANCE_YOUR_CALM, an HPACK bomb gets RESOURCE_EXHAUSTED on its stream only, a flood of silent
connections is held without harm, and meanwhile an official-client-shaped call on another
connection is answered (raw frames: tests/helpers/h2raw.py; calls: tests/e2e/support/raw.py).
What it costs the other clients' latency is measured by tests/bench/http2_attack_bench.py."""

from __future__ import annotations

import asyncio
import struct

from rocketmq.grpc_protocol import service_pb2 as spb

from tests.e2e.support import raw
from tests.e2e.support.cluster import Cluster
from tests.helpers import h2raw as h

SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"
QUERY_ROUTE = "/apache.rocketmq.v2.MessagingService/QueryRoute"
RESETS = 1_200  # past the default bucket of 1,000 tokens
SILENT_CONNECTIONS = 300


def _endpoint(cluster: Cluster) -> tuple[str, int]:
    host, port = cluster.first_proxy.rsplit(":", 1)
    return host, int(port)


def _others_served(cluster: Cluster, topic: str) -> None:
    with raw.stub(cluster.first_proxy) as s:
        assert raw.code_name(raw.send(s, raw.message(topic)).status.code) == "OK"


def test_rapid_reset_and_continuation_floods_end_their_connection_only(cluster: Cluster) -> None:
    topic = cluster.create_topic(f"h2-reset-{cluster.kind}")

    async def attacks() -> tuple[int | None, int | None]:
        host, port = _endpoint(cluster)
        client = await h.RawClient.connect(host, port)
        md = tuple(raw.headers())
        for i in range(RESETS):
            sid = 1 + 2 * i
            client.request(sid, QUERY_ROUTE, None, *md)
            client.send(h.frame(h.RST_STREAM, 0, sid, struct.pack(">I", h.CANCEL)))
        reset = await client.until(h.GOAWAY)
        client.close()
        client = await h.RawClient.connect(host, port)
        client.send(h.frame(h.HEADERS, 0, 1, client.headers_block(SEND, *md)))
        client.send(h.frame(h.CONTINUATION, 0, 1, b"") * 100)
        flood = await client.until(h.GOAWAY)
        client.close()
        return (None if reset is None else reset.code), (None if flood is None else flood.code)

    assert asyncio.run(attacks()) == (h.ENHANCE_YOUR_CALM, h.ENHANCE_YOUR_CALM)
    _others_served(cluster, topic)


def test_an_hpack_bomb_is_refused_on_its_stream(cluster: Cluster) -> None:
    async def bomb() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        host, port = _endpoint(cluster)
        client = await h.RawClient.connect(host, port)
        value = "b" * 3000
        client.request(1, QUERY_ROUTE, spb.QueryRouteRequest().SerializeToString(), *raw.headers(), ("x-bomb", value))
        await client.response(1)
        # The entry is in the table now (the client's encoder indexed it): refer to it 30 times.
        index = 62 + next(i for i, (n, _) in enumerate(client.encoder.header_table.dynamic_entries) if n == b"x-bomb")
        block = client.headers_block(QUERY_ROUTE) + bytes([0x80 | index]) * 30 if index < 127 else b""
        assert block, "the bomb's entry is beyond a one-byte index"
        client.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 3, block))
        bombed, _ = await client.response(3)
        client.request(5, QUERY_ROUTE, spb.QueryRouteRequest().SerializeToString(), *raw.headers())
        after, _ = await client.response(5)
        client.close()
        return bombed, after

    bombed, after = asyncio.run(bomb())
    assert ("grpc-status", "8") in bombed  # RESOURCE_EXHAUSTED, its stream only
    assert ("grpc-status", "0") in after  # the same connection answers the next call


def test_a_flood_of_silent_connections_is_held_while_others_are_served(cluster: Cluster) -> None:
    topic = cluster.create_topic(f"h2-flood-{cluster.kind}")

    async def flood() -> int:
        host, port = _endpoint(cluster)
        opened = [await asyncio.open_connection(host, port) for _ in range(SILENT_CONNECTIONS)]
        try:
            await asyncio.to_thread(_others_served, cluster, topic)
            return len(opened)
        finally:
            for _, writer in opened:
                writer.close()

    assert asyncio.run(flood()) == SILENT_CONNECTIONS
