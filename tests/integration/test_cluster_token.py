"""The cluster token (proto/token.py): a NameServer and a broker started with SLUICE_CLUSTER_TOKEN
refuse callers without it (UNAUTHORIZED, one readable line from `sluice admin`), accept those with
it, and still talk to each other (the broker registers, so admin sees it). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client.api import SendResult, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import Unauthorized
from proto import token
from tests.helpers.broker_fixtures import SLUICE_ARGV, ServerProcess, _wait_for_line
from tests.helpers.procs import LOOPBACK, REPO_ROOT, free_port, start_process
from tests.helpers.records import outgoing

pytestmark = pytest.mark.slow

TOKEN = "cluster-token-for-tests"
ADMIN_TIMEOUT_S = 60.0


def _start(root: Path, name: str, argv: list[str], port: int, line: str) -> ServerProcess:
    child = start_process(argv, port=port, log_path=root / f"{name}.log", name=name,
                          env={token.ENV_TOKEN: TOKEN})  # fmt: skip
    proc = ServerProcess(name, port, child)
    _wait_for_line(proc, line, 30.0)
    return proc


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    root = tmp_path_factory.mktemp("token")
    ns_port, broker_port = free_port(), free_port()
    procs: list[ServerProcess] = []
    try:
        ns = _start(root, "nameserver", [*SLUICE_ARGV, "nameserver", "--port", str(ns_port)], ns_port,
                    f"nameserver listening on {LOOPBACK}:{ns_port}")  # fmt: skip
        procs.append(ns)
        argv = [*SLUICE_ARGV, "broker", "--name", "broker-a", "--port", str(broker_port), "--data-dir",
                str(root / "broker-a"), "--namesrv", ns.address]  # fmt: skip
        procs.append(
            _start(root, "broker-a", argv, broker_port, f"broker broker-a listening on {LOOPBACK}:{broker_port}")
        )
        yield procs[0], procs[1]
    finally:
        for proc in reversed(procs):
            proc.stop()


def _admin(ns: ServerProcess, env_token: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (token.ENV_TOKEN, token.ENV_TOKEN_FILE)}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if env_token is not None:
        env[token.ENV_TOKEN] = env_token
    return subprocess.run([*SLUICE_ARGV, "admin", "--namesrv", ns.address, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S, check=False)  # fmt: skip


def test_admin_needs_the_token(servers: tuple[ServerProcess, ServerProcess]) -> None:
    ns, _ = servers
    deadline = time.monotonic() + 30.0
    while "broker-a" not in (listing := _admin(ns, TOKEN, "broker", "list")).stdout:  # members talk to each other
        assert time.monotonic() < deadline, listing.stderr
        time.sleep(0.2)
    for wrong in (None, "not-the-token"):
        proc = _admin(ns, wrong, "broker", "list")
        assert proc.returncode == 1
        assert "UNAUTHORIZED" in proc.stderr and "cluster token" in proc.stderr, proc.stderr


def test_broker_refuses_calls_without_the_token(servers: tuple[ServerProcess, ServerProcess]) -> None:
    _, broker = servers

    async def call(with_token: str) -> None:
        token.configure(with_token)
        try:
            async with RemoteBroker("broker-a", broker.address) as remote:
                await remote.list_topics()
        finally:
            token.configure("")

    with pytest.raises(Unauthorized, match="requires the cluster token"):
        asyncio.run(call(""))
    asyncio.run(call(TOKEN))


def test_token_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-a-file\n")
    assert token.from_environment({token.ENV_TOKEN_FILE: str(path), token.ENV_TOKEN: "ignored"}) == "from-a-file"
    assert token.from_environment({token.ENV_TOKEN: " plain "}) == "plain"
    assert token.from_environment({}) == ""


def test_sends_on_the_stream_need_the_token(servers: tuple[ServerProcess, ServerProcess]) -> None:
    """Sends travel on a stream, which the channel's unary interceptor does not see: the stream carries
    the token itself, and the broker refuses one without it with a streaming-shaped answer."""
    _, broker = servers

    async def send(with_token: str) -> list[SendResult]:
        token.configure(with_token)
        try:
            async with RemoteBroker("broker-a", broker.address) as remote:
                if with_token:
                    await remote.create_topic(TopicSpec("token-topic", 1))
                return await remote.send("token-topic", 0, [outgoing(body=b"x", message_id="token-1")])
        finally:
            token.configure("")

    (sent,) = asyncio.run(send(TOKEN))
    assert sent.message_id == "token-1"
    with pytest.raises(Unauthorized, match="requires the cluster token"):
        asyncio.run(send(""))
