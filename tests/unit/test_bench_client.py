"""The load generator signs its requests exactly as the official Python client does."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.client import signed_headers
from common.security import SecurityDoc, User
from proxy.core.auth import AccessControl, AuthSettings

SECOND = 1_795_000_000  # 2026-11-18T11:06:40Z


def test_signed_headers_are_the_official_clients_for_that_second() -> None:
    headers = dict(signed_headers("bench", "bench-secret", SECOND))
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(SECOND))
    assert headers["x-mq-date-time"] == date_time
    # The signature the official client computes (rocketmq/v5/util/signature.py) for that date-time;
    # in a child process, as the client's protobuf modules clash with ours in one process.
    code = f"from rocketmq.v5.util.signature import Signature; print(Signature.sign('bench-secret', '{date_time}'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    official = done.stdout.strip()
    assert len(official) == 40
    assert headers["authorization"] == (
        f"MQv2-HMAC-SHA1 Credential=bench, SignedHeaders=x-mq-date-time, Signature={official}"
    )


def test_signed_headers_are_accepted_by_the_proxy_and_change_every_second() -> None:
    access = AccessControl(AuthSettings(60.0, 100, 100))
    access.update(SecurityDoc(1, (User("bench", "bench-secret"),)))
    for second in (SECOND, SECOND + 1):
        headers = dict(signed_headers("bench", "bench-secret", second))
        assert access.authenticate(headers["authorization"], headers["x-mq-date-time"]) == "bench"
    assert signed_headers("bench", "bench-secret", SECOND) == signed_headers("bench", "bench-secret", SECOND)
    assert signed_headers("bench", "bench-secret", SECOND) != signed_headers("bench", "bench-secret", SECOND + 1)
