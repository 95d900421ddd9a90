"""The official Node.js client (`rocketmq-client-nodejs`, pinned in tests/e2e/node/package.json) sends
and receives against the same server as the Python client, in both topologies.

Set-up installs the package with npm into tests/e2e/node/node_modules (git-ignored); if npm cannot
install it (no network, no npm), the tests are skipped with the reason. The Node client is given a
single proxy: it joins several `;`-separated addresses into one grpc-js target, which is not valid.

The module runs its own clusters (both topologies, started once), configured by NODE_CONFIG:
- the push consumers' long polling (`[proxy.settings] long_polling_timeout_s`, 20 s by default) is
  3 s: the Node LitePushConsumer's shutdown waits for its receives in flight, up to the request
  timeout plus that long poll, so each shutdown took ~21 s of the module's time, and 4 s with it;
- a half message's first check-back (`[broker.transaction] default_recovery_ms`, 6 s) is 2 s.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rocketmq import FilterExpression

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster, start_merged, start_separated

NODE_DIR = Path(__file__).resolve().parent / "node"
PACKAGE = "rocketmq-client-nodejs"
INSTALL_TIMEOUT_S = 300.0
SCRIPT_TIMEOUT_S = 120.0
NODE_CONFIG = """\
[proxy.settings]
long_polling_timeout_s = 3

[broker.transaction]
default_recovery_ms = 2000
"""


def start_node_cluster(kind: str, root: Path, *, shards: int = 2) -> Cluster:
    """A cluster of `kind` configured by NODE_CONFIG: `shards` merged nodes (two, as the shared
    cluster), or two brokers and two proxies."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "node.toml"
    config.write_text(NODE_CONFIG)
    if kind == "merged":
        return start_merged(root, shards=shards, extra_args=["--config", str(config)])
    return start_separated(root, config=config)


