"""`sluice bench` as a real child process against `sluice up` (and the echo server) on loopback.

A functional check that keeps the load generator from rotting — not a performance test: it asserts
no timing thresholds, only that short runs (~2 s) finish by themselves, report sane JSON (a mode,
the measured time, message counts and ordered latency percentiles) and count no errors. Covers
produce with batches, consume (receive + one ack per batch) of that backlog, e2e, and echo.
Every process is stopped by PID; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.broker_fixtures import SLUICE_ARGV
from tests.helpers.procs import LOOPBACK, REPO_ROOT, ChildProcess, free_port, start_process

pytestmark = pytest.mark.slow

TOPIC = "bench-cli"
GROUP = "bench-cli-group"
RUN_S = 2.0
COMMAND_TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0


@dataclass
class Merged:
    child: ChildProcess
    endpoint: str
    namesrv: str
    metrics_port: int


def run_sluice(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([*SLUICE_ARGV, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, check=False)  # fmt: skip


def bench_json(mode: str, endpoint: str, *args: str) -> dict[str, Any]:
    done = run_sluice("bench", mode, "--endpoint", endpoint, "--duration", str(RUN_S), "--warmup", "0.5", "--json",
                      *args)  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "msg/s" in done.stderr  # the progress lines
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["mode"] == mode
    assert result["error_total"] == 0, result
    assert not result["stopped_early"]
    assert 0.8 * RUN_S <= result["measured_s"] <= RUN_S + 0.5
    return result


def assert_sane(meter: dict[str, Any]) -> None:
    assert meter["messages"] > 0 and meter["calls"] > 0
    assert meter["messages_per_s"] > 0
    assert meter["errors"] == {} and meter["error_total"] == 0
    lat = meter["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Merged]:
    """`sluice up --shards 2`: clients bootstrap at one port, the routes name both shards."""
    root: Path = tmp_path_factory.mktemp("bench-cli")
    port, ns_port, broker_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    argv = [*SLUICE_ARGV, "up", "--shards", "2", "--data-dir", str(root / "data"), "--port", str(port),
            "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--metrics-port", str(metrics_port),
            "--flush", "async", "--log-level", "warning", "--console-port", "-1", "--amqp-port", "-1",
            "--mqtt-port", "-1"]  # fmt: skip
    child = start_process(argv, port=port, log_path=root / "up.log", name="sluice-up", timeout_s=START_TIMEOUT_S)
    try:
        namesrv = f"{LOOPBACK}:{ns_port}"
        for args in (("topic", "create", TOPIC, "--queues", "4"),
                     ("group", "create", GROUP, "--consume-from", "earliest")):  # fmt: skip
            done = run_sluice("admin", "--namesrv", namesrv, *args)
            assert done.returncode == 0, done.stderr
        yield Merged(child, f"{LOOPBACK}:{port}", namesrv, metrics_port)
    finally:
        child.stop()


@pytest.mark.parametrize(("generator", "name"), [("http2", "http2"), ("grpc", "grpc.aio")])
def test_produce_then_consume(merged: Merged, generator: str, name: str) -> None:
    produced = bench_json("produce", merged.endpoint, "--topic", TOPIC, "--batch", "8", "--concurrency", "4", "--max",
                          "--generator", generator)  # fmt: skip
    assert produced["generator"] == name
    send = produced["meters"]["send"]
    assert_sane(send)
    assert send["messages"] == 8 * send["calls"]
    assert produced["options"]["batch"] == 8 and produced["options"]["rate_per_s"] is None

    consumed = bench_json("consume", merged.endpoint, "--topic", TOPIC, "--group", GROUP, "--concurrency", "2",
                          "--long-poll", "0.5", "--generator", generator)  # fmt: skip
    assert consumed["generator"] == name
    receive, ack = consumed["meters"]["receive"], consumed["meters"]["ack"]
    assert_sane(receive)
    assert_sane(ack)
    assert ack["messages"] <= receive["messages"]
    # No more than was produced, warm-up included: every SendMessage call (counted when made) carried 8.
    produced_total = 8 * sum(produced["calls_per_endpoint"].values())
    assert send["messages"] <= produced_total
    assert receive["messages"] <= produced_total


def test_e2e_at_a_rate(merged: Merged) -> None:
    result = bench_json("e2e", merged.endpoint, "--topic", TOPIC, "--group", "bench-cli-e2e", "--rate", "200",
                        "--concurrency", "2", "--consumers", "2", "--long-poll", "0.5")  # fmt: skip
    assert_sane(result["meters"]["send"])
    assert 100 <= result["meters"]["send"]["messages_per_s"] <= 300  # paced, not flat out
    assert_sane(result["meters"]["e2e"])


def test_the_bench_follows_routes_to_the_shard_owning_each_queue(merged: Merged) -> None:
    """Bootstrapped at the one port of `sluice up --shards 2`: sends and receives go to the endpoint
    of their queue's shard, as the official clients send them, so no call reaches the wrong shard;
    `--ignore-routes` keeps every call on the endpoint given (shard-0 forwards shard-1's receives)."""
    topic, group = "bench-routes", "bench-routes-group"
    for args in (("topic", "create", topic, "--queues", "4"), ("group", "create", group, "--consume-from", "earliest")):
        done = run_sluice("admin", "--namesrv", merged.namesrv, *args)
        assert done.returncode == 0, done.stderr
    produced = bench_json("produce", merged.endpoint, "--topic", topic, "--batch", "8", "--concurrency", "4", "--max")
    consumed = bench_json("consume", merged.endpoint, "--topic", topic, "--group", group, "--concurrency", "2",
                          "--long-poll", "0.5")  # fmt: skip
    for result in (produced, consumed):
        calls = result["calls_per_endpoint"]
        assert len(calls) == 2 and all(calls.values()), calls  # both shards, through the one port given
    assert misrouted(merged.metrics_port) == {}
    pinned = bench_json("consume", merged.endpoint, "--topic", topic, "--group", group, "--concurrency", "2",
                        "--long-poll", "0.5", "--ignore-routes")  # fmt: skip
    assert list(pinned["calls_per_endpoint"]) == [merged.endpoint]
    assert misrouted(merged.metrics_port).get("pop", 0) > 0  # shard-0 passed shard-1's receives on


def misrouted(metrics_port: int) -> dict[str, float]:
    """Calls a shard forwarded because they reached the wrong one, by call, summed over the shards
    (docs/shards.md): `sluice_proxy_forwarded_calls_total` without the balancing a receive does when
    its own shard has nothing left (`pop_elsewhere`, as many acks as it served messages, and the
    releases of what a long poll that lost the race popped: `change_invisible_duration`, which the
    bench itself never calls)."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    calls: dict[str, float] = {}
    balanced = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluice_proxy_forwarded_calls_total":
                call = sample.labels.get("call", "")
                calls[call] = calls.get(call, 0.0) + sample.value
            elif sample.name == "sluice_proxy_balanced_messages_total":
                balanced += sample.value
    calls.pop("pop_elsewhere", None)
    calls.pop("change_invisible_duration", None)
    calls["ack"] = max(0.0, calls.get("ack", 0.0) - balanced)
    return {call: n for call, n in calls.items() if n}


def test_echo_server_and_client(tmp_path: Path) -> None:
    port = free_port()
    child = start_process([*SLUICE_ARGV, "bench", "echo-server", "--port", str(port)], port=port,
                          log_path=tmp_path / "echo.log", name="echo-server")  # fmt: skip
    try:
        result = bench_json("echo", f"{LOOPBACK}:{port}", "--batch", "32", "--concurrency", "2")
        assert_sane(result["meters"]["echo"])
        assert result["meters"]["echo"]["messages"] == 32 * result["meters"]["echo"]["calls"]
    finally:
        assert child.stop() == 0


def test_bad_arguments_and_missing_server() -> None:
    bad = run_sluice("bench", "produce", "--batch", "0", "--duration", "1")
    assert bad.returncode == 2 and "--batch" in bad.stderr
    dead = run_sluice("bench", "produce", "--endpoint", f"{LOOPBACK}:{free_port()}", "--duration", "1",
                      "--timeout", "1")  # fmt: skip
    assert dead.returncode == 1 and "setup failed" in dead.stderr
