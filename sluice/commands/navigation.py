"""`sluice navigation`: run one navigation server (proxy endpoints for clients) until SIGTERM/SIGINT.

Configuration comes from the `[navigation]` table of `--config` (optional), with flags overriding
it. Prints exactly one line to stdout once both ports listen
(`navigation listening on HOST:PORT (gRPC) and http://HOST:PORT (HTTP)`); logs go to stderr.
Exits 0 after a clean shutdown, 2 on a configuration error (including a port it cannot bind).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

from common.config import load_config
from common.logs import setup_logging
from navigation.config import NavigationConfig
from navigation.service import run_navigation
from ops.endpoint import serve_part
from processes.runtime import add_log_arguments

NAME = "navigation"
HELP = "Run a navigation server: tells clients which proxy endpoints to use."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file; its [navigation] table is used")
    parser.add_argument("--host", help="address both services listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port (default 9877; 0 picks a free one)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 9878; 0 picks a free one)")
    parser.add_argument(
        "--proxy-expiry-s",
        type=float,
        metavar="S",
        help="leave a proxy out of every answer after this many seconds without a heartbeat (default 15)",
    )
    parser.add_argument("--metrics-port", type=int, help="HTTP port for /metrics, /healthz, /readyz")
    add_log_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = load_config(
        NavigationConfig,
        section="navigation",
        path=args.config,
        overrides={
            "host": args.host,
            "port": args.port,
            "http_port": args.http_port,
            "proxy_expiry_s": args.proxy_expiry_s,
        },
    )
    setup_logging(args.log_level, args.log_json)

    def announce(grpc_address: str, http_url: str) -> None:
        print(f"navigation listening on {grpc_address} (gRPC) and {http_url} (HTTP)", flush=True)

    async def body(stop: asyncio.Event, on_ready: Callable[..., None]) -> None:
        await run_navigation(config, stop, on_ready=on_ready)

    return serve_part("navigation", config.host, args.metrics_port, body, announce)
