"""A receive is served from the broker that has the messages (docs/consumers.md, issue 30).

The official SimpleConsumer names one broker per receive, going round the route's brokers. On the
separated topology (two brokers) a message sits on one of them; a receive that names the other
must still return it at once, not wait its whole long poll on an empty broker. Merged and separated.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rocketmq import FilterExpression

from tests.e2e.support.clients import message, producer, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster
from tests.e2e.test_node_client import node as node_fixture
from tests.e2e.test_node_client import run_node

README = Path(__file__).resolve().parents[2] / "README.md"
RUNS = 20
node = node_fixture  # the Node.js client's fixture (test_node_client.py): installs the pinned client
# The README snippet's consumer: a 3 s long poll (await_duration), then receive(16, 15).
AWAIT_S = 3
INVISIBLE_S = 15
TEST_BOUND_S = 120.0  # bounds the test whatever happens


def _delivered_by(receipt_handle: str) -> str:
    """The broker a receipt handle names (`<broker>~<payload>`, the format Sluice hands out)."""
    return receipt_handle.split("~", 1)[0]


def test_one_send_then_one_receive_returns_it_every_time(cluster: Cluster, unique: Callable[[str], str]) -> None:
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    started = time.monotonic()
    delivered_by: list[str] = []
    with producer(cluster.endpoints, topic) as p:
        for run in range(RUNS):
            assert time.monotonic() - started < TEST_BOUND_S, f"only {run} of {RUNS} runs done in {TEST_BOUND_S} s"
            # A new consumer each run, as the README snippet starts: its first receive names
            # whichever broker the client picks, holding the message or not.
            with simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}, await_duration_s=AWAIT_S) as c:
                (sent,) = send_all(p, [message(topic, f"run {run}".encode())])
                got = c.receive(16, INVISIBLE_S)
                assert [m.message_id for m in got] == [sent], f"run {run}: sent {sent}, received {got}"
                c.ack(got[0])
                delivered_by.append(_delivered_by(got[0].receipt_handle))
    # Both brokers held messages (the proxy spreads sends over them), and each run got its own.
    assert set(delivered_by) == set(cluster.brokers), delivered_by


def test_the_readme_client_snippet_works_as_written(cluster: Cluster, unique: Callable[[str], str]) -> None:
    """The README's Python snippet, run as a user would (its own process), against this cluster:
    only the endpoint and the names are this test's."""
    (snippet,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    code = (snippet.replace('"127.0.0.1:8081"', repr(cluster.endpoints)).replace('"demo-group"', repr(group))
            .replace('"demo"', repr(topic)))  # fmt: skip
    assert repr(group) in code and repr(topic) in code and repr(cluster.endpoints) in code
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "received b'hello, sluice'" in run.stdout, run.stdout


def test_node_client_one_send_then_one_receive_returns_it_every_time(
    cluster: Cluster, unique: Callable[[str], str], node: str
) -> None:
    """The same with the official Node.js client (a new SimpleConsumer each run; one proxy: the Node
    client takes a single endpoint)."""
    topic = cluster.create_topic(unique("t"))
    group = cluster.create_group(unique("g"))
    result = run_node(node, "single_receive.js", endpoints=cluster.first_proxy, topic=topic, group=group, runs=RUNS)
    runs = result["runs"]
    assert len(runs) == RUNS
    missed = [(i, r) for i, r in enumerate(runs) if r["received"] != [r["sent"]]]
    assert not missed, missed
    assert {_delivered_by(r["handle"]) for r in runs} == set(cluster.brokers)
