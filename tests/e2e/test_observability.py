"""Observability end to end, merged and separated: every metric family of docs/metrics.md is served
by the processes and the traffic-driven ones move when the official Python client produces and
consumes; the message trace of a message that was retried and dead-lettered; the log level changed
at runtime through the ops endpoint, and JSON log lines that carry the client's request id and
client id (a merged process of its own, started with `--log-json`).

Metrics are scraped over HTTP from every process of the cluster (`Cluster.ops`) and summed per
series, so the same assertions hold for one merged process and for the separated topology.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.e2e.support import raw
from tests.e2e.support.clients import message, producer, producer_and_consumer, send_all
from tests.e2e.support.cluster import SLUICE, Cluster, _child_env, start_merged
from tests.e2e.support.metrics import http, scrape, total
from tests.helpers.procs import REPO_ROOT

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
WAIT_S = 30.0
SHORT_INVISIBLE_S = 2
MESSAGES = 12

# Families that traffic has no reason to change (placeholders of features that register later,
# gauges that may legitimately read the same before and after, error counters).
STATIC = {
    "sluice_timer_pending_messages", "sluice_transaction_half_messages", "sluice_tier_upload_lag_messages",
    "sluice_tier_s3_errors_total", "sluice_trace_events_dropped_total", "sluice_metrics_series_dropped_total",
    "sluice_trace_pending_events", "sluice_store_dispatch_lag_bytes", "sluice_store_dispatch_lag_seconds",
    "sluice_store_unflushed_bytes", "sluice_store_commitlog_segments", "sluice_store_disk_used_bytes",
    "sluice_store_disk_total_bytes", "sluice_store_rocksdb_bytes", "sluice_proxy_in_flight_requests",
    "sluice_dead_lettered_messages_total",  # moves in the dead-letter test below
    "sluice_proxy_in_flight_bytes", "sluice_proxy_undecodable_requests_total",  # test_hostile_input.py
    # Broker groups only (tests/e2e/test_replication.py): this cluster has no etcd and no replicas.
    "sluice_replication_is_primary", "sluice_replication_epoch", "sluice_replication_lag_bytes",
    "sluice_replication_insync_members", "sluice_replication_failovers_total", "sluice_replication_fenced_writes_total",
    # LITE and PRIORITY topics only (tests/e2e/test_lite_topics.py, test_priority.py): this test sends to a normal one.
    "sluice_lite_topics", "sluice_lite_subscriptions", "sluice_lite_topics_expired_total", "sluice_priority_messages",
    # Merged nodes of `sluice up --shards N` only, and there it stays still when clients follow routes
    # (tests/e2e/test_shards.py checks that).
    "sluice_proxy_forwarded_calls_total",
    # Only when a receive finds nothing on the broker it names while another has messages (test_shards.py,
    # test_receive_anywhere.py).
    "sluice_proxy_balanced_messages_total",
    # AMQP queues only (tests/e2e/test_amqp.py checks them): this test uses the RocketMQ clients.
    "sluice_amqp_queue_ready_messages", "sluice_amqp_queue_unacked_messages", "sluice_amqp_queue_consumers",
    "sluice_amqp_queue_published_total", "sluice_amqp_queue_delivered_total", "sluice_amqp_queue_acked_total",
    "sluice_amqp_publishes_refused_total",  # an error counter (test_amqp.py's over-size publish moves it)
    # MQTT clients only (tests/e2e/test_mqtt.py, test_mqtt_conformance.py check them): this test uses
    # the RocketMQ clients.
    "sluice_mqtt_connections", "sluice_mqtt_subscriptions", "sluice_mqtt_inflight_messages",
    "sluice_mqtt_messages_total", "sluice_mqtt_payload_bytes_total", "sluice_mqtt_connects_total",
    "sluice_mqtt_refused_total",
}  # fmt: skip


def documented_families() -> set[str]:
    return set(re.findall(r"^\| `(sluice_[a-z0-9_]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE))


def test_every_metric_family_is_present_and_moves(cluster: Cluster, unique: Callable[[str], str]) -> None:
    documented = documented_families()
    assert len(documented) >= 25, "docs/metrics.md lists the families in its table"
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    _, before = scrape(cluster)
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        send_all(p, [message(topic, b"m" * 100) for _ in range(MESSAGES)])
        held = []
        deadline = time.monotonic() + WAIT_S
        while len(held) < MESSAGES and time.monotonic() < deadline:
            held += c.receive(MESSAGES - len(held), 60)
        assert len(held) == MESSAGES, f"received {len(held)} of {MESSAGES}"
        names, during = scrape(cluster)
        for m in held:
            c.ack(m)
        # Internal RPCs: in the merged topology the data path is in-process; admin calls are not.
        cluster.admin("group", "describe", group)
        _, after = scrape(cluster)

    missing = documented - names
    assert not missing, f"documented families not served: {sorted(missing)}"
    undocumented = {n for n in names if n not in documented}
    assert not undocumented, f"families served but not in docs/metrics.md: {sorted(undocumented)}"

    # Gauges while the messages are held: lag and in-flight of this group, connected clients.
    assert total(during, "sluice_consumer_lag_messages", group=group, topic=topic) == MESSAGES
    assert total(during, "sluice_consumer_inflight_messages", group=group, topic=topic) == MESSAGES
    assert total(during, "sluice_proxy_connected_clients", language="PYTHON") >= 2
    assert total(after, "sluice_store_disk_total_bytes") > 0
    assert total(after, "sluice_store_rocksdb_bytes") > 0

    moved = {
        "sluice_messages_in_total": ({"topic": topic}, MESSAGES),
        "sluice_message_bytes_in_total": ({"topic": topic}, MESSAGES * 100),
        "sluice_messages_out_total": ({"topic": topic, "group": group}, MESSAGES),
        "sluice_message_bytes_out_total": ({"topic": topic, "group": group}, MESSAGES * 100),
        "sluice_messages_acked_total": ({"topic": topic, "group": group}, MESSAGES),
        "sluice_proxy_rpc_requests_total": ({"rpc": "SendMessage", "code": "OK"}, MESSAGES),
        "sluice_proxy_rpc_duration_seconds_count": ({"rpc": "AckMessage"}, MESSAGES),
    }
    for name, (labels, at_least) in moved.items():
        delta = total(after, name, **labels) - total(before, name, **labels)
        assert delta >= at_least, f"{name}{labels} moved by {delta}, expected at least {at_least}"
    receive_ok = total(after, "sluice_proxy_rpc_requests_total", rpc="ReceiveMessage", code="OK")
    assert receive_ok > total(before, "sluice_proxy_rpc_requests_total", rpc="ReceiveMessage", code="OK")
    # Families whose movement is not tied to this test's labels: any change counts.
    for name in sorted(documented - STATIC - set(moved) - {
        "sluice_consumer_lag_messages", "sluice_consumer_inflight_messages", "sluice_proxy_connected_clients",
    }):  # fmt: skip
        sample = name + "_count" if name.endswith("_seconds") else name
        assert total(after, sample) > total(before, sample), f"{sample} did not move with traffic"
    # After the acks nothing of this group is pending.
    assert total(after, "sluice_consumer_lag_messages", group=group, topic=topic) == 0


def _trace(cluster: Cluster, message_id: str) -> dict:  # type: ignore[type-arg]
    doc: dict = cluster.admin("message", "trace", "--id", message_id)  # type: ignore[type-arg]
    return doc


def test_trace_of_a_retried_and_dead_lettered_message(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"), max_attempts=2, retry_policy="customized:1000")
    _, before = scrape(cluster)
    with producer_and_consumer(cluster.endpoints, topic, group) as (p, c):
        (message_id,) = send_all(p, [message(topic, b"poison")])
        producer_id = p.client_id
        attempts = []
        deadline = time.monotonic() + WAIT_S
        while len(attempts) < 2 and time.monotonic() < deadline:
            attempts += [m.delivery_attempt for m in c.receive(1, SHORT_INVISIBLE_S)]  # never acked
        assert attempts == [1, 2]

    deadline = time.monotonic() + WAIT_S
    while True:
        doc = _trace(cluster, message_id)
        if any(e["event"] == "dead_lettered" for e in doc["events"]) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    own = [e for e in doc["events"] if e["topic"] == topic]
    assert [(e["event"], e["attempt"]) for e in own] == [
        ("sent", 0), ("delivered", 1), ("delivered", 2), ("dead_lettered", 2),
    ], doc  # fmt: skip
    sent = own[0]
    assert sent["client_id"] == producer_id
    assert {own[i]["group"] for i in (1, 2, 3)} == {group}
    assert own[3]["detail"]["dlq_topic"] == f"%DLQ%{group}"
    assert doc["groups"][group] == {"deliveries": 2, "acked": False, "dead_lettered": True,
                                    "dlq_topic": f"%DLQ%{group}"}  # fmt: skip
    assert [e["time_ms"] for e in doc["events"]] == sorted(e["time_ms"] for e in doc["events"])

    # The readable timeline (no --json): one line per event and the per-group summary.
    table = subprocess.run(
        [*SLUICE, "admin", "--namesrv", cluster.namesrv, "message", "trace", "--id", message_id],
        cwd=REPO_ROOT,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["TIME", "EVENT", "BROKER"]
    assert [ln.split()[1] for ln in lines[1:5]] == ["sent", "delivered", "delivered", "dead_lettered"]
    assert f"group {group}: delivered 2x, dead-lettered" in table.stdout

    _, after = scrape(cluster)
    assert total(after, "sluice_dead_lettered_messages_total") > total(before, "sluice_dead_lettered_messages_total")


def test_trace_of_an_unknown_message_is_a_clear_error(cluster: Cluster) -> None:
    done = subprocess.run(
        [*SLUICE, "admin", "--namesrv", cluster.namesrv, "message", "trace", "--id", "0" * 32],
        cwd=REPO_ROOT,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("sluice admin: message trace: MESSAGE_NOT_FOUND: no trace of message"), done.stderr


def test_log_level_changes_at_runtime(cluster: Cluster) -> None:
    for name, address in cluster.ops.items():
        status, body = http(address, "/loglevel", "PUT", b"debug")
        assert (status, json.loads(body)) == (200, {"level": "debug"}), name
        assert json.loads(http(address, "/loglevel")[1]) == {"level": "debug"}
        status, body = http(address, "/loglevel", "PUT", b'{"level": "loud"}')
        assert status == 400 and "use debug, info, warning or error" in json.loads(body)["error"]
        status, body = http(address, "/loglevel", "PUT", b'{"level": "info"}')
        assert (status, json.loads(body)) == (200, {"level": "info"}), name


def test_json_log_lines_carry_the_request_and_client_ids(tmp_path: Path, unique: Callable[[str], str]) -> None:
    cluster = start_merged(tmp_path / "json-logs", extra_args=["--log-json"])
    try:
        ((name, ops),) = cluster.ops.items()
        topic = cluster.create_topic(unique("t"))
        assert http(ops, "/loglevel", "PUT", b"debug")[0] == 200  # per-RPC lines are debug
        with producer(cluster.endpoints, topic) as p:
            send_all(p, [message(topic, b"logged")])
            client_id = p.client_id
        child = cluster.processes[name]
        deadline = time.monotonic() + WAIT_S
        while True:
            lines = [json.loads(ln) for ln in child.output().splitlines() if ln.startswith("{")]
            sends = [d for d in lines if d.get("msg") == "rpc answered" and d.get("rpc") == "SendMessage"]
            if sends or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert sends, f"no SendMessage line in {child.log_path}"
        line = sends[0]
        assert (line["level"], line["code"], line["client_id"]) == ("debug", "OK", client_id)
        assert len(line["request_id"]) >= 8  # the client's x-mq-request-id (a UUID)
        change = next(d for d in lines if d.get("msg") == "log level changed")
        assert "request_id" not in change  # not logged on behalf of a client request
    finally:
        problems = cluster.stop()
    assert not problems, problems


def test_rpc_counts_carry_the_answer_code(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """A send to a topic that does not exist is counted under its code, TOPIC_NOT_FOUND."""
    missing = unique("missing")
    labels = {"rpc": "SendMessage", "code": "TOPIC_NOT_FOUND"}
    _, before = scrape(cluster)
    with raw.stub(cluster.first_proxy) as s:
        answer = raw.send(s, raw.message(missing), raw.message(missing))
    assert raw.code_name(answer.status.code) == "TOPIC_NOT_FOUND"
    _, after = scrape(cluster)
    assert (
        total(after, "sluice_proxy_rpc_requests_total", **labels)
        == total(before, "sluice_proxy_rpc_requests_total", **labels) + 1
    )
