"""`sluice nameserver` as a real child process, driven over gRPC on loopback by our client.

Covers: registration → route and listings; failover past a dead NameServer; coded errors for bad
input while the server keeps serving; expiry; one registrar feeding two NameServers, with topic
changes visible as soon as `report_now` returns; a restarted NameServer refilled by the next
heartbeat; clean exit (code 0) on SIGTERM and SIGINT. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.errors import BadRequest, IllegalTopic, SluiceError, TopicNotFound, Unavailable
from common.model import MessageType, Permission, TopicInfo
from nameserver.client import BrokerRegistrar, NameServerClient
from nameserver.model import BrokerRegistration
from proto.rpc import error_from_rpc
from proto.sluice.internal.v1 import nameserver_pb2 as pb
from proto.sluice.internal.v1 import nameserver_pb2_grpc as pb_grpc

# `tests` is not an installed package: `.venv/bin/pytest` (unlike `python -m pytest`) does not put
# the repository root on sys.path. Drop this once pytest is configured with `pythonpath = ["."]`.
if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process

NAMESERVER_ARGV = [sys.executable, "-m", "sluice", "nameserver"]
WAIT_S = 5.0
RPC_TIMEOUT_S = 1.0
# Short reconnect backoff so a client notices a restarted NameServer within the test's budget.
BACKOFF_MAX_S = 0.3
EXIT_TIMEOUT_S = 5.0


@dataclass
class NameServerProcess:
    child: ChildProcess
    port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


StartNameServer = Callable[..., NameServerProcess]


@pytest.fixture
def start_nameserver(tmp_path: Path) -> Iterator[StartNameServer]:
    started: list[NameServerProcess] = []

    def start(*extra_args: str, port: int = 0) -> NameServerProcess:
        port = port or free_port()
        child = start_process(
            [*NAMESERVER_ARGV, "--port", str(port), "--log-level", "debug", *extra_args],
            port=port,
            log_path=tmp_path / f"nameserver-{port}-{len(started)}.log",
            name=f"nameserver:{port}",
        )
        started.append(NameServerProcess(child, port))
        return started[-1]

    yield start
    for ns in started:
        ns.child.stop()


def client(*addresses: str) -> NameServerClient:
    return NameServerClient(list(addresses), timeout_s=RPC_TIMEOUT_S, reconnect_backoff_max_s=BACKOFF_MAX_S)


def registration(broker_name: str = "broker-a", *topics: TopicInfo) -> BrokerRegistration:
    return BrokerRegistration(
        cluster_name="cluster-1",
        broker_name=broker_name,
        address="127.0.0.1:10911",
        topics=topics or (TopicInfo("orders", 8),),
    )


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def knows(address: str, topic: str) -> bool:
    async with client(address) as c:
        try:
            await c.get_route(topic)
        except (TopicNotFound, Unavailable):
            return False
        return True


def test_register_route_listings_failover_and_sigterm(start_nameserver: StartNameServer) -> None:
    ns = start_nameserver()
    dead = f"{LOOPBACK}:{free_port()}"

    async def body() -> None:
        fifo = TopicInfo("fifo-t", 2, Permission.READ, frozenset({MessageType.FIFO}))
        async with client(ns.address) as c:
            assert await c.register(registration("broker-b", TopicInfo("orders", 4), fifo)) == 1
            assert await c.register(registration("broker-a")) == 1
            route = await c.get_route("orders")
            assert [(b.broker_name, b.queue_count) for b in route.brokers] == [("broker-a", 8), ("broker-b", 4)]
            [fifo_queues] = (await c.get_route("fifo-t")).brokers
            assert (fifo_queues.permission, fifo_queues.message_types) == (Permission.READ, fifo.message_types)
            brokers = await c.list_brokers()
            assert [(b.broker_name, b.topic_count) for b in brokers] == [("broker-a", 1), ("broker-b", 2)]
            assert all(0 <= b.last_heartbeat_age_s < WAIT_S for b in brokers)
            topics = await c.list_topics()
            assert [(t.name, t.queue_count, t.broker_names) for t in topics] == [
                ("fifo-t", 2, ("broker-b",)),
                ("orders", 12, ("broker-a", "broker-b")),
            ]
        # A dead NameServer first in the list: reads fail over, writes count only the live one.
        async with client(dead, ns.address) as c:
            assert (await c.get_route("orders")).topic == "orders"
            with pytest.raises(TopicNotFound):
                await c.get_route("unknown")
            assert await c.register(registration("broker-a")) == 1
        async with client(dead) as c:
            with pytest.raises(Unavailable):
                await c.get_route("orders")
            with pytest.raises(Unavailable):
                await c.register(registration())

    asyncio.run(body())
    assert ns.child.stop(timeout_s=EXIT_TIMEOUT_S) == 0
    assert f"nameserver listening on {ns.address}" in ns.child.output()


def test_bad_input_gets_coded_errors_and_server_keeps_serving(start_nameserver: StartNameServer) -> None:
    ns = start_nameserver()

    async def call(stub: pb_grpc.NameServerStub, method: str, request: object) -> SluiceError | None:
        try:
            await getattr(stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return error_from_rpc(exc)
        return None

    def reg(**fields: Any) -> pb.RegisterBrokerRequest:
        base: dict[str, Any] = {"cluster_name": "c", "broker_name": "b", "address": "127.0.0.1:1"}
        return pb.RegisterBrokerRequest(registration=pb.BrokerRegistration(**{**base, **fields}))

    async def body() -> None:
        async with grpc.aio.insecure_channel(ns.address) as channel:
            stub = pb_grpc.NameServerStub(channel)
            cases: list[tuple[str, object, type[SluiceError]]] = [
                ("RegisterBroker", reg(broker_name=""), BadRequest),
                ("RegisterBroker", pb.RegisterBrokerRequest(), BadRequest),
                ("RegisterBroker", reg(address="no-port"), BadRequest),
                ("RegisterBroker", reg(topics=[pb.TopicEntry(name="t", queue_count=1, permission=99)]), BadRequest),
                ("RegisterBroker", reg(topics=[pb.TopicEntry(name="t", queue_count=1, permission=4)]), BadRequest),
                (
                    "RegisterBroker",
                    reg(topics=[pb.TopicEntry(name="", queue_count=1, permission=4, message_types=[1])]),
                    IllegalTopic,
                ),
                ("UnregisterBroker", pb.UnregisterBrokerRequest(), BadRequest),
                ("GetRoute", pb.GetRouteRequest(topic=""), IllegalTopic),
                ("GetRoute", pb.GetRouteRequest(topic="unknown"), TopicNotFound),
            ]
            for method, request, expected in cases:
                error = await call(stub, method, request)
                assert type(error) is expected, (method, request, error)
            good = reg(topics=[pb.TopicEntry(name="t", queue_count=1, permission=4, message_types=[1])])
            assert await call(stub, "RegisterBroker", good) is None
        async with client(ns.address) as c:
            assert [b.broker_name for b in (await c.get_route("t")).brokers] == ["b"]

    asyncio.run(body())
    assert ns.child.running()


def test_silent_broker_expires_and_sigint_exits_cleanly(start_nameserver: StartNameServer) -> None:
    ns = start_nameserver("--broker-expiry-s", "1")

    async def gone() -> bool:
        return not await knows(ns.address, "orders")

    async def body() -> None:
        async with client(ns.address) as c:
            await c.register(registration())
            assert (await c.get_route("orders")).brokers
            await eventually(gone, "broker dropped out after --broker-expiry-s 1")
            assert await c.list_brokers() == []
            assert await c.list_topics() == []

    asyncio.run(body())
    ns.child.signal(signal.SIGINT)
    assert ns.child.popen.wait(timeout=EXIT_TIMEOUT_S) == 0


def test_registrar_feeds_every_nameserver_and_reports_at_once(start_nameserver: StartNameServer) -> None:
    a, b = start_nameserver(), start_nameserver()
    topics = [TopicInfo("t1", 4)]

    async def body() -> None:
        async with client(a.address, b.address) as c:
            # A heartbeat interval far beyond the test: whatever shows up after the first
            # heartbeat was pushed by report_now.
            registrar = BrokerRegistrar(c, lambda: registration("broker-a", *topics), heartbeat_interval_s=60)
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(registrar.run(stop))
                for ns in (a, b):
                    await eventually(functools.partial(knows, ns.address, "t1"), f"t1 on {ns.address}")
                topics.append(TopicInfo("t2", 2))
                assert await registrar.report_now() == 2
                for ns in (a, b):
                    assert await knows(ns.address, "t2"), ns.address
                stop.set()
            # On stop the registrar unregistered: the routes are gone at once, not after expiry.
            for ns in (a, b):
                assert not await knows(ns.address, "t1")

    asyncio.run(body())


def test_restarted_nameserver_is_refilled_by_next_heartbeat(start_nameserver: StartNameServer) -> None:
    ns = start_nameserver()

    async def body() -> None:
        async with client(ns.address) as c:
            registrar = BrokerRegistrar(c, registration, heartbeat_interval_s=0.2)
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(registrar.run(stop))
                await eventually(lambda: knows(ns.address, "orders"), "first registration")
                assert await asyncio.to_thread(ns.child.stop, EXIT_TIMEOUT_S) == 0
                # The registrar keeps running while the NameServer is down ...
                await asyncio.sleep(0.5)
                await asyncio.to_thread(start_nameserver, port=ns.port)
                # ... and its next heartbeats refill the new, empty NameServer.
                await eventually(lambda: knows(ns.address, "orders"), "route restored after restart")
                stop.set()

    asyncio.run(body())
