"""The console's own logic, without a cluster: the request guard (CSRF, read-only, login), sessions,
admin rights, paging, charts, body rendering, plot history, and the dead-letter copy rules.

The application is served for real (aiohttp's test server on loopback); its NameServer address
points at a closed port, so a request that passes the guard fails to reach the cluster and shows
that as a message. The browser tests (tests/e2e/test_console.py) cover the pages against a real cluster.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from admin import dlq
from admin.cluster import Cluster
from admin.parse import parse_time_ms
from broker.client.api import StoredMessage
from common import record
from common.config import ConfigError
from common.errors import MessageNotFound, TopicNotFound
from common.model import MessageType
from common.security import Action, Effect, Pattern, ResourceKind, Rule, SecurityDoc, User
from console.app import build_app
from console.charts import line_chart, nice_ceiling
from console.config import ConsoleConfig
from console.history import ClusterPoint, GroupPoint, History, TopicPoint
from console.labels import cell_class, heading
from console.pages_cluster import _safe_next, fleet_rows
from console.pages_messages import body_view
from console.pages_topics import tier_row
from console.paging import paginate
from console.sessions import Sessions, check_login, is_admin
from console.units import human_bytes, human_duration
from tests.helpers.records import delivered

CLOSED = "127.0.0.1:1"  # nothing listens: calls to the cluster fail with UNAVAILABLE
TOKEN = re.compile(r'name="csrf-token" content="([^"]+)"')


def serve(config: ConsoleConfig, body: Callable[[TestClient[web.Request, web.Application]], Awaitable[None]]) -> None:
    async def main() -> None:
        cluster = Cluster(config.namesrv, timeout_s=0.5)
        async with TestClient(TestServer(build_app(config, cluster))) as client:
            await body(client)
        await cluster.close()

    asyncio.run(main())


async def token_of(client: TestClient[web.Request, web.Application], path: str) -> str:
    page = await client.get(path)
    found = TOKEN.search(await page.text())
    assert found, "no CSRF field on " + path
    return found.group(1)


def test_a_post_without_or_with_a_wrong_csrf_token_is_refused_and_with_it_reaches_the_action() -> None:
    async def body(client: TestClient[web.Request, web.Application]) -> None:
        token = await token_of(client, "/nowhere")  # every page, even a 404, carries the token
        for sent in ({}, {"csrf": "forged"}):
            answer = await client.post("/topics", data={"name": "t", **sent})
            assert answer.status == 403
            assert "CSRF" in await answer.text()
        answer = await client.post("/topics", data={"name": "t", "queues": "1", "csrf": token})
        assert answer.history[0].status == 303  # back to /topics, which shows the outcome (and fails itself)
        assert "create topic &#39;t&#39;: HA_NOT_AVAILABLE: cannot reach any NameServer" in await answer.text()

    serve(ConsoleConfig(namesrv=CLOSED), body)


def test_read_only_refuses_every_change() -> None:
    async def body(client: TestClient[web.Request, web.Application]) -> None:
        token = await token_of(client, "/nowhere")
        for path in ("/topics", "/groups/g/delete", "/dlq/g/resend", "/access/users", "/groups/g/reset-offset"):
            answer = await client.post(path, data={"csrf": token, "name": "t"})
            assert answer.status == 403, path
            assert "read-only" in await answer.text()

    serve(ConsoleConfig(namesrv=CLOSED, read_only=True), body)


def test_with_auth_every_page_but_login_needs_a_login() -> None:
    async def body(client: TestClient[web.Request, web.Application]) -> None:
        answer = await client.get("/topics?q=x", allow_redirects=False)
        assert answer.status == 303 and answer.headers["Location"] == "/login?next=/topics?q=x"
        login = await client.get("/login")
        assert login.status == 200 and 'name="secret"' in await login.text()
        answer = await client.post("/topics", data={"csrf": await token_of(client, "/login")})
        assert answer.status == 401
        assert (await client.get("/static/console.css")).status == 200

    serve(ConsoleConfig(namesrv=CLOSED, auth="on"), body)


def test_a_login_may_only_send_back_to_a_page_of_the_console() -> None:
    assert _safe_next("/groups/g?page=2") == "/groups/g?page=2"
    for outside in ("//evil.example/", "https://evil.example/", "/\\evil", ""):
        assert _safe_next(outside) == ""


def test_sessions_expire_renew_and_are_bounded() -> None:
    now = [0.0]
    sessions = Sessions(idle_s=10, max_sessions=2, clock=lambda: now[0])
    first = sessions.new()
    assert sessions.get(first.session_id) is first
    renewed = sessions.renew(first, "ops")
    assert renewed.user == "ops" and renewed.session_id != first.session_id and renewed.csrf != first.csrf
    assert sessions.get(first.session_id) is None
    sessions.new()
    sessions.new()  # the third pushes out the least recently used one
    assert sessions.get(renewed.session_id) is None
    later = sessions.new()
    now[0] = 11
    assert sessions.get(later.session_id) is None


def _rule(key: str, pattern: Pattern, actions: frozenset[Action], effect: Effect = Effect.ALLOW) -> Rule:
    return Rule(key, "", pattern, actions, effect)


def test_only_a_user_with_admin_on_everything_may_log_in() -> None:
    everything = Pattern(ResourceKind.ANY, "", True)
    doc = SecurityDoc(
        users=(User("ops", "s1"), User("app", "s2"), User("denied", "s3")),
        rules=(
            _rule("ops", everything, frozenset({Action.ADMIN})),
            _rule("app", Pattern(ResourceKind.TOPIC, "orders"), frozenset({Action.ADMIN})),
            _rule("denied", everything, frozenset({Action.ADMIN})),
            _rule("denied", everything, frozenset({Action.PUB}), Effect.DENY),
        ),
    )
    assert check_login(doc, "ops", "s1") == ""
    assert check_login(doc, "ops", "wrong") == check_login(doc, "nobody", "s1") == "unknown user or wrong secret"
    assert "no admin rights" in check_login(doc, "app", "s2")
    assert not is_admin(doc, "denied")


def test_paging_filters_and_clamps_the_page_number() -> None:
    from aiohttp.test_utils import make_mocked_request

    names = [f"topic-{i:04d}" for i in range(1000)]
    page = paginate(make_mocked_request("GET", "/topics?page=3"), names, str, 50)
    assert (page.number, page.pages, page.first, page.last, page.items[0]) == (3, 20, 101, 150, "topic-0100")
    page = paginate(make_mocked_request("GET", "/topics?page=999&q=-09"), names, str, 50)
    assert (page.number, page.total, page.items[-1]) == (2, 100, "topic-0999")
    page = paginate(make_mocked_request("GET", "/topics?page=-1"), names, str, 50)
    assert page.number == 1


def test_charts_draw_a_line_with_axes_and_units_or_say_they_are_collecting() -> None:
    assert "collecting" in line_chart([(1.0, 2.0)], title="lag", unit="messages")
    svg = line_chart([(0.0, 0.0), (10.0, 5.0), (20.0, 2.5)], title="lag <b>", unit="msg/s")
    assert "<polyline" in svg and "lag &lt;b&gt;" in svg and "<b>2.5 msg/s</b> now" in svg
    ticks = re.findall(r'<text[^>]*class="tick"[^>]*>([^<]*)</text>', svg)
    assert ticks == ["0", "2.5", "5", "00:00:00", "00:00:10", "00:00:20"]  # value axis 0..5, times (UTC)
    units = re.findall(r'<text[^>]*class="unit"[^>]*>([^<]*)</text>', svg)
    assert units == ["msg/s", "time (UTC)"]
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 12, 180, 2001)] == [1, 0.5, 1, 10, 20, 200, 5000]


def test_a_body_shows_as_json_text_or_hex() -> None:
    assert body_view(b'{"a":[1,2]}') == {"kind": "json", "text": '{\n  "a": [\n    1,\n    2\n  ]\n}'}
    assert body_view("héllo".encode()) == {"kind": "text", "text": "héllo"}
    view = body_view(bytes(range(250, 256)) + b"AB")
    assert view["kind"] == "hex" and view["text"].startswith("00000000  fa fb fc fd fe ff 41 42")
    assert body_view(b"")["kind"] == "empty"


def test_history_gives_rates_between_points_and_forgets_the_least_recently_viewed() -> None:
    now = [1000.0]
    history = History(history_s=3600, interval_s=10, watched_max=2, clock=lambda: now[0])
    history.record_topic("t", TopicPoint(stored=100, backlog=100))
    assert history.last_rate_in("t") is None
    now[0] += 10
    history.record_topic("t", TopicPoint(stored=150, backlog=150))
    assert history.topic_rate_in("t") == [(1010.0, 5.0)]
    history.record_group("g", GroupPoint(consumed=0, lag=7, in_flight=1))
    assert history.group_lag("g") == [(1010.0, 7.0)]
    history.record_group("h", GroupPoint(consumed=0, lag=0, in_flight=0))  # a third: "t" is dropped
    assert history.topic_rate_in("t") == []


def test_the_sampler_reads_only_what_no_page_recorded_within_the_interval() -> None:
    now = [1000.0]
    history = History(history_s=3600, interval_s=10, watched_max=10, clock=lambda: now[0])
    asked: list[str] = []

    class Unreachable:  # stands in for a Cluster: every topic lookup is counted, then fails
        async def route(self, name: str) -> None:
            asked.append(name)
            raise TopicNotFound(name)

    history.record_topic("seen", TopicPoint(stored=1, backlog=1))
    now[0] += 5
    history.record_topic("viewed-now", TopicPoint(stored=1, backlog=1))
    now[0] += 6  # "seen" was recorded 11 s ago, "viewed-now" 6 s ago
    asyncio.run(history.sample(cast(Cluster, Unreachable())))
    assert asked == ["seen"]


def test_times_parse_as_epoch_ms_or_iso() -> None:
    assert parse_time_ms("1700000000000", "from") == 1_700_000_000_000
    assert parse_time_ms("2024-01-01T00:00:00Z", "from") == parse_time_ms("2024-01-01T00:00:00", "from")
    with pytest.raises(ConfigError, match="from 'yesterday' is not a time"):
        parse_time_ms("yesterday", "from")


def _stored(message_type: MessageType, group: str | None = None) -> StoredMessage:
    return delivered(
        topic="%DLQ%g", queue_id=0, queue_offset=3, body=b"x", message_id="01OLD", message_type=message_type,
        tag="t", keys=("k",), message_group=group, properties={"p": "1"},
        system_properties={"DLQ_ORIGIN_TOPIC": "orders"}, born_timestamp_ms=1, born_host="h",
        store_timestamp_ms=2, store_host="s", delivery_timestamp_ms=0, delivery_attempt=1,
    )  # fmt: skip


def test_a_resent_dead_letter_is_a_new_message_naming_the_original() -> None:
    fifo = record.decode(dlq._copy_of(_stored(MessageType.FIFO, "m1"), "01NEW"))
    assert (fifo.message_type, fifo.message_group, fifo.tag, fifo.keys) == (MessageType.FIFO, "m1", "t", ("k",))
    assert fifo.properties == {"p": "1", dlq.RESENT_FROM_PROPERTY: "01OLD"} and fifo.message_id == "01NEW"
    delayed = record.decode(dlq._copy_of(_stored(MessageType.DELAY), "01NEW2"))
    assert (delayed.message_type, delayed.delivery_timestamp_ms) == (MessageType.NORMAL, 0)
    letters = [dlq.DeadLetter("broker-a", _stored(MessageType.NORMAL))]
    with pytest.raises(MessageNotFound, match="01NOPE; nothing was resent"):
        dlq._choose(letters, ["01OLD", "01NOPE"], "g")
    assert dlq._choose(letters, ["01OLD", "01OLD"], "g") == letters


@pytest.mark.parametrize(
    ("message_type", "group", "gzip"),
    [(MessageType.FIFO, "m1", False), (MessageType.FIFO, None, True), (MessageType.DELAY, None, False),
     (MessageType.TRANSACTION, "m2", True), (MessageType.NORMAL, None, False)],
)  # fmt: skip
def test_a_resend_is_the_edge_record_of_the_message_as_its_producer_sent_it(
    message_type: MessageType, group: str | None, gzip: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resend's bytes: the message's body, tag, keys, born host and gzip flag; properties plus
    the original id; born now; FIFO only with a group; no system properties, no delivery time."""
    monkeypatch.setattr(dlq.time, "time", lambda: 1_800_000_000.5)
    m = delivered(
        topic="%DLQ%g", queue_id=1, queue_offset=3, body=b"zipped?", message_id="01OLD", message_type=message_type,
        tag="t", keys=("k", "k2"), message_group=group, properties={"p": "1"},
        system_properties={"DLQ_ORIGIN_TOPIC": "orders"}, born_timestamp_ms=1, born_host="h",
        store_timestamp_ms=2, store_host="s", delivery_timestamp_ms=99, delivery_attempt=4, body_gzip=gzip,
    )  # fmt: skip
    fifo = message_type is MessageType.FIFO and group is not None
    assert dlq._copy_of(m, "01NEW") == record.outgoing(
        body=b"zipped?", message_id="01NEW", message_type=MessageType.FIFO if fifo else MessageType.NORMAL, tag="t",
        keys=("k", "k2"), message_group=group if fifo else None, properties={"p": "1", "SLUICE_RESENT_FROM": "01OLD"},
        born_timestamp_ms=1_800_000_000_500, born_host="h", body_gzip=gzip,
    )  # fmt: skip


