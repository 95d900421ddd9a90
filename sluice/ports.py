"""Checking that the ports a process is about to serve are free, before anything starts.

`sluice up` serves four ports (client, NameServer, broker, ops). Without a check, a second
instance on the same ports failed in one part while the others were starting and printed every
part's traceback; with it the command says in one line which ports are taken and exits 2.
A check is not a reservation (another process may take a port in between): the servers still
fail cleanly on their own when their bind fails.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from common.config import ConfigError


def _in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Not SO_REUSEADDR's relaxed meaning on every platform: only a listening socket conflicts.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def is_free(host: str, port: int) -> bool:
    return not _in_use(host, port)


def require_free(ports: Sequence[tuple[str, str, int]], hint: str) -> None:
    """ConfigError naming every (what, host, port) already in use, in one line; port 0 is skipped."""
    taken = [f"{what} {host}:{port}" for what, host, port in ports if port and _in_use(host, port)]
    if taken:
        raise ConfigError(f"port(s) already in use: {', '.join(taken)}; {hint}")
