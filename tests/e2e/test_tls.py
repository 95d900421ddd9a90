"""TLS on the client port: a self-signed certificate made in the test (openssl CLI), proxies started
with `--tls-cert/--tls-key`, and the official Python client with `tls_enable=True` sending and
receiving (merged and separated topologies). A plain-text client cannot talk to the TLS port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.support import raw
from tests.e2e.support.cluster import Cluster, start_merged, start_separated
from tests.helpers.procs import REPO_ROOT
from tests.helpers.tls import self_signed

CLIENT_TIMEOUT_S = 120.0


@pytest.fixture(scope="module", params=["merged", "separated"])
def tls_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, Path]]:
    root = tmp_path_factory.mktemp(f"tls-{request.param}")
    cert, key = self_signed(root)
    args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    cluster = (
        start_merged(root, extra_args=args) if request.param == "merged" else start_separated(root, proxy_args=args)
    )
    try:
        yield cluster, cert
    finally:
        problems = cluster.stop()
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


def test_official_client_over_tls(tls_cluster: tuple[Cluster, Path]) -> None:
    cluster, cert = tls_cluster
    suffix = uuid.uuid4().hex[:8]
    topic, group = cluster.create_topic(f"tls-{suffix}"), cluster.create_group(f"tls-g-{suffix}")
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        # One access point: for a `a;b` list the Python client makes one gRPC target of both
        # addresses, whose TLS authority no certificate can match (see docs/security.md).
        [sys.executable, "-m", "tests.e2e.support.tls_client", cluster.first_proxy, topic, group, "3"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["sent"]) == 3 and sorted(result["sent"]) == sorted(result["received"])


def test_plain_text_is_refused_on_the_tls_port(tls_cluster: tuple[Cluster, Path]) -> None:
    cluster, _ = tls_cluster
    with raw.stub(cluster.first_proxy) as s, pytest.raises(grpc.RpcError) as info:
        raw.query_route(s, "anything")
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)  # type: ignore[attr-defined]