def test_bytes_and_durations_read_as_an_operator_reads_them() -> None:
    assert [human_bytes(n) for n in (None, 0, 1023, 1536, 5 * 1024**3)] == ["", "0 B", "1023 B", "1.5 KiB", "5.0 GiB"]
    assert [human_duration(s) for s in (None, 0, 75, 3_600, 93_784)] == ["", "0s", "1m 15s", "1h", "1d 2h"]


def test_a_proxy_is_an_endpoint_however_many_workers_registered() -> None:
    def worker(proxy_id: str, endpoint: str, *, clients: int = 0, load: float = 0.1, draining: bool = False) -> dict:
        return {"proxy": proxy_id, "zone": "zone-a", "endpoints": {"default": endpoint}, "draining": draining,
                "clients": clients, "in_flight": 2, "load": load, "last_heartbeat_s": 1.5}  # fmt: skip

    registrations = [worker("10.0.0.1:8081-11", "10.0.0.1:8081", load=0.3),
                     worker("10.0.0.1:8081-12", "10.0.0.1:8081", load=0.2),
                     worker("10.0.0.2:8081-13", "10.0.0.2:8081", draining=True)]  # fmt: skip
    rows = fleet_rows(registrations, {"10.0.0.1:8081": {"c1", "c2"}})
    assert [(r["proxy"], r["workers"], r["clients"], r["in_flight"], r["load"], r["health"]) for r in rows] == [
        ("10.0.0.1:8081", 2, 2, 4, 0.3, "ok"), ("10.0.0.2:8081", 1, 0, 2, 0.1, "draining"),
    ]  # fmt: skip


