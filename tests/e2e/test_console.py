"""The operator's console in a real headless Chromium, against a real merged Sluice (`sluice up`
serves it on `--console-port`) with traffic from the official Python client.

Every page renders (screenshots under the test's tmp_path); a stalled group's lag shows; a dead
letter is found, resent from the page and consumed; every form refuses bad input with a message on
the page and changes nothing; a POST without the CSRF token is refused; with `--auth on`, a user
without admin rights cannot log in and an admin can. `sluice admin dlq list|resend` is checked
against the same dead letters.
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.version import sluice_version
from tests.e2e.support.browser import browser_or_skip
from tests.e2e.support.clients import message, producer_and_consumer, receive_until, send_all
from tests.e2e.support.cluster import SLUICE, START_TIMEOUT_S, AdminError, Cluster, start_merged
from tests.helpers.procs import LOOPBACK, free_port, start_process

WAIT_S = 30.0
SHORT_INVISIBLE_S = 1
SAMPLE_INTERVAL_S = 1.0
REUSE_S = 120.0
WIDTHS = (1280, 1920)  # the console's pages are checked at both
# Every table cell that must stay on one line (class "nowrap": identifiers, figures, sizes, times)
# whose text spans more than one line box, as "page: table/column: text".
WRAPPED_CELLS_JS = """
() => [...document.querySelectorAll("td.nowrap, th")].flatMap(cell => {
  const range = document.createRange();
  range.selectNodeContents(cell);
  const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.bottom)));
  return lines.size > 1 ? [`${cell.closest("table").id || "table"}: ${cell.innerText}`] : [];
})
"""
# Tables wider than their box (they would scroll sideways).
WIDE_TABLES_JS = """
() => [...document.querySelectorAll(".table-wrap")].filter(w => w.scrollWidth > w.clientWidth + 1)
  .map(w => `${w.querySelector("table").id || "table"}: ${w.scrollWidth} > ${w.clientWidth}`)
