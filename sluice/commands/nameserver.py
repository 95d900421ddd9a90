"""`sluice nameserver`: run one NameServer (broker registry and topic routes) until SIGTERM/SIGINT.

Configuration comes from the `[nameserver]` table of `--config` (optional), with flags overriding
it. Prints exactly one line to stdout once listening (`nameserver listening on HOST:PORT`); logs go
to stderr. Exits 0 after a clean shutdown, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

from common.config import load_config
from common.logs import setup_logging
from nameserver.config import NameServerConfig
from nameserver.service import run_nameserver
from ops.endpoint import serve_part
from processes.runtime import add_log_arguments

NAME = "nameserver"
HELP = "Run a NameServer: the broker registry and topic routes."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file; its [nameserver] table is used")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 9876; 0 picks a free one)")
    parser.add_argument(
        "--broker-expiry-s",
        type=float,
        metavar="S",
        help="drop a broker from every route after this many seconds without a heartbeat (default 120)",
    )
    parser.add_argument("--metrics-port", type=int, help="HTTP port for /metrics, /healthz, /readyz")
    add_log_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = load_config(
        NameServerConfig,
        section="nameserver",
        path=args.config,
        overrides={"host": args.host, "port": args.port, "broker_expiry_s": args.broker_expiry_s},
    )
    setup_logging(args.log_level, args.log_json)

    def announce(address: str) -> None:
        print(f"nameserver listening on {address}", flush=True)

    async def body(stop: asyncio.Event, on_ready: Callable[..., None]) -> None:
        await run_nameserver(config, stop, on_ready=on_ready)

    return serve_part("nameserver", config.host, args.metrics_port, body, announce)
