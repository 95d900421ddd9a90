"""`sluice admin user|acl|limit` against a real NameServer and two brokers: the security document
lands on every broker, survives a SIGKILL of a broker, never moves back in version, and never
shows a secret; bad input is a one-line error with the right code. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.client.remote import RemoteBroker
from common.errors import PreconditionFailed
from common.security import Action, Effect, LimitScope, decode
from tests.helpers.broker_fixtures import (
    SLUICE_ARGV,
    ServerProcess,
    start_broker_process,
    start_nameserver_process,
)
from tests.helpers.procs import REPO_ROOT

pytestmark = pytest.mark.slow

SECRET = "very-secret-value-42"
ADMIN_TIMEOUT_S = 60.0


@dataclass
class Cluster:
    root: Path
    nameserver: ServerProcess
    brokers: dict[str, ServerProcess]

    def admin(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [*SLUICE_ARGV, "admin", "--namesrv", self.nameserver.address, *args]
        return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, input=stdin,
                              timeout=ADMIN_TIMEOUT_S, check=False)  # fmt: skip

    def ok(self, *args: str) -> Any:
        proc = self.admin(*args, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("security")
    nameserver = start_nameserver_process(root)
    brokers: dict[str, ServerProcess] = {}
    try:
        for name in ("broker-a", "broker-b"):
            brokers[name] = start_broker_process(root, name=name, namesrv=nameserver.address)
        c = Cluster(root, nameserver, brokers)
        _wait(lambda: len(c.ok("broker", "list")) == 2)
        yield c
    finally:
        for proc in [*brokers.values(), nameserver]:
            proc.stop()


def _wait(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def _copies(cluster: Cluster) -> dict[str, tuple[int, bytes]]:
    async def body() -> dict[str, tuple[int, bytes]]:
        out = {}
        for name, proc in cluster.brokers.items():
            async with RemoteBroker(name, proc.address) as remote:
                out[name] = await remote.get_security()
        return out

    return asyncio.run(body())


def test_edits_reach_every_broker_and_secrets_are_never_printed(cluster: Cluster) -> None:
    created = cluster.admin("user", "create", "alice", "--secret", SECRET)
    assert created.returncode == 0, created.stderr
    assert SECRET not in created.stdout + created.stderr
    assert cluster.admin("user", "create", "bob", "--secret", "-", stdin="bob-secret\n").returncode == 0
    cluster.ok("acl", "grant", "alice", "--namespace", "ns1", "--resource", "topic:ord*", "--actions", "PUB,SUB")
    cluster.ok("acl", "grant", "alice", "--namespace", "ns1", "--resource", "topic:orders-x", "--actions", "PUB",
               "--deny")  # fmt: skip
    cluster.ok("limit", "set", "--namespace", "ns1", "--topic", "orders", "--messages-per-s", "50")

    users = cluster.ok("user", "list")
    assert users == [{"access_key": "alice", "rules": 2}, {"access_key": "bob", "rules": 0}]
    listing = cluster.admin("user", "list")
    assert SECRET not in listing.stdout and "bob-secret" not in listing.stdout
    rules = cluster.ok("acl", "list", "alice")
    assert {(r["resource"], r["actions"], r["effect"]) for r in rules} == {
        ("topic:ord*", "PUB,SUB", "allow"),
        ("topic:orders-x", "PUB", "deny"),
    }
    assert cluster.ok("limit", "list") == [
        {"scope": "topic", "namespace": "ns1", "name": "orders", "messages_per_s": 50.0, "bytes_per_s": 0.0}
    ]

    copies = _copies(cluster)
    assert len(set(copies.values())) == 1, "every broker holds the same version"
    version, data = copies["broker-a"]
    doc = decode(data)
    assert version == 5
    assert doc.user("alice") is not None and doc.user("alice").secret == SECRET  # type: ignore[union-attr]
    deny = [r for r in doc.rules if r.effect is Effect.DENY]
    assert [(r.pattern.text(), r.actions) for r in deny] == [("topic:orders-x", frozenset({Action.PUB}))]
    assert [x.scope for x in doc.limits] == [LimitScope.TOPIC]

    cluster.ok("acl", "revoke", "alice", "--namespace", "ns1", "--resource", "topic:ord*", "--actions", "SUB")
    assert {r["actions"] for r in cluster.ok("acl", "list", "alice") if r["resource"] == "topic:ord*"} == {"PUB"}


def test_a_broker_never_takes_an_older_version(cluster: Cluster) -> None:
    async def body() -> None:
        proc = cluster.brokers["broker-a"]
        async with RemoteBroker("broker-a", proc.address) as remote:
            version, data = await remote.get_security()
            with pytest.raises(PreconditionFailed, match="changed meanwhile"):
                await remote.put_security(version, data)
            with pytest.raises(PreconditionFailed):
                await remote.put_security(max(version - 1, 0), b"{}")
            assert await remote.get_security() == (version, data)

    asyncio.run(body())


def test_document_survives_sigkill(cluster: Cluster) -> None:
    cluster.ok("user", "create", "carol", "--secret", "carol-secret")
    before = _copies(cluster)["broker-a"]
    old = cluster.brokers["broker-a"]
    old.child.signal(signal.SIGKILL)
    old.child.popen.wait(timeout=30)
    cluster.brokers["broker-a"] = start_broker_process(
        cluster.root, name="broker-a", namesrv=cluster.nameserver.address
    )
    assert _copies(cluster)["broker-a"] == before
    assert "carol" in {u["access_key"] for u in cluster.ok("user", "list")}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("acl", "grant", "nobody", "--resource", "topic:t", "--actions", "PUB"),
            "NOT_FOUND: user nobody does not exist",
        ),
        (("acl", "grant", "alice", "--resource", "queue:t", "--actions", "PUB"), "BAD_REQUEST: resource 'queue:t'"),
        (("acl", "grant", "alice", "--resource", "topic:t", "--actions", "WRITE"), "BAD_REQUEST: actions"),
        (("user", "create", "alice", "--secret", "again"), "BAD_REQUEST: user alice already exists"),
        (("user", "create", "bad key!", "--secret", "x"), "BAD_REQUEST: access key"),
        (("limit", "set", "--group", "g", "--bytes-per-s", "5"), "BAD_REQUEST: a group limit"),
        (("user", "delete", "nobody"), "NOT_FOUND: user nobody does not exist"),
    ],
)
def test_bad_input_is_one_line_with_its_code(cluster: Cluster, args: tuple[str, ...], expected: str) -> None:
    cluster.admin("user", "create", "alice", "--secret", SECRET)  # exists, whichever tests ran first
    proc = cluster.admin(*args)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr


def test_admin_namespace_option_names_namespaced_resources(cluster: Cluster) -> None:
    cluster.ok("topic", "create", "orders", "--namespace", "tenant1", "--queues", "2")
    cluster.ok("group", "create", "billing", "--namespace", "tenant1")
    assert "tenant1%orders" in {t["topic"] for t in cluster.ok("topic", "list")}
    assert cluster.ok("topic", "describe", "orders", "--namespace", "tenant1")
    assert "tenant1%billing" in {g["group"] for g in cluster.ok("group", "list")}
    bad = cluster.admin("topic", "create", "x", "--namespace", "bad%ns")
    assert bad.returncode == 1 and "BAD_REQUEST: namespace 'bad%ns'" in bad.stderr
    cluster.ok("topic", "delete", "orders", "--namespace", "tenant1")
    assert "tenant1%orders" not in {t["topic"] for t in cluster.ok("topic", "list")}
