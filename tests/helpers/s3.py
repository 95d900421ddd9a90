"""A real S3-compatible server (moto) on loopback for the tiering tests, with outages on demand.

`MotoS3Server` serves moto's WSGI application with werkzeug's threaded server on 127.0.0.1 (the
port comes from binding 0). `stop()` closes the listening socket and every open connection, so
clients see refused or reset connections, as in a real outage, never a hang; `start()` serves again
on the same port with the same buckets and objects (moto's backends live in this process).

Fixtures (use with `pytest_plugins = ["tests.helpers.s3"]` in a test module):
- `s3_server` (session): the running server; stopped at the end of the session. `requests()` lists
  the (method, path) of every request it served, so tests can count GETs.
- `s3_config`: a `TieringConfig` for a fresh bucket of the test, with short timeouts and one attempt
  per call; the server is running again after the test even if the test stopped it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import BaseWSGIServer, make_server

from broker.tiering.config import TieringConfig
from tests.helpers.procs import LOOPBACK

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
_STOP_TIMEOUT_S = 10.0


class _TrackingHandler(MotoRequestHandler):
    """Records its connection on the server, so `stop()` can cut it."""

    def setup(self) -> None:
        super().setup()
        self.server.open_connections.add(self.connection)

    def finish(self) -> None:
        self.server.open_connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_request(self, *args: Any, **kwargs: Any) -> None:  # one line per request is noise in tests
        with self.server.request_log_lock:  # type: ignore[attr-defined]
            self.server.request_log.append((self.command, self.path))  # type: ignore[attr-defined]


class MotoS3Server:
    def __init__(self) -> None:
        self.port = 0
        self._app = DomainDispatcherApplication(create_backend_app)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._request_log: list[tuple[str, str]] = []  # (method, path) of every request served
        self._request_log_lock = threading.Lock()
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        assert self._server is None, "already running"
        server = make_server(LOOPBACK, self.port, self._app, threaded=True, request_handler=_TrackingHandler)
        server.open_connections = set()  # type: ignore[attr-defined]
        server.request_log = self._request_log  # type: ignore[attr-defined]
        server.request_log_lock = self._request_log_lock  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Refuse new connections and cut open ones (an outage); state is kept for `start()`."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for conn in list(server.open_connections):  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(_STOP_TIMEOUT_S)

    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request served so far (path-style: `/bucket/key?query`)."""
        with self._request_log_lock:
            return list(self._request_log)

    def clear_requests(self) -> None:
        with self._request_log_lock:
            self._request_log.clear()

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.stop()
        try:
            yield
        finally:
            self.start()

    def client(self) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name=REGION,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        )  # fmt: skip


_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoS3Server]:
    server = MotoS3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_config(s3_server: MotoS3Server, request: pytest.FixtureRequest) -> Iterator[TieringConfig]:
    digest = hashlib.sha1(request.node.nodeid.encode(), usedforsecurity=False).hexdigest()[:12]
    bucket = f"sluice-{digest}-{next(_bucket_numbers)}"
    s3_server.client().create_bucket(Bucket=bucket)
    try:
        yield TieringConfig(
            endpoint_url=s3_server.endpoint_url, region=REGION, bucket=bucket, prefix="archive",
            access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, addressing_style="path",
            connect_timeout_s=2.0, read_timeout_s=5.0, max_attempts=1, retry_initial_s=0.05, retry_max_s=0.2,
        )  # fmt: skip
    finally:
        if not s3_server.running:
            s3_server.start()
