"""`sluice admin client list` and the console's client counts follow clients that go away, and keep
clients that are only quiet.

Both topologies with a short `client_expiry_s` and short HTTP/2 idle and keepalive times
(`[proxy.http2]`): the merged one as `sluice up --shards 1 --workers 2`
(one broker, its proxy in two worker processes: this checks that workers count as one proxy; with
shards a client talks to every shard's proxy, so the console counts one proxy per shard), the
separated one with its two proxies (the first with its default workers). A client of the official
Python client that shuts down (it sends NotifyClientTermination) is gone from `client list` within
5 s; one whose process is SIGKILLed (it says nothing) within 30 s (here within the short expiry).
A client that sends nothing for longer than the idle timeout keeps its Telemetry stream and stays
listed; one whose process is frozen (SIGSTOP: its connection open, its host answering TCP, nothing
answering HTTP/2) is cut off by the proxy's keepalive PING and is gone too.
The merged console's cluster page counts one proxy (not one per worker) and its clients. The
default expiry's 30 s bound is checked in tests/unit/test_client_sessions.py.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.support.clients import producer
from tests.e2e.support.cluster import Cluster, start_merged, start_separated
from tests.helpers.procs import REPO_ROOT

CLEAN_SHUTDOWN_BOUND_S = 5.0  # issue 35: a client that said goodbye is gone this soon
SILENT_BOUND_S = 30.0  # and one that just vanished this soon
APPEAR_TIMEOUT_S = 30.0
IDLE_S, KEEPALIVE_S = 1.0, 1.0  # [proxy.http2] idle_timeout_s, keepalive_s and keepalive_timeout_s here
QUIET_S = 5.0  # a quiet client's time without a request: past the idle timeout, the keepalive and the expiry

# A client process of its own, so that it can be killed without a word: it announces itself, then idles.
SILENT_CLIENT = """
import sys, time
from rocketmq import ClientConfiguration, Credentials, Message, Producer
p = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=3), (sys.argv[2],))
p.startup()
m = Message()
m.topic, m.body = sys.argv[2], b"hello"
p.send(m)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module", params=["merged", "separated"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp(f"client-list-{request.param}")
    config = root / "sluice.toml"
    config.write_text(
        f"[proxy]\nclient_expiry_s = 2.0\n\n[proxy.http2]\nidle_timeout_s = {IDLE_S}\n"
        f"keepalive_s = {KEEPALIVE_S}\nkeepalive_timeout_s = {KEEPALIVE_S}\n"
    )
    if request.param == "merged":
        started = start_merged(root, extra_args=["--workers", "2", "--config", str(config)])
    else:
        started = start_separated(root, config=config)
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def listed(cluster: Cluster, topic: str) -> list[str]:
    return [row["client_id"] for row in cluster.admin("client", "list", "--topic", topic)]


def wait_until(what: str, probe: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `probe()` held; fails the test past `timeout_s`."""
    started = time.monotonic()
    while not probe():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)
    return time.monotonic() - started


def console_counts(cluster: Cluster) -> tuple[int, int]:
    """(proxies, clients) as the cluster page's proxy tile shows them."""
    with urllib.request.urlopen(cluster.console + "/cluster", timeout=30) as answer:
        page = answer.read().decode()
    found = re.search(r"<b>(\d+)</b> prox(?:y|ies), <b>(\d+)</b> client", page)
    assert found, "the cluster page has no proxy tile"
    return int(found[1]), int(found[2])


def test_a_client_that_shuts_down_is_gone_within_5_s(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    with producer(cluster.first_proxy, topic) as p:
        wait_until("the producer in client list", lambda: bool(listed(cluster, topic)), APPEAR_TIMEOUT_S)
        if cluster.console:
            wait_until("the producer on the console", lambda: console_counts(cluster) == (1, 1), APPEAR_TIMEOUT_S)
        assert p.is_running
    wait_until("the producer gone after its shutdown", lambda: not listed(cluster, topic), CLEAN_SHUTDOWN_BOUND_S)
    if cluster.console:  # the page reads client reports anew once its cache ([console] nameserver_cache_s) runs out
        wait_until("the producer gone from the console", lambda: console_counts(cluster) == (1, 0),
                   CLEAN_SHUTDOWN_BOUND_S)  # one proxy (two workers), no client  # fmt: skip


def test_a_killed_client_is_gone_within_30_s(cluster: Cluster, unique: Callable[[str], str], tmp_path: Path) -> None:
    topic = cluster.create_topic(unique("t"))
    child = subprocess.Popen([sys.executable, "-c", SILENT_CLIENT, cluster.first_proxy, topic], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=(tmp_path / "client.log").open("wb"))  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready", "the client did not start"
        wait_until("the client in client list", lambda: bool(listed(cluster, topic)), APPEAR_TIMEOUT_S)
        child.kill()
        child.wait(timeout=10)
        wait_until("the killed client gone", lambda: not listed(cluster, topic), SILENT_BOUND_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def test_a_quiet_client_stays_and_a_frozen_one_is_cut_off_by_keepalive(
    cluster: Cluster, unique: Callable[[str], str], tmp_path: Path
) -> None:
    topic = cluster.create_topic(unique("t"))
    child = subprocess.Popen([sys.executable, "-c", SILENT_CLIENT, cluster.first_proxy, topic], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=(tmp_path / "client.log").open("wb"))  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready", "the client did not start"
        wait_until("the client in client list", lambda: bool(listed(cluster, topic)), APPEAR_TIMEOUT_S)
        quiet_until = time.monotonic() + QUIET_S
        while time.monotonic() < quiet_until:  # it sends nothing; its connection answers the proxy's PINGs
            assert listed(cluster, topic), "a quiet client lost its session"
            time.sleep(0.5)
        child.send_signal(signal.SIGSTOP)
        wait_until("the frozen client gone", lambda: not listed(cluster, topic), SILENT_BOUND_S)
    finally:
        child.kill()  # (a stopped process is killed all the same)
        child.wait(timeout=10)