"""


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("console-merged")
    config = root / "sluice.toml"
    # Plots fill within seconds. Answers are kept long (`nameserver_cache_s`): a page must never show
    # one asked before it was requested, however long the console keeps them for reuse within a page.
    config.write_text(f"[console]\nsample_interval_s = {SAMPLE_INTERVAL_S}\nnameserver_cache_s = {REUSE_S}\n")
    started = start_merged(root, extra_args=["--config", str(config)], amqp=True, mqtt=True)
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with browser_or_skip(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = browser.new_page()
    try:
        yield opened
    finally:
        opened.close()


def visit(page: Any, url: str, status: int = 200) -> None:
    response = page.goto(url)
    assert response is not None and response.status == status, f"{url}: {response and response.status}"


def flash(page: Any, kind: str) -> str:
    text: str = page.locator(f".flash.{kind}").first.inner_text()
    return text


def wait_for(what: str, probe: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.3)


def test_every_page_renders_and_a_stalled_group_shows_its_lag(
    merged: Cluster, page: Any, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    topic = merged.create_topic(unique("orders"))
    group = merged.create_group(unique("billing"), consume_from="earliest")
    with producer_and_consumer(merged.endpoints, topic, group) as (p, c):
        ids = send_all(p, [message(topic, b'{"order": %d}' % i, tag="new", keys=[f"k{i}"]) for i in range(5)])
        receive_until(c, lambda got: len(got) >= 2, max_messages=2)  # two acked, then the consumer stalls
    shots = tmp_path / "screenshots"
    console = merged.console

    visit(page, f"{console}/cluster")
    brokers = page.locator("#brokers").inner_text()
    assert brokers.count("broker-a") == 1
    assert "ok" in page.locator("#brokers .health").first.inner_text()
    # What `sluice admin broker list --json` reports, on the page: version, disk use, store bytes.
    (listed,) = merged.admin("broker", "list")
    assert listed["version"] == sluice_version() and sluice_version() in brokers
    assert f"({listed['disk_used_pct']} %)" in page.locator("#storage").inner_text() and listed["store_bytes"] > 0
    (nameserver,) = merged.admin("nameserver", "list")
    assert (nameserver["health"], nameserver["brokers"]) == ("ok", 1)
    assert page.locator("#nameservers").inner_text().split("\n")[-1].split("\t")[:3] == ["ok", merged.namesrv, "1"]
    page.screenshot(path=str(shots / "cluster.png"), full_page=True)

    visit(page, f"{console}/topics?q={topic}")
    assert topic in page.locator("#topics").inner_text()
    page.screenshot(path=str(shots / "topics.png"), full_page=True)
    page.locator("#topics a", has_text=topic).click()
    assert page.locator("h1").inner_text() == f"Topic {topic}"
    assert page.locator("#stored").inner_text() == "5"
    assert re.fullmatch(r"[1-9][\d.]* (B|KiB)", page.locator("#on-disk").inner_text())  # five small messages
    assert page.locator("#in-s3").inner_text() == "0 B"  # no tiering
    assert "messages out per second" in page.locator(".charts").inner_text()
    page.screenshot(path=str(shots / "topic.png"), full_page=True)

    visit(page, f"{console}/groups/{group}")
    wait_for("the lag of the stalled group", lambda: _reload_text(page, "#lag") == "3")
    page.screenshot(path=str(shots / "group.png"), full_page=True)
    visit(page, f"{console}/groups?q={group}")
    assert group in page.locator("#groups").inner_text()
    page.screenshot(path=str(shots / "groups.png"), full_page=True)

    visit(page, f"{console}/messages?topic={topic}&key=k3")
    assert ids[3] in page.locator("#results").inner_text()
    visit(page, f"{console}/messages?topic={topic}")  # by time: the last hour
    assert all(i in page.locator("#results").inner_text() for i in ids)
    page.locator("#results a", has_text=ids[0]).click()
    assert '"order": 0' in page.locator("#body").inner_text()  # JSON, pretty-printed
    assert "sent" in page.locator("#trace").inner_text()
    page.screenshot(path=str(shots / "message.png"), full_page=True)

    for path, name in (("/dlq", "dlq"), ("/access", "access")):
        visit(page, console + path)
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    assert sorted(p.name for p in shots.iterdir()) == sorted(
        f"{n}.png" for n in ("cluster", "topics", "topic", "groups", "group", "message", "dlq", "access")
    )


def _reload_text(page: Any, selector: str) -> str:
    page.reload()
    text: str = page.locator(selector).inner_text().strip()
    return text


def test_a_dead_letter_is_found_resent_and_consumed(merged: Cluster, page: Any, unique: Callable[[str], str]) -> None:
    topic = merged.create_topic(unique("pay"))
    group = merged.create_group(unique("payer"), max_attempts=1)
    with producer_and_consumer(merged.endpoints, topic, group) as (p, c):
        (poison,) = send_all(p, [message(topic, b"poison", tag="bad")])
        receive_until(c, lambda got: len(got) >= 1, invisible_s=SHORT_INVISIBLE_S, ack=False)

        def listed() -> list[dict[str, Any]]:
            doc = merged.admin("dlq", "list", group)
            return [d for d in doc["dead_letters"] if d["message_id"] == poison]

        wait_for("the dead letter", lambda: bool(listed()))
        (letter,) = listed()
        assert (letter["origin_topic"], letter["attempts"]) == (topic, 1)
        visit(page, f"{merged.console}/groups/{group}")
        assert page.locator("#dead-letters").inner_text() == "1"
        assert merged.admin("group", "describe", group)["dead_letters"] == 1

        visit(page, f"{merged.console}/dlq/{group}")
        row = page.locator("#dead-letters tr", has_text=poison)
        assert topic in row.inner_text()
        row.locator("input[name=id]").check()
        page.locator("#resend button").click()  # the confirmation dialog is accepted
        page.wait_for_url(f"**/dlq/{group}")
        assert "1 dead letter(s) resent" in flash(page, "ok")

        (again,) = receive_until(c, lambda got: len(got) >= 1)  # acked
        assert again.body == b"poison" and again.message_id != poison
        assert again.properties.get("SLUICE_RESENT_FROM") == poison


def test_an_offset_reset_takes_effect_and_the_group_shows_its_clients(
    merged: Cluster, page: Any, unique: Callable[[str], str]
) -> None:
    topic = merged.create_topic(unique("t"))
    group = merged.create_group(unique("g"), consume_from="earliest")
    with producer_and_consumer(merged.endpoints, topic, group) as (p, c):
        send_all(p, [message(topic, b"old-%d" % i) for i in range(4)])
        visit(page, f"{merged.console}/groups/{group}")
        wait_for("the lag", lambda: _reload_text(page, "#lag") == "4")
        wait_for("the consumer in the client list", lambda: c.client_id in _reload_text(page, "#clients"))

        def reset(to: str, *, confirm: bool) -> None:
            page.select_option("#reset [name=topic]", topic)
            page.fill("#reset [name=to]", to)
            page.set_checked("#reset [name=confirm]", confirm)
            page.click("#reset button")
            page.wait_for_url(f"**/groups/{group}")

        reset("soon", confirm=True)
        assert "use earliest, latest" in flash(page, "error")
        reset("latest", confirm=False)
        assert "tick 'confirm'" in flash(page, "error")
        assert page.locator("#lag").inner_text() == "4"  # nothing changed
        reset("latest", confirm=True)
        assert "lag afterwards 0" in flash(page, "ok")
        assert page.locator("#lag").inner_text() == "0"

        send_all(p, [message(topic, b"new")])
        got = receive_until(c, lambda got: len(got) >= 1)
        assert [m.body for m in got] == [b"new"]


def test_bad_input_in_every_form_changes_nothing(merged: Cluster, page: Any, unique: Callable[[str], str]) -> None:
    console = merged.console
    topics_before = {t["topic"] for t in merged.admin("topic", "list")}
    groups_before = {g["group"] for g in merged.admin("group", "list")}
    acl_before = merged.admin("acl", "list")

    def submit(path: str, form: str, fields: dict[str, str], expected: str) -> None:
        visit(page, console + path)
        for name, value in fields.items():
            page.locator(f"{form} [name={name}]").fill(value)
        page.locator(f"{form} button").click()
        page.wait_for_load_state()
        assert expected in flash(page, "error"), page.content()

    topics_form, groups_form = "form[action='/topics']", "form[action='/groups']"
    page.goto(f"{console}/topics")
    page.eval_on_selector(topics_form + " [name=name]", "e => e.removeAttribute('pattern')")  # the server must refuse
    page.locator(topics_form + " [name=name]").fill("bad name!")
    page.locator(topics_form + " button").click()
    page.wait_for_load_state()
    assert "ILLEGAL_TOPIC" in flash(page, "error")
    submit("/topics", topics_form, {"name": unique("t"), "queues": "many"}, "queues must be a whole number")
    submit("/topics", topics_form, {"name": unique("t"), "type": "sometimes"}, "sometimes")
    submit("/groups", groups_form, {"name": "%weird"}, "ILLEGAL_CONSUMER_GROUP")
    submit("/groups", groups_form, {"name": unique("g"), "max_attempts": "x"}, "max attempts must be a whole number")
    submit("/groups", groups_form, {"name": unique("g"), "consume_from": "yesterday"}, "yesterday")
    submit("/access", "#grant", {"access_key": "nobody", "resource": "queue:x", "actions": "PUB"}, "queue:x")
    submit("/access", "#grant", {"access_key": "nobody", "resource": "*", "actions": "FLY"}, "FLY")
    submit("/access", "#limit-set", {"name": "t", "messages_per_s": "-1"}, "must be 0 (no limit) or more")
    submit("/access", "#limit-set", {"name": "t", "messages_per_s": "fast"}, "messages per s must be a number")
    submit("/access", "#user-delete", {"access_key": "nobody-here"}, "user nobody-here does not exist")
    submit("/access", "#revoke", {"access_key": "nobody-here", "resource": "*"}, "has no such rule")
    submit("/access", "#limit-delete", {"namespace": "no-such-ns"}, "no such limit")

    visit(page, f"{console}/messages?topic={unique('gone')}", status=404)
    assert "TOPIC_NOT_FOUND" in flash(page, "error")
    topic = merged.create_topic(unique("t"))
    visit(page, f"{console}/messages?topic={topic}&from=last+week", status=400)
    assert "is not a time" in flash(page, "error")
    visit(page, f"{console}/messages?topic={topic}&from=2024-01-02T00:00:00Z&to=2024-01-01T00:00:00Z", status=400)
    assert "the time range is empty" in flash(page, "error")
    visit(page, f"{console}/messages?topic={topic}&id=0000NOSUCHID", status=404)
    assert "no message with id 0000NOSUCHID" in flash(page, "error")
    visit(page, f"{console}/groups/{unique('nogroup')}", status=404)
    assert "CONSUMER_GROUP_NOT_FOUND" in flash(page, "error")

    # A dead letter id that does not exist: nothing is resent (the form posted as the page would).
    group = merged.create_group(unique("g"))
    visit(page, f"{console}/dlq/{group}")
    status = _post_with_token(page, f"/dlq/{group}/resend", {"id": "01NOSUCHDEADLETTER"})
    assert status == 200
    assert "nothing was resent" in flash(page, "error")
    # Deleting without typing the name to confirm.
    visit(page, f"{console}/topics/{topic}")
    page.locator("form.danger button").click()
    page.wait_for_load_state()
    assert "to confirm its deletion" in flash(page, "error")

    assert {t["topic"] for t in merged.admin("topic", "list")} == topics_before | {topic}
    assert {g["group"] for g in merged.admin("group", "list")} == groups_before | {group}
    assert merged.admin("acl", "list") == acl_before


def _post_with_token(page: Any, path: str, fields: dict[str, str], token: str | None = "page") -> int:
    """POST a form from the page's own origin (with the page's CSRF token, another, or none); the status."""
    script = """async ([path, fields, token]) => {
        const body = new URLSearchParams(fields);
        const mine = document.querySelector("input[name=csrf]");
        if (token === "page" && mine) body.set("csrf", mine.value); else if (token) body.set("csrf", token);
        const r = await fetch(path, {method: "POST", body, redirect: "follow"});
        document.open(); document.write(await r.text()); document.close();
        return r.status;
    }"""
    status: int = page.evaluate(script, [path, fields, token])
    return status


def test_a_post_without_the_csrf_token_is_refused(merged: Cluster, page: Any, unique: Callable[[str], str]) -> None:
    name = unique("csrf")
    visit(page, f"{merged.console}/topics")
    assert _post_with_token(page, "/topics", {"name": name, "queues": "1"}, token=None) == 403
    assert "CSRF" in flash(page, "error")
    visit(page, f"{merged.console}/topics")
    assert _post_with_token(page, "/topics", {"name": name, "queues": "1"}, token="forged") == 403
    assert name not in {t["topic"] for t in merged.admin("topic", "list")}
    # The same form with the page's token goes through.
    visit(page, f"{merged.console}/topics")
    assert _post_with_token(page, "/topics", {"name": name, "queues": "1"}) == 200
    assert name in {t["topic"] for t in merged.admin("topic", "list")}


def test_with_auth_only_an_admin_user_logs_in_and_sees_users_rules_and_limits(tmp_path: Path, browser: Any) -> None:
    cluster = start_merged(tmp_path / "auth", extra_args=["--auth", "on"])
    try:
        cluster.admin("user", "create", "ops", "--secret", "ops-secret")
        cluster.admin("acl", "grant", "ops", "--resource", "*", "--actions", "ADMIN")
        cluster.admin("user", "create", "app", "--secret", "app-secret")
        cluster.admin("acl", "grant", "app", "--resource", "topic:orders", "--actions", "PUB,SUB")
        cluster.admin("limit", "set", "--topic", "orders", "--messages-per-s", "250")
        page = browser.new_page()
        try:
            visit(page, f"{cluster.console}/topics")  # redirected to the login page
            assert page.url.startswith(f"{cluster.console}/login")
            for key, secret, refusal in (("app", "app-secret", "has no admin rights"),
                                         ("ops", "wrong", "unknown user or wrong secret")):  # fmt: skip
                page.fill("[name=access_key]", key)
                page.fill("[name=secret]", secret)
                page.click("form[action='/login'] button")
                page.wait_for_load_state()
                assert refusal in flash(page, "error")
                assert page.url.startswith(f"{cluster.console}/login")
            page.fill("[name=access_key]", "ops")
            page.fill("[name=secret]", "ops-secret")
            page.click("form[action='/login'] button")
            page.wait_for_url(f"{cluster.console}/topics")
            assert page.locator("h1").inner_text() == "Topics"
            visit(page, f"{cluster.console}/access")
            assert {"ops", "app"} <= set(page.locator("#users").inner_text().split())
            rules = page.locator("#rules").inner_text()
            assert "topic:orders" in rules and "ADMIN" in rules
            assert "orders" in page.locator("#limits").inner_text() and "250" in page.locator("#limits").inner_text()
            assert "ops-secret" not in page.content()  # secrets are never shown
            page.screenshot(path=str(tmp_path / "access-auth.png"), full_page=True)
        finally:
            page.close()
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def test_the_dlq_cli_lists_resends_all_and_refuses_unknown_ids(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """Both topologies: in the separated one the dead letters sit on whichever broker held each message."""
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"), max_attempts=1)
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        ids = send_all(p, [message(topic, b"x%d" % i, keys=["dlq-key"]) for i in range(4)])
        receive_until(c, lambda got: len(got) >= 4, invisible_s=SHORT_INVISIBLE_S, ack=False)
        wait_for("the dead letters", lambda: len(cluster.admin("dlq", "list", group)["dead_letters"]) == 4)
        assert {r["group"]: r["dead_letters"] for r in cluster.admin("dlq", "list")}[group] == 4  # every group's
        listed = cluster.admin("message", "range", "--topic", topic, "--from", "0")
        assert sorted(m["message_id"] for m in listed) == sorted(ids)

        with pytest.raises(AdminError, match="nothing was resent"):
            cluster.admin("dlq", "resend", group, "--id", ids[0], "--id", "01NOSUCH")
        with pytest.raises(AdminError, match="ILLEGAL_TOPIC"):
            cluster.admin("dlq", "resend", group, "--all", "--to", "%bad")
        resent = cluster.admin("dlq", "resend", group, "--all")["resent"]
        assert sorted(r["message_id"] for r in resent) == sorted(ids)
        assert {r["topic"] for r in resent} == {topic}

        again = receive_until(c, lambda got: len(got) >= 4)
        assert sorted(m.properties.get("SLUICE_RESENT_FROM") for m in again) == sorted(ids)
        assert sorted(m.message_id for m in again) == sorted(r["new_message_id"] for r in resent)


def test_sluice_console_serves_any_cluster(cluster: Cluster, tmp_path: Path, unique: Callable[[str], str]) -> None:
    """`sluice console --namesrv --navigation` as a process of its own, against both topologies,
    read-only; its cluster page lists a proxy that joined the navigation server (by its endpoint),
    with its zone."""
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    nav_port, nav_http, proxy_port, port = free_port(), free_port(), free_port(), free_port()
    children = []
    try:
        for argv, listen, name in (
            ([*SLUICE, "navigation", "--port", str(nav_port), "--http-port", str(nav_http)], nav_port, "navigation"),
            ([*SLUICE, "proxy", "--port", str(proxy_port), "--namesrv", cluster.namesrv, "--navigation",
              f"{LOOPBACK}:{nav_port}", "--zone", "zone-7", "--proxy-id", "proxy-seen", "--workers", "1"],
             proxy_port, "proxy"),
            ([*SLUICE, "console", "--namesrv", cluster.namesrv, "--navigation", f"{LOOPBACK}:{nav_port}",
              "--port", str(port), "--read-only"], port, "console"),
        ):  # fmt: skip
            children.append(start_process(argv, port=listen, log_path=tmp_path / f"{name}.log", name=name,
                                        timeout_s=START_TIMEOUT_S))  # fmt: skip
        base = f"http://{LOOPBACK}:{port}"
        wait_for("the proxy on the cluster page", lambda: "zone-7" in _get(base + "/cluster"))
        assert f"{LOOPBACK}:{proxy_port}" in _get(base + "/cluster")
        listed = cluster.admin("proxy", "list", "--navigation", f"{LOOPBACK}:{nav_port}")  # the same, from the CLI
        assert [(p["proxy"], p["zone"], p["draining"]) for p in listed] == [("proxy-seen", "zone-7", False)]
        for path, expected in ((f"/topics?q={topic}", topic), (f"/topics/{topic}", "Queues"),
                               (f"/groups?q={group}", group), (f"/groups/{group}", "Per queue"),
                               ("/dlq", "Dead letters"), ("/access", "Users")):  # fmt: skip
            page = _get(base + path)
            assert expected in page, path
            assert "Create a topic" not in page and "Delete" not in page  # read-only: no forms
    finally:
        for child in reversed(children):
            child.stop()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200, url
        text: str = answer.read().decode()
        return text


def test_a_retried_message_shows_on_its_groups_page(merged: Cluster, page: Any, unique: Callable[[str], str]) -> None:
    topic = merged.create_topic(unique("t"))
    group = merged.create_group(unique("g"), max_attempts=5, consume_from="earliest")
    with producer_and_consumer(merged.endpoints, topic, group) as (p, c):
        send_all(p, [message(topic, b"flaky")])
        receive_until(c, lambda got: len(got) >= 1, invisible_s=SHORT_INVISIBLE_S, ack=False)  # not acked: retried
        (again,) = receive_until(c, lambda got: len(got) >= 1, invisible_s=int(WAIT_S), ack=False)
        assert again.delivery_attempt == 2
        visit(page, f"{merged.console}/groups/{group}")
        assert (page.locator("#retrying").inner_text(), page.locator("#in-flight").inner_text()) == ("1", "1")
        assert topic in page.locator("#per-topic").inner_text()
        assert merged.admin("group", "describe", group)["retrying"] == 1
        c.ack(again)


def test_a_topic_is_changed_from_its_page_with_the_clis_checks(
    merged: Cluster, page: Any, unique: Callable[[str], str]
) -> None:
    topic = merged.create_topic(unique("t"), queues=4)

    def change(queues: str, types: str, perm: str) -> None:
        visit(page, f"{merged.console}/topics/{topic}")
        page.fill("#update [name=queues]", queues)
        page.fill("#update [name=type]", types)
        page.select_option("#update [name=perm]", perm)
        page.click("#update button")
        page.wait_for_url(f"**/topics/{topic}")

    def described() -> tuple[int, set[str], set[str]]:
        rows = merged.admin("topic", "describe", topic)
        return len(rows), {r["types"] for r in rows}, {r["permission"] for r in rows}

    before = described()
    for queues, types, perm, refusal in (("2", "normal", "", "would strand the messages"),
                                         ("many", "normal", "", "queues must be a whole number"),
                                         ("6", "sometimes", "", "'sometimes' is not a message type"),
                                         ("6", "normal,lite", "", "lite and priority topics accept only")):  # fmt: skip
        change(queues, types, perm)
        assert refusal in flash(page, "error"), (queues, types)
    assert described() == before  # nothing changed
    change("6", "normal,delay", "r")
    assert "updated: queues 4 -> 6, types normal -> normal,delay" in flash(page, "ok")
    assert page.locator("#perm").inner_text() == "r"
    assert described() == (6, {"normal,delay"}, {"read"})


def test_read_only_offers_no_change_and_refuses_every_post(
    merged: Cluster, browser: Any, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """`sluice console --read-only` in Chromium: no page offers a form that changes anything, and a
    POST with the page's own CSRF token is refused (403) with nothing changed."""
    topic = merged.create_topic(unique("t"))
    group = merged.create_group(unique("g"))
    port = free_port()
    child = start_process([*SLUICE, "console", "--namesrv", merged.namesrv, "--port", str(port), "--read-only"],
                          port=port, log_path=tmp_path / "console.log", name="console",
                          timeout_s=START_TIMEOUT_S)  # fmt: skip
    page = browser.new_page()
    try:
        base = f"http://{LOOPBACK}:{port}"
        for path in ("/cluster", "/topics", f"/topics/{topic}", "/groups", f"/groups/{group}",
                     f"/messages?topic={topic}", "/dlq", f"/dlq/{group}", "/amqp", "/mqtt", "/access"):  # fmt: skip
            visit(page, base + path)
            assert page.locator("form[method=post]").count() == 0, path
            assert "read-only" in page.locator("header").inner_text(), path
        page.screenshot(path=str(tmp_path / "read-only-access.png"), full_page=True)
        visit(page, f"{base}/topics")
        for path, fields in (("/topics", {"name": unique("t"), "queues": "1"}),
                             (f"/topics/{topic}/delete", {"confirm": topic}),
                             (f"/topics/{topic}/update", {"queues": "8", "type": "normal", "perm": "r"}),
                             (f"/groups/{group}/delete", {"confirm": group}),
                             (f"/groups/{group}/reset-offset", {"topic": topic, "to": "latest", "confirm": "on"}),
                             (f"/dlq/{group}/resend", {"all": "on"}),
                             ("/access/users", {"access_key": "u", "secret": "s"})):  # fmt: skip
            assert _post_with_token(page, path, fields, token=_token(page, base)) == 403, path
            assert "read-only" in flash(page, "error")
        assert topic in {t["topic"] for t in merged.admin("topic", "list")}
        assert group in {g["group"] for g in merged.admin("group", "list")}
        assert {r["permission"] for r in merged.admin("topic", "describe", topic)} == {"read_write"}
    finally:
        page.close()
        child.stop()


