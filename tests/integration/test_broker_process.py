"""`sluice broker` and `sluice admin` as real processes: a NameServer and two brokers on loopback.

Covers: `admin topic create` spreading a topic's queues over both brokers (queue id 0 on each) and
returning only once the route shows it; send → pop → ack through `RemoteBroker`, with group lag
and in-flight counts seen by `admin group describe`; message lookups by id and key; batches far
beyond gRPC's default 4 MiB message limit; bad input over the internal gRPC raising the same
`SluiceError` class as in-process, with the broker serving on; one-line admin errors (dead
NameServer, unknown topic, bad argument); a standalone broker; SIGTERM → exit 0 and unregistered.
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.client.api import (
    ConsumeFrom,
    FilterKind,
    FilterSpec,
    GroupSpec,
    PopRequest,
    StoredMessage,
    TopicSpec,
)
from broker.client.remote import RemoteBroker
from broker.config import LimitsConfig
from common.codes import Code
from common.errors import (
    BadRequest,
    IllegalFilterExpression,
    InvalidReceiptHandle,
    MessageBodyTooLarge,
    TopicNotFound,
)
from common.model import MessageType
from nameserver.client import NameServerClient
from tests.helpers.broker_fixtures import (
    SLUICE_ARGV,
    ServerProcess,
    running_broker,
    start_broker_process,
    start_nameserver_process,
)
from tests.helpers.procs import LOOPBACK, REPO_ROOT, free_port
from tests.helpers.records import outgoing

ADMIN_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 5.0
WAIT_S = 5.0
LONG_POLL_MS = 1_000
EXIT_TIMEOUT_S = 10.0
MAX_BODY_BYTES = LimitsConfig().max_body_bytes  # the broker's default limit (16 MiB)
MIB = 1024 * 1024


@dataclass
class Cluster:
    nameserver: ServerProcess
    brokers: dict[str, ServerProcess]

    @property
    def namesrv(self) -> str:
        return self.nameserver.address

    def remote(self, name: str) -> RemoteBroker:
        return RemoteBroker(name, self.brokers[name].address, timeout_s=RPC_TIMEOUT_S)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("broker-cluster")
    started: list[ServerProcess] = []
    try:
        nameserver = start_nameserver_process(root)
        started.append(nameserver)
        brokers = {}
        for name in ("broker-a", "broker-b"):
            brokers[name] = start_broker_process(root, name=name, namesrv=nameserver.address)
            started.append(brokers[name])
        yield Cluster(nameserver, brokers)
    finally:
        for proc in reversed(started):
            proc.stop()


def admin(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [*SLUICE_ARGV, "admin", "--namesrv", namesrv, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=ADMIN_TIMEOUT_S,
        check=False,
    )


def admin_json(namesrv: str, *args: str) -> Any:
    result = admin(namesrv, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def create_group(remote: RemoteBroker, name: str) -> None:
    await remote.create_group(GroupSpec(name, consume_from=ConsumeFrom.EARLIEST))


async def pop_all(remote: RemoteBroker, group: str, topic: str, count: int) -> list[StoredMessage]:
    """Pop until `count` messages arrived (bounded by WAIT_S)."""
    got: list[StoredMessage] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        got += await remote.pop(PopRequest(group, topic, max_messages=32, long_poll_ms=LONG_POLL_MS))
    return got


def test_admin_creates_topic_over_both_brokers(cluster: Cluster) -> None:
    created = admin_json(cluster.namesrv, "topic", "create", "orders", "--type", "normal,fifo", "--queues", "3")
    assert [(b["broker"], b["queues"]) for b in created["brokers"]] == [("broker-a", 2), ("broker-b", 1)]

    async def route() -> None:
        async with NameServerClient(cluster.namesrv, timeout_s=RPC_TIMEOUT_S) as client:
            # admin returned only once the route showed the topic: no waiting here.
            r = await client.get_route("orders")
        assert [(b.broker_name, b.queue_count) for b in r.brokers] == [("broker-a", 2), ("broker-b", 1)]
        assert all(b.message_types == {MessageType.NORMAL, MessageType.FIFO} for b in r.brokers)

    asyncio.run(route())
    listed = {t["topic"]: t for t in admin_json(cluster.namesrv, "topic", "list")}
    assert listed["orders"]["queues"] == 3 and listed["orders"]["brokers"] == ["broker-a", "broker-b"]
    queues = [(r["broker"], r["queue"]) for r in admin_json(cluster.namesrv, "topic", "describe", "orders")]
    assert queues == [("broker-a", 0), ("broker-a", 1), ("broker-b", 0)]  # queue id 0 on every broker
    table = admin(cluster.namesrv, "topic", "describe", "orders")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["BROKER", "QUEUE", "MIN_OFFSET"]


def test_send_pop_ack_lag_and_lookups(cluster: Cluster) -> None:
    topic, group = "flow", "flow-g"
    assert admin(cluster.namesrv, "topic", "create", topic, "--queues", "2").returncode == 0
    created = admin_json(
        cluster.namesrv, "group", "create", group, "--consume-from", "earliest",
        "--max-attempts", "5", "--retry-policy", "exponential:500:10000:2",
    )  # fmt: skip
    assert created[0]["brokers"] == ["broker-a", "broker-b"] and created[0]["max_attempts"] == 5

    async def body() -> None:
        for name in ("broker-a", "broker-b"):
            async with cluster.remote(name) as remote:
                assert (await remote.get_group(group)).spec.consume_from is ConsumeFrom.EARLIEST
                sent = [
                    outgoing(
                        f"{name} #{i}".encode(), f"{name}-m{i}", tag="TagA", keys=("order-1",),
                        properties={"p": str(i)}, born_host="test",
                    )
                    for i in range(4)
                ]  # fmt: skip
                results = await remote.send(topic, 0, sent)
                assert [r.queue_offset for r in results] == [0, 1, 2, 3]
                got = await pop_all(remote, group, topic, 4)
                assert sorted(m.body for m in got) == sorted(m.body for m in sent)
                assert all(m.tag == "TagA" and m.keys == ("order-1",) and m.receipt_handle for m in got)
                assert {m.properties["p"] for m in got} == {"0", "1", "2", "3"}
                status = admin_json(cluster.namesrv, "group", "describe", group)
                assert status["lag"] >= 4 and status["in_flight"] == 4
                acks = await remote.ack(group, topic, [m.receipt_handle for m in got])
                assert all(a.ok for a in acks)
        status = admin_json(cluster.namesrv, "group", "describe", group)
        assert (status["lag"], status["in_flight"]) == (0, 0)
        rows = {(r["broker"], r["queue"]): r for r in status["queues"]}
        assert rows[("broker-a", 0)]["consumed_offset"] == rows[("broker-a", 0)]["max_offset"] == 4

    asyncio.run(body())
    [found] = admin_json(cluster.namesrv, "message", "get", "--topic", topic, "--id", "broker-b-m2")
    assert (found["broker"], found["body_text"], found["properties"]) == ("broker-b", "broker-b #2", {"p": "2"})
    by_key = admin_json(cluster.namesrv, "message", "find", "--topic", topic, "--key", "order-1")
    assert sorted(m["message_id"] for m in by_key) == sorted(
        f"{b}-m{i}" for b in ("broker-a", "broker-b") for i in range(4)
    )


def test_batches_beyond_grpc_default_message_size(cluster: Cluster) -> None:
    async def body() -> None:
        async with cluster.remote("broker-a") as remote:
            await remote.create_topic(TopicSpec("big", 1))
            sent = [outgoing(bytes([i]) * MIB, f"big-{i}") for i in range(8)]  # 8 MiB each way
            await remote.send("big", 0, sent)
            await create_group(remote, "big-g")
            got = await pop_all(remote, "big-g", "big", 8)
            assert sorted(m.body for m in got) == sorted(m.body for m in sent)

    asyncio.run(body())


def test_bad_input_raises_the_same_error_classes_and_broker_keeps_serving(cluster: Cluster) -> None:
    async def body() -> None:
        async with cluster.remote("broker-b") as remote:
            await remote.create_topic(TopicSpec("strict", 2))
            await create_group(remote, "strict-g")
            cases: list[tuple[Awaitable[Any], type[Exception]]] = [
                (remote.get_topic("no-such-topic"), TopicNotFound),
                (remote.send("no-such-topic", 0, [outgoing(b"x", "m1")]), TopicNotFound),
                (remote.change_invisible_duration("strict-g", "strict", "not-a-handle", 5_000), InvalidReceiptHandle),
                (remote.nack("strict-g", "strict", "broker-b~AAAA"), InvalidReceiptHandle),
                (
                    remote.pop(PopRequest("strict-g", "strict", filter=FilterSpec(FilterKind.SQL, "a = "))),
                    IllegalFilterExpression,
                ),
                (remote.send("strict", 0, [outgoing(b"x" * (MAX_BODY_BYTES + 1), "m2")]), MessageBodyTooLarge),
                (remote.send("strict", 7, [outgoing(b"x", "m3")]), BadRequest),  # no queue 7
                (remote.send("strict", 2**40, [outgoing(b"x", "m4")]), BadRequest),  # beyond int32
            ]
            for call, expected in cases:
                with pytest.raises(expected):
                    await call
            [ack] = await remote.ack("strict-g", "strict", ["not-a-handle"])
            assert not ack.ok and ack.error is not None and ack.error.code == Code.INVALID_RECEIPT_HANDLE
            assert (await remote.get_topic("strict")).queue_count == 2  # still serving

    asyncio.run(body())
    assert cluster.brokers["broker-b"].running()


def test_admin_failures_print_one_line(cluster: Cluster) -> None:
    dead = admin(f"{LOOPBACK}:{free_port()}", "topic", "list")
    assert dead.returncode == 1 and dead.stdout == ""
    [line] = dead.stderr.splitlines()
    assert line.startswith("sluice admin: topic list: HA_NOT_AVAILABLE: cannot reach any NameServer"), line
    unknown = admin(cluster.namesrv, "topic", "describe", "no-such-topic")
    assert unknown.returncode == 1
    assert unknown.stderr.splitlines() == [unknown.stderr.strip()] and "TOPIC_NOT_FOUND" in unknown.stderr
    bad = admin(cluster.namesrv, "topic", "create", "t", "--type", "weird")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "bad argument" in bad.stderr


def test_standalone_broker_through_the_helper(tmp_path: Path) -> None:
    async def body() -> None:
        async with running_broker(tmp_path, settings={"name": "solo", "pop": {"min_invisible_ms": 200}}) as handle:
            spec = await handle.remote.create_topic(TopicSpec("solo-t", 1))  # no NameServer to report to
            assert spec.queue_count == 1 and handle.nameserver is None
            assert [t.name for t in await handle.remote.list_topics()] == ["solo-t"]
        assert not handle.broker.running()
        assert handle.broker.child.popen.returncode == 0

    asyncio.run(body())


def test_sigterm_exits_zero_and_unregisters(cluster: Cluster, tmp_path: Path) -> None:
    broker = start_broker_process(tmp_path, name="broker-c", namesrv=cluster.namesrv)

    async def registered() -> bool:
        async with NameServerClient(cluster.namesrv, timeout_s=RPC_TIMEOUT_S) as client:
            return "broker-c" in {b.broker_name for b in await client.list_brokers()}

    async def body() -> None:
        await eventually(registered, "broker-c registered")
        assert await asyncio.to_thread(broker.stop, EXIT_TIMEOUT_S) == 0
        assert not await registered()  # unregistered on the way out, not expired later

    try:
        asyncio.run(body())
    finally:
        broker.stop()
    assert f"broker broker-c listening on {broker.address}" in broker.output()
