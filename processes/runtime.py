"""Running a long-lived component as a process: event loop, signals, clean shutdown, log flags.

`serve(main)` runs `main(stop)` on uvloop (when available); `stop` is an `asyncio.Event` set on
SIGTERM or SIGINT, after which `main` is expected to shut its component down and return.
`add_log_arguments(parser)` adds the `--log-level` and `--log-json` flags every command takes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Awaitable, Callable

from common import frozen

log = logging.getLogger("sluice.runtime")

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines instead of text")


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# Objects that exist once the process has started (modules, config, servers) are moved out of the
# collector's reach: a full collection otherwise stalls the event loop for ~20 ms (measured under
# load with tests/bench/proxy_bench.py), which dominated p99 latency.
SETTLE_AFTER_S = 5.0


def _settle() -> None:
    frozen.freeze()  # a broker member releases what it drops later (common/frozen.py)


def serve(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    install_uvloop()

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _on_signal, stop, sig)
        loop.call_later(SETTLE_AFTER_S, _settle)
        return await main(stop)

    return asyncio.run(runner())


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_parent_death_signal(sig: signal.Signals) -> None:
    """Linux: have the kernel send `sig` to this process when its parent exits (prctl
    PR_SET_PDEATHSIG); elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def die_with_parent(parent_pid: int) -> None:
    """A supervised child: SIGKILL when the supervisor `parent_pid` exits, and exit at once if it
    already has (it may have died before the signal was armed)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        raise SystemExit(f"supervisor {parent_pid} is gone; exiting")


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    if not stop.is_set():
        log.info("received %s, shutting down", sig.name)
    stop.set()