def _token(page: Any, base: str) -> str:
    """The CSRF token of the page's session (every page carries it in a meta tag)."""
    visit(page, f"{base}/topics")
    token: str = page.locator("meta[name=csrf-token]").get_attribute("content")
    return token


@pytest.mark.parametrize("width", WIDTHS)
def test_pages_keep_identifiers_and_times_on_one_line_and_plot_with_axes(
    merged: Cluster, browser: Any, width: int
) -> None:
    """At 1280 and 1920 px: no identifier, figure or time wraps and, with names of a usual length,
    no table scrolls sideways on any page (with very long names a table scrolls, its cells still on
    one line); plots have a value axis with ticks and unit and a time axis; the cluster page shows
    the cluster's message rates."""
    topic = merged.create_topic(f"orders-eu-west-{uuid.uuid4().hex[:8]}")
    group = merged.create_group(f"billing-service-{uuid.uuid4().hex[:8]}", max_attempts=1, consume_from="earliest")
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    try:
        with producer_and_consumer(merged.endpoints, topic, group) as (p, c):
            visit(page, f"{merged.console}/cluster")  # the cluster is sampled from now on
            for burst in range(4):
                ids = send_all(p, [message(topic, b'{"order": %d}' % i, tag="new", keys=[f"key-{burst}-{i}"])
                                   for i in range(10)])  # fmt: skip
                receive_until(c, lambda got: len(got) >= 10, invisible_s=SHORT_INVISIBLE_S, ack=False)
                time.sleep(SAMPLE_INTERVAL_S)
            wait_for("dead letters", lambda: bool(merged.admin("dlq", "list", group)["dead_letters"]))

        def rates_shown() -> bool:
            page.reload()
            return "collecting" not in page.locator("#rates").inner_text()

        wait_for("the cluster's message rates", rates_shown)
        assert re.search(r"in [\d.]+ msg/s, out [\d.]+ msg/s", page.locator("#rates").inner_text())
        _assert_plots_have_axes(page, expected=2)
        visit(page, f"{merged.console}/topics/{topic}")  # watched from now on: the sampler adds points

        def topic_plotted() -> bool:
            # Views less than a second apart replace each other's point (console/history.py): look
            # again only after the sampler had its turn.
            time.sleep(2 * SAMPLE_INTERVAL_S)
            visit(page, f"{merged.console}/topics/{topic}")
            return page.locator("figure.chart svg").count() == 2

        wait_for("the topic's plots", topic_plotted)
        _assert_plots_have_axes(page, expected=2)
        visit(page, f"{merged.console}/messages?topic={topic}")
        assert page.locator("select[name=topic]").input_value() == topic  # a choice, not free text
        # The lists filtered to this test's names: the other tests of this module use very long ones.
        pages = ["/cluster", f"/topics?q={topic}", f"/topics/{topic}", f"/groups?q={group}", f"/groups/{group}",
                 f"/messages?topic={topic}", f"/messages/{topic}/{ids[0]}", f"/dlq?q={group}", f"/dlq/{group}",
                 "/amqp", "/mqtt", "/access"]  # fmt: skip
        wrapped, wide = [], []
        for path in pages:
            visit(page, merged.console + path)
            wrapped += [f"{path}: {cell}" for cell in page.evaluate(WRAPPED_CELLS_JS)]
            wide += [f"{path}: {table}" for table in page.evaluate(WIDE_TABLES_JS)]
        assert not wrapped, f"cells wrapped at {width} px:\n" + "\n".join(wrapped)
        assert not wide, f"tables wider than the page at {width} px:\n" + "\n".join(wide)
    finally:
        page.close()