def test_column_headings_read_as_words_with_their_units() -> None:
    assert heading("last_heartbeat_s") == "Last heartbeat (s ago)"
    assert heading("rate_in_per_s") == "In (msg/s)"
    assert heading("lag_after") == "Lag after"
    assert heading("uptime") == "Uptime"
    assert heading("wait_ms") == "Wait (ms)" and heading("put_bytes") == "Put (bytes)"
    assert heading("queue_count_per_s") == "Queue count (/s)" and heading("used_pct") == "Used (%)"
    assert [heading(k) for k in ("written", "retained", "stored")] == ["Written (all time)", "Retained", "Stored at"]
    for key in ("backlog", "client_id", "message_id", "in_s3", "on_disk"):
        assert "_" not in heading(key) and heading(key)[0].isupper(), key
    assert (cell_class("message_id"), cell_class("written"), cell_class("error")) == ("nowrap", "nowrap", "prose")


def test_every_page_heading_is_humanised() -> None:
    """No page shows a column key: every table heading goes through `heading` (no underscores, no
    bare unit word such as "S" or "Per S")."""
    from pathlib import Path

    templates = Path(__file__).resolve().parents[2] / "console" / "templates"
    for page in templates.glob("*.html"):
        text = page.read_text()
        assert 'c.replace("_"' not in text, page.name
        for heading_cell in re.findall(r"<th>(.*?)</th>", text):
            assert "heading" in heading_cell or "_" not in heading_cell, (page.name, heading_cell)


