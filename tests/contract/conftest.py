"""Fixtures of the `BrokerApi` contract suite: one `broker` fixture, parametrised over the implementations.

- `local`: a `LocalBroker` on a fresh tmp dir, started and closed around each test, in the test's loop.
- `remote`: one broker child process for the session (`sluice broker`, started through
  tests/helpers/broker_fixtures.py, real gRPC on loopback), reached through a new `RemoteBroker` per
  test. Tests share that process, so every test names its own topics and groups (`scope`).

A test makes time pass for the broker with `elapse(seconds)`: the local broker's clock jumps ahead
(tests/helpers/clock.py; no sleep), the remote process runs on the system clock, so there it sleeps.

Both run with `CONTRACT_SETTINGS` (a `[broker]` table: small invisibility minimum, fast redelivery
scan, small body limit), the local one through the same config loader the process uses.

`async def test_*` functions run on the per-test event loop (`contract_loop`) under a bounded
timeout, by the `pytest_pyfunc_call` hook below; the suite needs no asyncio plugin.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.client.api import BrokerApi
from broker.config import BrokerConfig
from broker.local import LocalBroker
from common.config import load_config
from tests.helpers.clock import JumpClock

# The `[broker]` table both implementations run with. Times are small to keep the suite fast.
MIN_INVISIBLE_MS = 200
MAX_BODY_BYTES = 4096
POP_MAX_BYTES = 16 * MAX_BODY_BYTES  # what one read, and one pop, carries (past its first message)
TXN_RECOVERY_MS = 200
TXN_CHECK_INTERVAL_MS = 300
TXN_MAX_CHECKS = 2
TIMER_PRECISION_MS = 100
TIMER_MAX_DELAY_MS = 3_600_000
CONTRACT_SETTINGS: dict[str, Any] = {
    "name": "contract-broker",
    "pop": {"min_invisible_ms": MIN_INVISIBLE_MS, "redelivery_scan_interval_ms": 20, "max_long_poll_ms": 10_000},
    "limits": {"max_body_bytes": MAX_BODY_BYTES},
    "store": {"read": {"max_batch_bytes": POP_MAX_BYTES}},
    "transaction": {
        "min_recovery_ms": 50,
        "default_recovery_ms": TXN_RECOVERY_MS,
        "check_interval_ms": TXN_CHECK_INTERVAL_MS,
        "max_checks": TXN_MAX_CHECKS,
        "sweep_interval_ms": 50,
    },
    "timer": {"precision_ms": TIMER_PRECISION_MS, "max_delay_ms": TIMER_MAX_DELAY_MS},
}
TEST_TIMEOUT_S = 30.0
_SETUP_TIMEOUT_S = 15.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a coroutine test on its `contract_loop`, bounded by TEST_TIMEOUT_S."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    loop = pyfuncitem.funcargs.get("contract_loop")
    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise pytest.UsageError(f"{pyfuncitem.nodeid}: an async contract test must use the `broker` fixture")
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    loop.run_until_complete(asyncio.wait_for(pyfuncitem.obj(**kwargs), TEST_TIMEOUT_S))
    return True


@pytest.fixture
def contract_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def local_config(data_dir: Path, **overrides: Any) -> BrokerConfig:
    table = {**CONTRACT_SETTINGS, "data_dir": str(data_dir), **overrides}
    return load_config(BrokerConfig, section="broker", data={"broker": table})


@pytest.fixture(scope="session")
def remote_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's broker child process (started on first use, stopped by PID at the end)."""
    from tests.helpers.broker_fixtures import start_broker_process

    proc = start_broker_process(tmp_path_factory.mktemp("contract-remote"), settings=CONTRACT_SETTINGS)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def clock() -> JumpClock:
    return JumpClock()


@pytest.fixture(params=["local", "remote"])
def broker(
    request: pytest.FixtureRequest, contract_loop: asyncio.AbstractEventLoop, tmp_path: Path, clock: JumpClock
) -> Iterator[BrokerApi]:
    """A running BrokerApi: a LocalBroker of its own (on `clock`), or a RemoteBroker to the session's process."""
    if request.param == "local":
        local = LocalBroker(local_config(tmp_path / "broker"), clock=clock)
        contract_loop.run_until_complete(asyncio.wait_for(local.start(), _SETUP_TIMEOUT_S))
        try:
            yield local
        finally:
            contract_loop.run_until_complete(asyncio.wait_for(local.close(), _SETUP_TIMEOUT_S))
        return
    from broker.client.remote import RemoteBroker

    proc = request.getfixturevalue("remote_process")

    async def connect() -> RemoteBroker:  # the gRPC channel belongs to the loop it is created on
        return RemoteBroker(CONTRACT_SETTINGS["name"], proc.address)

    remote = contract_loop.run_until_complete(connect())
    try:
        yield remote
    finally:
        contract_loop.run_until_complete(asyncio.wait_for(remote.close(), _SETUP_TIMEOUT_S))


Elapse = Callable[[float], Awaitable[None]]


@pytest.fixture
def elapse(broker: BrokerApi, clock: JumpClock) -> Elapse:
    """`await elapse(seconds)`: that much time passes for the broker's invisible durations, retry
    delays, check-backs and lite expiry (a jump of the local broker's clock; a sleep for the remote)."""

    async def run(seconds: float) -> None:
        if isinstance(broker, LocalBroker):
            clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)

    return run


@dataclass
class Scope:
    """Names and message ids of one test: unique within a session, the same on every run."""

    prefix: str
    rng: random.Random
    _n: int = 0

    def _next(self, kind: str) -> str:
        self._n += 1
        return f"{self.prefix}-{kind}{self._n}"

    def topic(self) -> str:
        return self._next("t")

    def group(self) -> str:
        return self._next("g")

    def message_id(self) -> str:
        return f"{self.rng.getrandbits(128):032X}"


@pytest.fixture
def scope(request: pytest.FixtureRequest) -> Scope:
    base = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.originalname.removeprefix("test_"))[:80]
    return Scope(base, random.Random(request.node.nodeid))
