"""`sluice console`: the operator's console in the browser, until SIGTERM/SIGINT.

    sluice console --namesrv HOST:PORT [--navigation HOST:PORT] [--port 8080] [--host H]
                   [--auth on|off] [--read-only] [--prometheus URL] [--config FILE]

Configuration: the `[console]` table of `--config`, flags overriding it (console/config.py).
Prints one line once listening (`console listening on http://HOST:PORT`). See docs/console.md.
"""

from __future__ import annotations

import argparse
import asyncio

from common.config import ConfigError, load_config
from common.logs import setup_logging
from console.config import ConsoleConfig
from console.server import run_console
from processes.runtime import add_log_arguments, serve

NAME = "console"
HELP = "Serve the operator's console (cluster, topics, groups, messages, dead letters, access) over HTTP."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file; its [console] table is used")
    parser.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]", help="NameServers (default 127.0.0.1:9876)")
    parser.add_argument("--navigation", metavar="HOST:PORT", help="navigation server whose proxies to list")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port (default 8080; 0 picks a free one)")
    parser.add_argument("--auth", choices=("on", "off"), help="require a login of a Sluice admin user (default off)")
    parser.add_argument("--read-only", action="store_true", default=None, help="show, never change")
    parser.add_argument("--prometheus", metavar="URL", help="read plots from this Prometheus (default: own samples)")
    add_log_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = load_config(ConsoleConfig, section="console", path=args.config, overrides={
        "namesrv": args.namesrv, "navigation": args.navigation, "host": args.host, "port": args.port,
        "auth": args.auth, "read_only": args.read_only, "prometheus": args.prometheus})  # fmt: skip
    setup_logging(args.log_level, args.log_json)

    async def main(stop: asyncio.Event) -> int:
        try:
            await run_console(config, stop, on_ready=lambda url: print(f"console listening on {url}", flush=True))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
        return 0

    return serve(main)