def test_the_cluster_is_sampled_while_its_page_is_watched_with_rates_per_broker() -> None:
    now = [1000.0]
    history = History(history_s=3600, interval_s=10, watched_max=10, clock=lambda: now[0])
    answers = [
        {"a": [(0, 100, 50)], "b": [(0, 10, 0)]},  # per broker: (queue, max offset, delivered)
        {"a": [(0, 300, 150)], "b": [(0, 30, 20)]},
        {"a": [(0, 500, 150)], "b": [(0, 30, 20)]},
    ]

    async def fake_point(cluster: object) -> ClusterPoint:
        answer = answers.pop(0)
        return ClusterPoint({b: sum(q[1] for q in qs) for b, qs in answer.items()},
                            {b: sum(q[2] for q in qs) for b, qs in answer.items()})  # fmt: skip

    history._cluster_point = fake_point  # type: ignore[method-assign]  # the broker calls are admin code's
    asyncio.run(history.sample(cast(Cluster, None)))
    assert answers and history.cluster_rate_in() == []  # not watched: not sampled
    history.watch_cluster()
    for _ in range(3):
        asyncio.run(history.sample(cast(Cluster, None)))
        now[0] += 10
    assert history.cluster_rate_in() == [(1010.0, 22.0), (1020.0, 20.0)]  # (200 + 20) / 10 s, then 200 / 10 s
    assert history.cluster_rate_out() == [(1010.0, 12.0), (1020.0, 0.0)]
    assert history.cluster_rate_in("b") == [(1010.0, 2.0), (1020.0, 0.0)]


