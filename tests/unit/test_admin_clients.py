"""`sluice admin client list`: one row per client id, its connections to several proxies (one per
shard of `sluice up --shards N`) folded into that row."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from admin.clients import CLIENT_COLUMNS, client_rows, list_clients
from admin.output import render_json, render_table
from broker.client.api import ConnectedClient
from console.pages_cluster import _client_count

NOW_MS = 1_800_000_000_000
SHARD_0, SHARD_1 = "127.0.0.1:8081", "127.0.0.1:8082"


def conn(client_id: str, proxy: str, *, seen_s_ago: float, port: int, group: str = "g", language: str = "PYTHON",
         topics: tuple[str, ...] = ("t",), client_type: str = "SIMPLE_CONSUMER") -> ConnectedClient:  # fmt: skip
    return ConnectedClient(client_id, language, "5.0.1" if language else "", client_type, f"127.0.0.1:{port}", proxy,
                           group, topics, NOW_MS - int(seen_s_ago * 1000))  # fmt: skip


def test_a_client_connected_to_two_shards_is_one_row_listing_both() -> None:
    rows = client_rows(
        [
            conn("c1", SHARD_1, seen_s_ago=1.0, port=5001, topics=("t", "u")),
            conn("c1", SHARD_0, seen_s_ago=3.0, port=5000, topics=("t",)),
            conn("c2", SHARD_0, seen_s_ago=2.0, port=5002, group="", client_type="PRODUCER"),
        ],
        NOW_MS,
    )
    assert [r["client_id"] for r in rows] == ["c1", "c2"]
    one = rows[0]
    assert one["proxies"] == [SHARD_0, SHARD_1]
    assert (one["type"], one["group"], one["topics"]) == ("SIMPLE_CONSUMER", "g", ["t", "u"])
    assert (one["address"], one["last_seen_s"]) == ("127.0.0.1:5001", 1.0)  # the most recently seen connection
    assert one["connections"] == [
        {"proxy": SHARD_0, "address": "127.0.0.1:5000", "last_seen_s": 3.0},
        {"proxy": SHARD_1, "address": "127.0.0.1:5001", "last_seen_s": 1.0},
    ]
    assert rows[1]["proxies"] == [SHARD_0] and rows[1]["type"] == "PRODUCER"


def test_what_a_client_told_one_proxy_fills_the_row_when_the_newest_session_has_not_said_it_yet() -> None:
    """A session's language and version are empty until its Settings arrive on that proxy."""
    (row,) = client_rows(
        [conn("c1", SHARD_1, seen_s_ago=0.5, port=5001, language=""), conn("c1", SHARD_0, seen_s_ago=4, port=5000)],
        NOW_MS,
    )
    assert (row["language"], row["version"], row["address"]) == ("PYTHON", "5.0.1", "127.0.0.1:5001")


class _Reports:
    """What `connected_clients` reads: the brokers' merged reports, one entry per (proxy, client)."""

    def __init__(self, connections: list[ConnectedClient]) -> None:
        self.connections = connections

    async def reuse(self, key: str, ask: Any) -> list[ConnectedClient]:
        return self.connections


def test_table_and_json_show_one_row_per_client_with_its_proxies() -> None:
    cluster = _Reports([conn("c1", SHARD_0, seen_s_ago=1, port=5000), conn("c1", SHARD_1, seen_s_ago=2, port=5001),
                        conn("c2", SHARD_1, seen_s_ago=1, port=5002, group="other")])  # fmt: skip
    report = asyncio.run(list_clients(cluster, group="g"))  # type: ignore[arg-type]
    assert report.columns == CLIENT_COLUMNS and "proxies" in CLIENT_COLUMNS
    table = render_table(report).splitlines()
    assert table[0].split()[5] == "PROXIES" and len(table) == 3, table  # header, c1, note
    assert f"{SHARD_0},{SHARD_1}" in table[1]
    assert table[2] == "1 client(s) of group g over 2 proxy connection(s)"
    (row,) = json.loads(render_json(report))
    assert row["client_id"] == "c1" and row["proxies"] == [SHARD_0, SHARD_1] and len(row["connections"]) == 2
    assert [r["client_id"] for r in asyncio.run(list_clients(cluster, topic="t")).rows] == ["c1", "c2"]  # type: ignore[arg-type]


def test_the_consoles_client_tile_counts_a_client_of_two_shards_once() -> None:
    cluster = _Reports([conn("c1", SHARD_0, seen_s_ago=1, port=5000), conn("c1", SHARD_1, seen_s_ago=2, port=5001),
                        conn("c2", SHARD_1, seen_s_ago=1, port=5002)])  # fmt: skip
    assert asyncio.run(_client_count(cluster)) == 2
