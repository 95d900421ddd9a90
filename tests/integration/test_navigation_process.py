"""`sluice navigation` as a real child process, driven over gRPC by our client and over HTTP by urllib.

Covers: registration → ordered answers over gRPC and HTTP (JSON and text), the 503 text answer and
readiness before any proxy, bad input (400 / coded errors) while the server keeps serving, a port
already taken (exit 2), expiry, one announcer feeding two servers (past a dead one) with draining
visible as soon as `announce_now` returns and unregistration on stop, client failover past an
empty server, clean exit (code 0) on SIGTERM and SIGINT. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from common.errors import BadRequest, Unavailable
from navigation.client import NavigationClient, ProxyAnnouncer
from navigation.model import ProxyLoad, ProxyRegistration

if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.procs import LOOPBACK, REPO_ROOT, ChildProcess, free_port, start_process

NAVIGATION_ARGV = [sys.executable, "-m", "sluice", "navigation"]
WAIT_S = 5.0
RPC_TIMEOUT_S = 1.0
HTTP_TIMEOUT_S = 2.0
BACKOFF_MAX_S = 0.3
EXIT_TIMEOUT_S = 5.0


@dataclass
class NavigationProcess:
    child: ChildProcess
    port: int
    http_port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"


StartNavigation = Callable[..., NavigationProcess]


@pytest.fixture
def start_navigation(tmp_path: Path) -> Iterator[StartNavigation]:
    started: list[NavigationProcess] = []

    def start(*extra_args: str) -> NavigationProcess:
        port, http_port = free_port(), free_port()
        child = start_process(
            [*NAVIGATION_ARGV, "--port", str(port), "--http-port", str(http_port), "--log-level", "debug", *extra_args],
            port=http_port,  # bound after the gRPC port: once it accepts, both do
            log_path=tmp_path / f"navigation-{port}.log",
            name=f"navigation:{port}",
        )
        started.append(NavigationProcess(child, port, http_port))
        return started[-1]

    yield start
    for nav in started:
        nav.child.stop()


def client(*addresses: str) -> NavigationClient:
    return NavigationClient(list(addresses), timeout_s=RPC_TIMEOUT_S, reconnect_backoff_max_s=BACKOFF_MAX_S)


def proxy(proxy_id: str, port: int, **kwargs: object) -> ProxyRegistration:
    return ProxyRegistration(proxy_id=proxy_id, endpoints={"default": f"127.0.0.1:{port}"}, **kwargs)  # type: ignore[arg-type]


@dataclass
class HttpAnswer:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(url: str) -> HttpAnswer:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return HttpAnswer(response.status, response.headers["Content-Type"], response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return HttpAnswer(exc.code, exc.headers["Content-Type"], exc.read())


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def proxy_ids(address: str) -> list[str]:
    async with client(address) as c:
        return [p.proxy_id for p in await c.list_proxies()]


def test_answers_over_grpc_and_http_then_sigterm(start_navigation: StartNavigation, tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    # A warm-up far beyond the test, so "not ready" below never depends on the machine's speed.
    config.write_text("[navigation]\nwarmup_s = 600\n\n[navigation.http_limits]\nmax_connections = 16\n")
    nav = start_navigation("--config", str(config))
    # Before any proxy: not ready (warming up), text look-ups 503, JSON look-ups empty.
    assert http_get(f"{nav.url}/healthz").status == 200
    assert http_get(f"{nav.url}/readyz").status == 503
    none = http_get(f"{nav.url}/v1/endpoints?format=text")
    assert (none.status, none.content_type) == (503, "text/plain; charset=utf-8")
    assert b"no proxy available" in none.body
    assert http_get(f"{nav.url}/v1/endpoints").json()["endpoints"] == []

    async def body() -> None:
        async with client(nav.address) as c:
            assert await c.get_endpoints() == []
            await c.register(proxy("p-busy", 8081, zone="a", load=ProxyLoad(5, 5)))
            await c.register(proxy("p-idle", 8082, zone="b", load=ProxyLoad(0, 1)))
            public = {"default": "127.0.0.1:8083", "public": "203.0.113.7:443"}
            await c.register(ProxyRegistration("p-ns", public, zone="a", namespaces=frozenset({"ns1"})))
            assert await c.get_endpoints() == ["127.0.0.1:8082", "127.0.0.1:8081"]
            assert await c.get_endpoints(zone="a") == ["127.0.0.1:8081", "127.0.0.1:8082"]
            assert await c.get_endpoints("ns1", zone="a") == ["127.0.0.1:8083", "127.0.0.1:8081", "127.0.0.1:8082"]
            assert await c.get_endpoints("ns1", "public") == ["203.0.113.7:443"]
            assert await c.get_endpoints(limit=1) == ["127.0.0.1:8082"]
            [best] = await c.select_proxies(zone="b", limit=1)
            assert (best.proxy_id, best.zone, best.load) == ("p-idle", "b", ProxyLoad(0, 1))
            assert [p.proxy_id for p in await c.list_proxies()] == ["p-busy", "p-idle", "p-ns"]
            with pytest.raises(BadRequest):
                await c.register(proxy("", 1))
            with pytest.raises(BadRequest):
                await c.get_endpoints(network="no;pe")

    asyncio.run(body())

    doc = http_get(f"{nav.url}/v1/endpoints?namespace=ns1&zone=a").json()
    assert doc["endpoints"] == ["127.0.0.1:8083", "127.0.0.1:8081", "127.0.0.1:8082"]
    assert doc["access_points"] == "127.0.0.1:8083;127.0.0.1:8081;127.0.0.1:8082"
    assert doc["proxies"][0] == {
        "id": "p-ns",
        "zone": "a",
        "endpoint": "127.0.0.1:8083",
        "load": 0,
        "in_flight_requests": 0,
        "connected_clients": 0,
    }
    text = http_get(f"{nav.url}/v1/endpoints?zone=a&format=text")
    assert (text.status, text.body) == (200, b"127.0.0.1:8081;127.0.0.1:8082")
    assert http_get(f"{nav.url}/v1/endpoints?network=public&namespace=ns1&format=text").body == b"203.0.113.7:443"
    proxies = http_get(f"{nav.url}/v1/proxies").json()["proxies"]
    assert [p["id"] for p in proxies] == ["p-busy", "p-idle", "p-ns"]
    assert http_get(f"{nav.url}/readyz").status == 200  # a proxy registered: warm
    for bad in ("bogus=1", "format=xml", "limit=-1", "zone=a%20b", "namespace=a&namespace=b"):
        answer = http_get(f"{nav.url}/v1/endpoints?{bad}")
        assert (answer.status, answer.content_type) == (400, "application/json"), bad
        assert "error" in answer.json()
    assert http_get(f"{nav.url}/v2/nothing").status == 404

    # A second server on the same ports cannot start: exit 2 with a message, the first keeps serving.
    taken = subprocess.run(
        [*NAVIGATION_ARGV, "--port", str(nav.port), "--http-port", str(free_port())],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )
    assert taken.returncode == 2 and "cannot listen" in taken.stderr, taken.stderr
    assert http_get(f"{nav.url}/healthz").status == 200

    assert nav.child.stop(timeout_s=EXIT_TIMEOUT_S) == 0
    assert f"navigation listening on {nav.address} (gRPC) and {nav.url} (HTTP)" in nav.child.output()


def test_silent_proxy_expires_and_sigint_exits_cleanly(start_navigation: StartNavigation) -> None:
    nav = start_navigation("--proxy-expiry-s", "1")

    async def gone() -> bool:
        return await proxy_ids(nav.address) == []

    async def body() -> None:
        async with client(nav.address) as c:
            await c.register(proxy("p1", 8081))
            assert await c.get_endpoints() == ["127.0.0.1:8081"]
            await eventually(gone, "proxy dropped out after --proxy-expiry-s 1")
            assert await c.get_endpoints() == []
        assert http_get(f"{nav.url}/v1/endpoints?format=text").status == 503

    asyncio.run(body())
    nav.child.signal(signal.SIGINT)
    assert nav.child.popen.wait(timeout=EXIT_TIMEOUT_S) == 0


def test_announcer_feeds_every_server_drains_and_leaves(start_navigation: StartNavigation) -> None:
    a, b = start_navigation(), start_navigation()
    dead = f"{LOOPBACK}:{free_port()}"
    state = {"now": proxy("p1", 8081, zone="z", load=ProxyLoad(1, 2))}  # what the proxy would report

    async def body() -> None:
        # Failover: a look-up skips a dead server and one that knows no proxy yet.
        async with client(b.address) as only_b:
            await only_b.register(proxy("solo", 9000))
        async with client(dead, a.address, b.address) as c:
            assert await c.get_endpoints() == ["127.0.0.1:9000"]
            await c.unregister("solo")
        async with client(dead) as c:
            with pytest.raises(Unavailable):
                await c.get_endpoints()

        async with client(a.address, dead, b.address) as c:
            # A heartbeat interval far beyond the test: what changes after the first heartbeat was
            # pushed by announce_now.
            announcer = ProxyAnnouncer(c, lambda: state["now"], heartbeat_interval_s=60)
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(announcer.run(stop))
                for nav in (a, b):
                    await eventually(functools.partial(_has, nav, "p1"), f"p1 on {nav.address}")
                    answer = await asyncio.to_thread(http_get, f"{nav.url}/v1/endpoints?format=text")
                    assert answer.body == b"127.0.0.1:8081"
                state["now"] = replace(state["now"], draining=True)
                assert await announcer.announce_now() == 2  # the dead server does not count
                for nav in (a, b):
                    answer = await asyncio.to_thread(http_get, f"{nav.url}/v1/endpoints?format=text")
                    assert answer.status == 503, nav.address
                    [listed] = (await asyncio.to_thread(http_get, f"{nav.url}/v1/proxies")).json()["proxies"]
                    assert listed["draining"] is True
                stop.set()
            # On stop the announcer unregistered: gone at once, not after the expiry.
            for nav in (a, b):
                assert await proxy_ids(nav.address) == []
            assert await announcer.announce_now() == 0  # after leaving, nothing is sent

    asyncio.run(body())
    for nav in (a, b):
        assert nav.child.stop(timeout_s=EXIT_TIMEOUT_S) == 0


async def _has(nav: NavigationProcess, proxy_id: str) -> bool:
    return proxy_id in await proxy_ids(nav.address)
