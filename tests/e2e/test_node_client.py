"""The official Node.js client (`rocketmq-client-nodejs`, pinned in tests/e2e/node/package.json) sends
and receives against the same server as the Python client, in both topologies.

Set-up installs the package with npm into tests/e2e/node/node_modules (git-ignored); if npm cannot
install it (no network, no npm), the tests are skipped with the reason. The Node client is given a
single proxy: it joins several `;`-separated addresses into one grpc-js target, which is not valid.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rocketmq import FilterExpression

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, receive_count, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster

NODE_DIR = Path(__file__).resolve().parent / "node"
PACKAGE = "rocketmq-client-nodejs"
INSTALL_TIMEOUT_S = 300.0
SCRIPT_TIMEOUT_S = 120.0


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
    after the broker's default 6 s)."""
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