def test_the_admin_reads_use_groups_the_broker_does_not_count_as_consumers() -> None:
    from admin import messages, produce
    from common.model import ADMIN_READ_GROUP_PREFIX

    for browse_group in (messages.BROWSE_GROUP, dlq.BROWSE_GROUP, produce.BROWSE_GROUP):
        assert browse_group.startswith(ADMIN_READ_GROUP_PREFIX), browse_group


def test_tier_ranges_read_as_counts_and_offsets() -> None:
    def queue(qid: int, local: tuple[int, int], tiered: tuple[int, int]) -> dict[str, int]:
        return {"queue_id": qid, "local_min": local[0], "local_max": local[1], "tiered_min": tiered[0],
                "tiered_end": tiered[1]}  # fmt: skip

    evicted = {"broker": "broker-a", "queues": [queue(0, (300, 300), (0, 300))], "lag_messages": 0, "lag_s": 0.04,
               "bytes": 110362, "objects": 12, "last_upload": "2026-11-27T08:57:02.741Z", "last_error": ""}  # fmt: skip
    row = tier_row(evicted)
    assert (row["local"], row["tiered"], row["s3_size"]) == ("none", "300 (offsets 0-299)", "107.8 KiB")
    assert row["tiered_title"] == "queue 0: offsets 0-299" and row["local_title"] == "queue 0: none"
    spread = tier_row({**evicted, "queues": [queue(0, (0, 1500), (0, 0)), queue(1, (10, 20), (0, 10))]})
    assert (spread["local"], spread["tiered"]) == ("1,510 in 2 queues", "10 (offsets 0-9)")
    assert spread["local_title"] == "queue 0: offsets 0-1,499; queue 1: offsets 10-19"