def _assert_plots_have_axes(page: Any, expected: int) -> None:
    charts = page.locator("figure.chart svg")
    assert charts.count() == expected, page.locator(".charts").inner_text()
    for i in range(expected):
        svg = charts.nth(i)
        ticks = svg.locator("text.tick").all_text_contents()
        assert ticks[0] == "0" and len(ticks) == 6, ticks  # three values from 0, three times
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks[3:]), ticks
        assert svg.locator("text.unit").all_text_contents() == ["msg/s", "time (UTC)"]


def test_the_amqp_page_shows_queues_bindings_connections_and_channels(merged: Cluster, page: Any,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """What pika declared and does shows on /amqp as `sluice admin amqp` lists it: a queue's ready,
    unacked and consumers, its binding, the connection and its channels; `?vhost=` narrows it."""
    import pika

    host, port = merged.amqp[0].rsplit(":", 1)
    suffix = uuid.uuid4().hex[:8]
    exchange, queue = f"orders-x-{suffix}", f"orders-q-{suffix}"
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, "direct", durable=True)
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange, routing_key="new")
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish(exchange, "new", b"order %d" % i)
        visit(page, f"{merged.console}/amqp")  # the console reads the client reports before the consumer starts
        consuming = conn.channel()
        consuming.basic_qos(prefetch_count=2)
        consuming.basic_consume(queue, lambda *_: None)  # takes two, never acknowledges them

        def listed() -> bool:
            rows = [r for r in merged.admin("amqp", "queues") if r["name"] == queue]
            return bool(rows) and (rows[0]["ready"], rows[0]["unacked"], rows[0]["consumers"]) == (3, 2, 1)

        deadline = time.monotonic() + WAIT_S
        while not listed():
            assert time.monotonic() < deadline, merged.admin("amqp", "queues")
            conn.process_data_events(time_limit=0.3)
        # The page reads the proxies' reports as they are when it is asked for, as `sluice admin` did
        # just before: not the ones it (or its sampler) read before the consumer started.
        visit(page, f"{merged.console}/amqp")
        row = page.locator("#amqp-queues tr", has_text=queue).inner_text().split("\t")
        assert row[:5] == ["/", queue, "3", "2", "1"], row
        assert page.locator("#amqp-exchanges tr", has_text=exchange).inner_text().split("\t")[:3] == [
            "/", exchange, "direct"]  # fmt: skip
        assert [exchange, queue, "queue", "new"] == page.locator("#amqp-bindings tr", has_text=queue).inner_text(
            ).split("\t")[1:5]  # fmt: skip
        assert "Pika Python Client" in page.locator("#amqp-connections").inner_text()
        assert page.locator("#amqp-channels tbody tr").count() >= 2
        page.screenshot(path=str(tmp_path / "amqp.png"), full_page=True)
        visit(page, f"{merged.console}/amqp?vhost=%2F")
        assert page.locator("h1").inner_text() == "AMQP vhost /"
        visit(page, f"{merged.console}/amqp?vhost=elsewhere")
        assert queue not in page.locator("#amqp-queues").inner_text()
    finally:
        conn.close()


