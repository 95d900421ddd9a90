"""A real etcd for the replication tests: one member on loopback ports with a temporary data dir.

`start_etcd(tmp_dir)` starts it and returns an `EtcdProcess` (its client URL and the child process);
`require_etcd()` skips the calling test, saying how to install etcd, when the binary is missing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process

INSTALL_HINT = "etcd is not installed: apt-get install etcd-server (Debian/Ubuntu), or put an etcd 3.4+ binary on PATH"


def require_etcd() -> str:
    """The etcd binary's path; skips the test with an install hint when there is none."""
    path = shutil.which("etcd")
    if path is None:
        pytest.skip(INSTALL_HINT)
    return path


@dataclass
class EtcdProcess:
    child: ChildProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def stop(self) -> None:
        self.child.stop()


def start_etcd(tmp_dir: Path, *, name: str = "etcd") -> EtcdProcess:
    binary = require_etcd()
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://{LOOPBACK}:{client}", f"http://{LOOPBACK}:{peer}"
    argv = [
        binary,
        "--name", name,
        "--data-dir", str(tmp_dir / f"{name}-data"),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"{name}={peer_url}",
        "--log-level", "warn",
    ]  # fmt: skip
    child = start_process(argv, port=client, log_path=tmp_dir / f"{name}.log", name=name)
    return EtcdProcess(child, client)
