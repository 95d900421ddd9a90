"""`sluice nameserver`: run one NameServer (broker registry and topic routes) until SIGTERM/SIGINT.

Configuration comes from the `[nameserver]` table of `--config` (optional), with flags overriding
it. Prints exactly one line to stdout once listening (`nameserver listening on HOST:PORT`); logs go
to stderr. Exits 0 after a clean shutdown, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio

from common.config import load_config
from common.logs import setup_logging
from deploy.ops import Readiness, ops_server
from deploy.runtime import serve
from nameserver.config import NameServerConfig
from nameserver.service import run_nameserver

NAME = "nameserver"
HELP = "Run a NameServer: the broker registry and topic routes."
LOG_LEVELS = ("debug", "info", "warning", "error")


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
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines instead of text")


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

    async def main(stop: asyncio.Event) -> int:
        readiness = Readiness()
        readiness.set("nameserver", False)

        def ready(address: str) -> None:
            announce(address)
            readiness.set("nameserver", True)

        async with ops_server(config.host, args.metrics_port, readiness):
            await run_nameserver(config, stop, on_ready=ready)
        return 0

    return serve(main)