@pytest.fixture(scope="module", params=["merged", "separated"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """This module's clusters (see the module's docstring), in place of the shared ones."""
    started = start_node_cluster(request.param, tmp_path_factory.mktemp(f"node-{request.param}"))
    try:
        yield started
    finally:
        assert not started.stop()


def _pinned_version() -> str:
    return str(json.loads((NODE_DIR / "package.json").read_text())["dependencies"][PACKAGE])


def _installed_version() -> str | None:
    manifest = NODE_DIR / "node_modules" / PACKAGE / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def node() -> str:
    """The `node` executable, with the pinned client installed next to the script."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        pytest.skip("Node.js and npm are needed to run the official Node.js client")
    if _installed_version() != _pinned_version():
        try:
            proc = subprocess.run([npm_bin, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                                  capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm install of {PACKAGE} did not finish within {INSTALL_TIMEOUT_S:g} s (no network?)")
        if proc.returncode != 0:
            head = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[:4])
            pytest.skip(f"npm install of {PACKAGE}@{_pinned_version()} failed (no network?): {head}")
    assert _installed_version() == _pinned_version()
    return node_bin


def run_node(node: str, script: str = "send_and_receive.js", **options: Any) -> dict[str, Any]:
    proc = subprocess.run([node, script, json.dumps(options)], cwd=NODE_DIR, capture_output=True,
                          text=True, timeout=SCRIPT_TIMEOUT_S, check=False)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{") and '"error"' in line]
    assert lines, f"node exited {proc.returncode} without a result; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["error"] is None, f"node client failed: {result['error']}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, proc.stderr
    return result


def test_node_client_sends_and_receives(cluster: Cluster, unique: Callable[[str], str], node: str) -> None:
    topic = cluster.create_topic(unique("t"), queues=4)
    node_group = cluster.create_group(unique("node"))
    python_group = cluster.create_group(unique("py"))
    # The largest body the proxy allows still fits the Node client's 4 MiB frame limit.
    limit = raw.advertised_settings(cluster.first_proxy, topic).publishing.max_body_size
    python_bodies = [f"from-python-{i}".encode() for i in range(3)] + [b"L" * limit]
    with producer(cluster.endpoints, topic) as p:
        python_ids = send_all(p, [message(topic, body, tag="FromPython", keys=[f"py-key-{i}"],
                                          properties={"client": "python"})
                                  for i, body in enumerate(python_bodies)])  # fmt: skip

    result = run_node(node, endpoints=cluster.first_proxy, topic=topic, group=node_group, count=4,
                      expect=python_ids, timeoutMs=60_000)  # fmt: skip

    node_sent = {s["messageId"]: s["body"] for s in result["sent"]}
    received = {r["messageId"]: r for r in result["received"]}
    assert len(node_sent) == 4
    assert set(received) == set(node_sent) | set(python_ids)
    assert len(result["received"]) == len(received)  # each once
    for r in received.values():
        assert r["topic"] == topic
        assert r["corrupted"] is False  # Node verifies the MD5 digest the server sends
        assert r["deliveryAttempt"] == 1
        if r["messageId"] in node_sent:
            assert r["body"] == node_sent[r["messageId"]]
            assert r["tag"] == "FromNode"
            assert r["properties"] == {"index": r["body"].rsplit("-", 1)[1], "client": "nodejs"}
        else:
            i = python_ids.index(r["messageId"])
            assert r["bodyLength"] == len(python_bodies[i])
            assert r["body"] in (None, python_bodies[i].decode())
            assert r["tag"] == "FromPython"
            assert r["keys"] == [f"py-key-{i}"]
            assert r["properties"] == {"client": "python"}

    # What Node sent, a Python consumer reads too (another group: its own copy of everything).
    with simple_consumer(cluster.endpoints, python_group, {topic: FilterExpression("FromNode")}) as c:
        got = receive_count(c, len(node_sent))
    assert {m.message_id: m.body.decode() for m in got} == node_sent
    for m in got:
        index = m.body.decode().rsplit("-", 1)[1]
        assert m.keys == {f"node-key-{index}"}
        assert m.properties == {"index": index, "client": "nodejs"}
        assert not m.corrupted


def test_node_client_transactions(cluster: Cluster, unique: Callable[[str], str], node: str) -> None:
    """Commit, rollback and a check-back answered by the Node client's TransactionChecker (first check-back
    after 2 s, NODE_CONFIG)."""
    topic = cluster.create_topic(unique("tx"), "transaction", queues=2)
    group = cluster.create_group(unique("node-tx"))
    result = run_node(node, "transactions.js", endpoints=cluster.first_proxy, topic=topic, group=group,
                      timeoutMs=90_000)  # fmt: skip
    assert sorted(r["body"] for r in result["received"]) == ["node-commit", "node-orphan"], "each once"
    assert not any(r["corrupted"] for r in result["received"])
    orphan = next(r for r in result["received"] if r["body"] == "node-orphan")
    assert {"messageId": orphan["messageId"], "body": "node-orphan", "topic": topic} in result["checked"]


def test_node_client_lite_push_consumer_and_priority(cluster: Cluster, unique: Callable[[str], str],
                                                     node: str) -> None:  # fmt: skip
    """LitePushConsumer (subscribe, receive only subscribed lite topics in order, unsubscribe) and
    priority sends received most urgent first per broker (docs/lite-topics.md, docs/priority.md)."""
    lite_topic = unique("lite")
    cluster.admin("topic", "create", lite_topic, "--type", "lite", "--queues", str(len(cluster.brokers)))
    priority_topic = unique("prio")
    cluster.admin("topic", "create", priority_topic, "--type", "priority", "--queues", "2")
    per_lite = 5
    result = run_node(node, "lite_and_priority.js", endpoints=cluster.first_proxy, liteTopic=lite_topic,
                      liteGroup=cluster.create_group(unique("node-lite")), priorityTopic=priority_topic,
                      priorityGroup=cluster.create_group(unique("node-prio"), consume_from="earliest"),
                      perLite=per_lite, timeoutMs=90_000)  # fmt: skip

    by_lite: dict[str, list[str]] = {}
    for r in result["lite"]:
        by_lite.setdefault(r["liteTopic"], []).append(r["body"])
    assert set(by_lite) == {"a", "b"}, "only the subscribed lite topics, never c"
    assert by_lite["b"] == [f"b-{i}" for i in range(per_lite)], "each lite topic in order, b nothing after unsubscribe"
    assert by_lite["a"] == [f"a-{i}" for i in range(per_lite)] + ["a-after"]
    assert result["liteTopicSet"] == ["a"]

    got = result["priority"]
    assert sorted(r["body"] for r in got) == sorted(f"p{i}" for i in range(30))
    by_broker: dict[str, list[int]] = {}
    for r in got:
        assert r["priority"] == 1 + int(r["body"][1:]) % 9, "a received message carries its priority"
        by_broker.setdefault(r["handle"].split("~", 1)[0], []).append(r["priority"])
    for levels in by_broker.values():
        assert levels == sorted(levels, reverse=True), levels


LITE_TOPIC_QUOTA_EXCEEDED = 42901
EXPIRY_WAIT_S = 30.0  # bounded; expiry after 4 s, swept every second


def lite_topic(cluster: Cluster, name: str, *extra: str) -> str:
    cluster.admin("topic", "create", name, "--type", "lite", "--queues", str(len(cluster.brokers)), *extra)
    return name


def test_node_client_lite_quotas(cluster: Cluster, unique: Callable[[str], str], node: str) -> None:
    """Quotas with the Node.js LitePushConsumer and Producer: the consumer takes the server's
    subscription quota and lite topic name size from its settings; subscribing to, or sending to,
    more lite topics than the bind topic may hold on a broker is refused with
    LITE_TOPIC_QUOTA_EXCEEDED (42901; the producer's LiteTopicQuotaExceededException), and a refused
    subscription is not in the consumer's set.

    Not covered here: the server's LITE_SUBSCRIPTION_QUOTA_EXCEEDED (42902). rocketmq-client-nodejs
    1.0.8's LitePushConsumer checks its own set against `Settings.lite_subscription_quota` before
    every subscribeLite (its LiteSubscriptionManager throws a ClientException 429 of its own) and
    subscribes one lite topic per request, so it reaches the server's check only after 10,000
    subscribe requests; that refusal is covered with raw requests (test_lite_topics.py)."""
    topic = lite_topic(cluster, unique("t"), "--max-lite-topics", "3")
    result = run_node(node, "lite_limits.js", mode="quota", endpoints=cluster.first_proxy, liteTopic=topic,
                      liteGroup=cluster.create_group(unique("g")), timeoutMs=60_000)  # fmt: skip
    assert result["settings"] == {"liteSubscriptionQuota": 10_000, "maxLiteTopicSize": 64}
    room = 3 * len(cluster.brokers)
    subscribed = [s["name"] for s in result["subscribed"] if s["ok"]]
    refused = [s for s in result["subscribed"] if not s["ok"]]
    assert 3 <= len(subscribed) <= room, result["subscribed"]
    assert refused and all(s["code"] == LITE_TOPIC_QUOTA_EXCEEDED for s in refused), refused
    assert result["liteTopicSet"] == sorted(subscribed), "a refused subscription is not the client's"
    refused_sends = [s for s in result["sent"] if not s["ok"]]
    assert len(refused_sends) >= len(result["sent"]) - (room - len(subscribed)), result["sent"]
    for s in refused_sends:
        assert (s["code"], s["exception"]) == (LITE_TOPIC_QUOTA_EXCEEDED, "LiteTopicQuotaExceededException"), s
    assert cluster.admin("lite", "list", topic)["lite_topics"] == len(subscribed) + len(result["sent"]) - len(
        refused_sends
    ), "nothing refused was stored"


def test_node_client_lite_expiry(cluster: Cluster, unique: Callable[[str], str], node: str) -> None:
    """A lite topic the Node.js LitePushConsumer subscribed to expires (4 s without a message): the
    server removes it with its subscription and sends NotifyUnsubscribeLiteCommand on the client's
    Telemetry stream (checked with raw requests in test_lite_topics.py), and the client keeps working.

    What the Node client does with the notification is not checked: rocketmq-client-nodejs 1.0.8's
    TelemetrySession handles settings, orphaned transactions, verify, stack trace and reconnect
    commands only; a NOTIFY_UNSUBSCRIBE_LITE_COMMAND goes to its default branch ("Receive
    unrecognized command"), so LitePushConsumerImpl.onNotifyUnsubscribeLiteCommand is never called
    and the expired name stays in getLiteTopicSet() (recorded as `liteTopicSetAfter`)."""
    topic = lite_topic(cluster, unique("t"), "--lite-expiration", "4s")  # 4 s: room for the admin call below
    options = {"mode": "expiry", "endpoints": cluster.first_proxy, "liteTopic": topic,
               "liteGroup": cluster.create_group(unique("g")), "timeoutMs": 60_000}  # fmt: skip
    with node_script(node, "lite_limits.js", options) as proc:
        _result_line(proc, "stage")
        assert cluster.admin("lite", "list", topic)["lite_topics"] == 1
        deadline = time.monotonic() + EXPIRY_WAIT_S
        while cluster.admin("lite", "list", topic)["lite_topics"]:
            assert time.monotonic() < deadline, "the lite topic did not expire"
            time.sleep(0.5)
        result = _finish(proc)
    assert result["liteTopicSet"] == ["short-lived"]
    assert [r["body"] for r in result["received"]] == ["next-1"], "the consumer outlived the notification"


@pytest.mark.parametrize("kind", ["merged", "separated"])
def test_node_client_lite_resync_after_a_proxy_restart(kind: str, tmp_path: Path, unique: Callable[[str], str],
                                                       node: str) -> None:  # fmt: skip
    """After its proxy restarts (merged: the whole process), the Node.js LitePushConsumer's
    periodic COMPLETE_ADD (every 30 s) through the new proxy restores its subscriptions: the test
    drops them on the server (a COMPLETE_REMOVE under the client's id) once the proxy is back, and a
    message to its lite topic still arrives. A cluster of its own: the restart would disturb the
    module's. One merged shard: the restart is then of the one `sluice up` process."""
    cluster = start_node_cluster(kind, tmp_path, shards=1)
    try:
        topic = lite_topic(cluster, unique("t"))
        group = cluster.create_group(unique("g"))
        options = {"mode": "resync", "endpoints": cluster.first_proxy, "liteTopic": topic, "liteGroup": group,
                   "timeoutMs": 110_000}  # fmt: skip
        with node_script(node, "lite_limits.js", options) as proc:
            ready = json.loads(_result_line(proc, "stage"))
            proxy = cluster.proxy_process(cluster.first_proxy) if kind == "separated" else next(iter(cluster.processes))
            cluster.restart(proxy)
            request = raw.spb.SyncLiteSubscriptionRequest(action=raw.pb.COMPLETE_REMOVE, topic=raw.resource(topic),
                                                          group=raw.resource(group))  # fmt: skip
            with raw.stub(cluster.first_proxy) as s:
                response = s.SyncLiteSubscription(request, metadata=raw.headers(client_id=ready["clientId"]),
                                                  timeout=raw.RPC_TIMEOUT_S)  # fmt: skip
            assert raw.code_name(response.status.code) == "OK"
            result = _finish(proc)
        assert [r["body"] for r in result["received"]] == ["before", "after"]
        assert result["liteTopicSet"] == ["keep"]
    finally:
        assert not cluster.stop()


@contextlib.contextmanager
def node_script(node: str, script: str, options: dict[str, Any]) -> Iterator[subprocess.Popen[str]]:
    """A Node script that pauses for the test (it reads a line from stdin); killed if still running
    at the end."""
    proc = subprocess.Popen([node, script, json.dumps(options)], cwd=NODE_DIR, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=SCRIPT_TIMEOUT_S)


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Let a paused Node script go on; its result, which must hold no error."""
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result: dict[str, Any] = json.loads(_result_line(proc, "error"))
    assert result["error"] is None, f"node client failed: {result['error']}"
    return result


def _result_line(proc: subprocess.Popen[str], key: str) -> str:
    """The next stdout line of a running Node script that is a JSON object holding `key` (bounded
    by the script's own deadline: it prints its result and exits when that passes)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{") and f'"{key}"' in line:
            return line
    stderr = proc.stderr.read() if proc.stderr is not None else ""
    raise AssertionError(f"node exited {proc.wait()} without a {key} line; stderr:\n{stderr}")
