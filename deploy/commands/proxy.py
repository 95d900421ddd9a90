"""`sluice proxy`: run a proxy of the separated topology until SIGTERM/SIGINT.

It serves `apache.rocketmq.v2.MessagingService` to the official clients and reaches brokers
through the routes the NameServers report. Configuration: the `[proxy]` table of `--config`, with
flags overriding it. Prints one line once listening (`proxy listening on HOST:PORT`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from common.config import load_config
from common.errors import Unavailable
from common.logs import setup_logging
from deploy.runtime import serve
from nameserver.client import NameServerClient, parse_addresses
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.directory import ClusterDirectory
from proxy.server import serve_proxy

NAME = "proxy"
HELP = "Run a proxy: the RocketMQ 5 gRPC endpoint for clients, in front of brokers."
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file; its [proxy] table is used")
    parser.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]", help="NameServer address(es)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8081)")
    parser.add_argument("--advertise", metavar="HOST:PORT", help="endpoint put in routes (default host:port)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines instead of text")


def run(args: argparse.Namespace) -> int:
    namesrv = parse_addresses(args.namesrv) if args.namesrv else None
    config = load_config(
        ProxyConfig, section="proxy", path=args.config,
        overrides={"host": args.host, "port": args.port, "advertise": args.advertise, "namesrv": namesrv},
    )  # fmt: skip
    if not config.namesrv:
        print("sluice proxy: --namesrv is required (or [proxy] namesrv in the config file)")
        return 2
    setup_logging(args.log_level, args.log_json)

    async def main(stop: asyncio.Event) -> int:
        directory = ClusterDirectory(NameServerClient(config.namesrv), refresh_s=config.route_refresh_s)
        with contextlib.suppress(Unavailable):
            await directory.refresh_brokers()
        directory.start()
        try:
            app = ProxyApp(config, directory)
            await serve_proxy(app, stop, on_ready=lambda a: print(f"proxy listening on {a}", flush=True))
        finally:
            await directory.close()
        return 0

    return serve(main)
