"""Proxy workers as processes (processes/workerpool.py): `sluice up --shards 1 --workers 2` and `sluice proxy
--workers 2` serve one port from two processes, with one metrics endpoint labelling each worker's
samples; a worker that dies is restarted; workers die with a parent killed by SIGKILL; SIGTERM
stops everything with exit 0. Each test is bounded (about 30 s on a loaded 2-core machine)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.apache.rocketmq.v2 import definition_pb2 as d
from proto.apache.rocketmq.v2 import service_pb2 as s
from proto.apache.rocketmq.v2.service_pb2_grpc import MessagingServiceStub
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, process_tree, start_process

SLUICE = [sys.executable, "-m", "sluice"]
CONNECTIONS = 16  # the kernel spreads connections over the workers: all on one has odds 2**-15
WAIT_S = 30.0
CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0  # the workers start after the parent: two Python start-ups in a row


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=CALL_TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_ready(ops: str) -> dict[str, object]:
    deadline = time.monotonic() + WAIT_S
    while True:
        status, body = _get(f"http://{ops}/readyz")
        if status == 200:
            doc: dict[str, object] = json.loads(body)
            return doc
        assert time.monotonic() < deadline, f"not ready within {WAIT_S} s: {body!r}"
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    return process_tree(pid)[1:]  # the workers (they start no processes of their own)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _query_routes(port: int, topic: str) -> None:
    """One QueryRoute on each of CONNECTIONS separate connections."""
    for i in range(CONNECTIONS):
        # A distinct option per channel: gRPC would otherwise share one connection among them.
        with grpc.insecure_channel(f"{LOOPBACK}:{port}", options=[("sluice.test.channel", i)]) as channel:
            request = s.QueryRouteRequest(topic=d.Resource(name=topic), endpoints=d.Endpoints(
                addresses=[d.Address(host=LOOPBACK, port=port)]))  # fmt: skip
            metadata = (("x-mq-client-id", f"test-workers-{i}"), ("x-mq-language", "PYTHON"))
            answer = MessagingServiceStub(channel).QueryRoute(request, timeout=CALL_TIMEOUT_S, metadata=metadata)
            assert answer.status.code == d.Code.OK, answer.status


def _route_calls_by_worker(ops: str) -> dict[str, float]:
    _, body = _get(f"http://{ops}/metrics")
    by_worker: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name != "sluice_proxy_rpc_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("rpc") == "QueryRoute":
                worker = sample.labels.get("worker", "")
                by_worker[worker] = by_worker.get(worker, 0.0) + sample.value
    return by_worker


@pytest.fixture
def merged(tmp_path: Path) -> Iterator[tuple[ChildProcess, int, str]]:
    port, ops_port = free_port(), free_port()
    argv = [*SLUICE, "up", "--shards", "1", "--workers", "2", "--data-dir", str(tmp_path / "data"), "--port", str(port),
            "--namesrv-port", str(free_port()), "--broker-port", str(free_port()), "--metrics-port", str(ops_port),
            "--console-port", "-1", "--amqp-port", "-1", "--mqtt-port", "-1"]  # fmt: skip
    child = start_process(argv, port=port, log_path=tmp_path / "up.log", name="up", timeout_s=START_TIMEOUT_S)
    try:
        yield child, port, f"{LOOPBACK}:{ops_port}"
    finally:
        child.stop()


def test_merged_workers_share_the_port_and_one_metrics_endpoint(merged: tuple[ChildProcess, int, str]) -> None:
    child, port, ops = merged
    doc = _wait_ready(ops)
    assert doc["parts"] == {"proxy": True, "workers": True}
    assert len(_children(child.pid)) == 2
    assert "(clients connect here; 2 worker processes)" in child.output()
    _query_routes(port, "auto-created-by-a-worker")  # the workers create topics on first use too
    by_worker = _route_calls_by_worker(ops)
    assert set(by_worker) >= {"0", "1"}, by_worker
    assert sum(v for k, v in by_worker.items() if k in ("0", "1")) >= CONNECTIONS


def test_a_dead_worker_is_restarted_and_workers_die_with_their_parent(merged: tuple[ChildProcess, int, str]) -> None:
    child, _, ops = merged
    _wait_ready(ops)
    first = _children(child.pid)
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while not (len(now := _children(child.pid)) == 2 and first[0] not in now):
        assert time.monotonic() < deadline, f"worker {first[0]} was not replaced: {now}"
        time.sleep(0.2)
    _wait_ready(ops)
    assert "worker exited; restarting" in child.output()
    workers = _children(child.pid)
    child.signal(signal.SIGKILL)
    child.popen.wait(timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, "workers outlived their parent (they hold the client port)"
        time.sleep(0.1)


def test_sigterm_stops_the_workers_and_exits_zero(merged: tuple[ChildProcess, int, str]) -> None:
    child, _, ops = merged
    _wait_ready(ops)
    workers = _children(child.pid)
    assert child.stop() == 0, child.tail()
    assert not any(_alive(w) for w in workers)


def _worker_ops(pid: int) -> str:
    """A worker's own operations endpoint, from the ops file its command line names."""
    argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    return Path(argv[argv.index("--ops-file") + 1]).read_text().strip()


def test_log_level_reaches_every_worker(merged: tuple[ChildProcess, int, str]) -> None:
    child, _, ops = merged
    _wait_ready(ops)
    request = urllib.request.Request(f"http://{ops}/loglevel", data=b"debug", method="PUT")
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as answer:
        assert json.loads(answer.read()) == {"level": "debug"}
    for worker in _children(child.pid):
        _, body = _get(f"http://{_worker_ops(worker)}/loglevel")
        assert json.loads(body) == {"level": "debug"}, worker


def test_proxy_workers_serve_one_metrics_endpoint(tmp_path: Path) -> None:
    ns_port, port, ops_port = free_port(), free_port(), free_port()
    ns = start_process([*SLUICE, "nameserver", "--port", str(ns_port)], port=ns_port,
                       log_path=tmp_path / "ns.log", name="nameserver")  # fmt: skip
    try:
        proxy = start_process([*SLUICE, "proxy", "--workers", "2", "--namesrv", f"{LOOPBACK}:{ns_port}", "--port",
                               str(port), "--metrics-port", str(ops_port)], port=port,
                              log_path=tmp_path / "proxy.log", name="proxy", timeout_s=START_TIMEOUT_S)  # fmt: skip
        try:
            ops = f"{LOOPBACK}:{ops_port}"
            _wait_ready(ops)
            assert len(_children(proxy.pid)) == 2
            assert f"proxy listening on {LOOPBACK}:{port} (2 workers)" in proxy.output()
            _, body = _get(f"http://{ops}/metrics")
            names = [f.name for f in text_string_to_metric_families(body.decode())]
            assert len(names) == len(set(names)), "a family written twice is not valid exposition"
            assert 'worker="0"' in body.decode() and 'worker="1"' in body.decode()
        finally:
            assert proxy.stop() == 0, proxy.tail()
    finally:
        ns.stop()
