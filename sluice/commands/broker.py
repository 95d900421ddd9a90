"""`sluice broker`: run one broker (store, pop engine, internal gRPC service) until SIGTERM/SIGINT.

Configuration comes from the `[broker]` table of `--config` (optional), with flags overriding it
as dotted keys (`--flush` sets `store.commitlog.flush_policy`). Prints exactly one line to stdout
once serving (`broker NAME listening on HOST:PORT`); logs go to stderr. Exits 0 after a clean
shutdown, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

from broker.config import BrokerConfig
from broker.server import run_broker
from common import metrics
from common.config import ConfigError, load_config
from common.logs import setup_logging
from nameserver.client import parse_addresses
from ops.endpoint import serve_part
from processes.runtime import add_log_arguments
from sluice.obsflags import add_observability_arguments, metrics_overrides, trace_overrides
from sluice.tierflags import add_tier_arguments, tier_overrides

NAME = "broker"
HELP = "Run a broker: durable storage of topics and consumer groups behind an internal gRPC service."
FLUSH_POLICIES = ("sync", "async")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file; its [broker] table is used")
    parser.add_argument("--name", help="broker name, unique in the cluster (default broker-a)")
    parser.add_argument("--cluster", help="cluster name registered with the NameServers (default sluice)")
    parser.add_argument(
        "--namesrv",
        metavar="HOST:PORT[;HOST:PORT]",
        help="NameServers to register with; none: a standalone broker",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 10911; 0 picks a free one)")
    parser.add_argument("--advertise", metavar="HOST:PORT", help="address others reach this broker at")
    parser.add_argument("--data-dir", metavar="DIR", help="where the CommitLog and indexes live")
    parser.add_argument(
        "--flush",
        choices=FLUSH_POLICIES,
        help="sync: acknowledge a send after fsync; async (default): fsync on an interval",
    )
    parser.add_argument("--segment-bytes", type=int, metavar="N", help="size of one CommitLog segment file")
    parser.add_argument(
        "--auto-create",
        action="store_true",
        default=None,
        help="create topics and consumer groups on first use",
    )
    parser.add_argument("--metrics-port", type=int, help="HTTP port for /metrics, /healthz, /readyz")
    parser.add_argument("--group", help="broker group to join (replication and failover; needs --etcd)")
    parser.add_argument("--etcd", metavar="URL[,URL]", help="etcd client URLs of the broker group (http://host:port)")
    parser.add_argument(
        "--min-insync", type=int, metavar="N", help="acknowledge writes once N group members hold them (default 1)"
    )
    parser.add_argument("--repl-port", type=int, metavar="P", help="port replicas fetch the CommitLog from (0: free)")
    parser.add_argument(
        "--repl-advertise", metavar="HOST:PORT", help="address replicas dial for the replication port (in etcd)"
    )
    parser.add_argument(
        "--repl-dial",
        action="append",
        metavar="MEMBER=HOST:PORT",
        help="dial MEMBER's replication port here instead of the address it published (repeatable)",
    )
    add_observability_arguments(parser, trace=True)
    add_tier_arguments(parser)
    add_log_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = load_config(
        BrokerConfig,
        section="broker",
        path=args.config,
        overrides={
            "name": args.name,
            "cluster": args.cluster,
            "namesrv": parse_addresses(args.namesrv) if args.namesrv is not None else None,
            "host": args.host,
            "port": args.port,
            "advertise": args.advertise,
            "data_dir": args.data_dir,
            "store.commitlog.flush_policy": args.flush,
            "store.commitlog.segment_bytes": args.segment_bytes,
            "auto_create": args.auto_create,
            "replication.group": args.group,
            "replication.etcd": args.etcd.split(",") if args.etcd else None,
            "replication.min_insync": args.min_insync,
            "replication.port": args.repl_port,
            "replication.advertise": args.repl_advertise,
            "replication.dial": _dial(args.repl_dial) if args.repl_dial else None,
            **metrics_overrides(args),
            **trace_overrides(args),
            **tier_overrides(args),
        },
    )
    setup_logging(args.log_level, args.log_json)
    config.checked_address(f"broker {config.name}")
    metrics.configure(config.metrics)

    def announce(address: str) -> None:
        print(f"broker {config.name} listening on {address}", flush=True)

    async def body(stop: asyncio.Event, on_ready: Callable[..., None]) -> None:
        await run_broker(config, stop, on_ready=on_ready)

    return serve_part("broker", config.host, args.metrics_port, body, announce)


def _dial(pairs: list[str]) -> dict[str, str]:
    """`--repl-dial MEMBER=HOST:PORT` flags as `replication.dial` (the address is checked there)."""
    dial: dict[str, str] = {}
    for pair in pairs:
        member, sep, address = pair.partition("=")
        if not sep or not member:
            raise ConfigError(f"--repl-dial {pair!r}: use MEMBER=HOST:PORT")
        dial[member] = address
    return dial