def test_the_mqtt_page_shows_clients_sessions_subscriptions_and_retained(merged: Cluster, page: Any,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    """A paho client's connection, persistent session, subscription and retained message show on
    /mqtt as `sluice admin mqtt` lists them."""
    from tests.e2e.support.mqtt import Paho

    cid = f"console-{uuid.uuid4().hex[:8]}"
    topic = f"console{uuid.uuid4().hex[:6]}/lamp"
    client = Paho(merged.mqtt[0], cid, clean=False, session_expiry=120)
    try:
        client.subscribe(f"{topic.split('/')[0]}/+", 1)
        client.publish(topic, "on", 1, retain=True)
        assert client.get().payload == b"on"
        wait_for(
            "the client in the reports", lambda: any(r["client_id"] == cid for r in merged.admin("mqtt", "clients"))
        )
        visit(page, f"{merged.console}/mqtt")
        assert cid in page.locator("#mqtt-clients").inner_text()
        assert page.locator("#mqtt-sessions tr", has_text=cid).inner_text().split("\t")[:4] == [cid, "", "5.0", "yes"]
        assert f"{topic.split('/')[0]}/+" in page.locator("#mqtt-subscriptions").inner_text()
        assert topic in page.locator("#mqtt-retained").inner_text()
        page.screenshot(path=str(tmp_path / "mqtt.png"), full_page=True)
    finally:
        client.disconnect()
