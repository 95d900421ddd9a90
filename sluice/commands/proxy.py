"""`sluice proxy`: run a proxy of the separated topology until SIGTERM/SIGINT.

It serves `apache.rocketmq.v2.MessagingService` to the official clients and reaches brokers
through the routes the NameServers report. With `--navigation` it joins the fleet: it announces
itself (zone, endpoint per network, load) and advertises the fleet's endpoints in routes; on
SIGTERM it drains (see proxy/server.py). `--workers N` (default: the cores it may use) runs N
processes on one port under this one (processes/workerpool.py), with one metrics endpoint for all.
Configuration: the `[proxy]` table of `--config`, flags override it. Prints one line once
listening (`proxy listening on HOST:PORT`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from common import metrics
from common.config import ConfigError, load_config
from common.errors import Unavailable
from common.logs import setup_logging
from nameserver.client import NameServerClient, parse_addresses
from navigation.client import parse_addresses as parse_navigation
from ops.endpoint import Readiness, ops_server
from processes.runtime import add_log_arguments, die_with_parent, serve
from processes.workerpool import WorkerPool, log_flags, worker_count
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.directory import ClusterDirectory
from proxy.server import serve_proxy
from sluice.obsflags import add_observability_arguments, metrics_overrides
from sluice.proxyflags import add_amqp_argument, add_mqtt_arguments, mqtt_overrides, security_overrides

NAME = "proxy"
HELP = "Run a proxy: the RocketMQ 5 gRPC endpoint for clients, in front of brokers."
# A worker's operations endpoint: loopback only, for its parent.
OPS_HOST = "127.0.0.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file; its [proxy] table is used")
    parser.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]", help="NameServer address(es)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8081)")
    parser.add_argument("--navigation", metavar="HOST:PORT[;HOST:PORT]", help="navigation server(s) to join")
    parser.add_argument("--zone", help="this proxy's zone (clients in the same zone are sent here first)")
    parser.add_argument(
        "--advertise", action="append", metavar="[NETWORK=]HOST:PORT",
        help="endpoint clients use to reach this proxy, per network (repeatable; default: host:port on 'default')",
    )  # fmt: skip
    parser.add_argument(
        "--peers", metavar="HOST:PORT[;HOST:PORT]",
        help="without navigation: the other proxies, listed in routes after this one (clients fail over to them)",
    )  # fmt: skip
    parser.add_argument("--proxy-id", help="identity in navigation (default: endpoint-pid)")
    parser.add_argument("--drain-s", type=float, help="after SIGTERM keep serving this long (with navigation or peers)")
    parser.add_argument(
        "--workers", type=int,
        help="processes serving the port (SO_REUSEPORT), one core each (default: the cores this process may use)",
    )  # fmt: skip
    # Set by the parent of workers (processes/workerpool.py), not by people.
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ops-file", help=argparse.SUPPRESS)
    parser.add_argument("--auth", choices=("on", "off"), help="require signed requests and access rules (default off)")
    parser.add_argument(
        "--tls-cert", metavar="PEM", help="serve clients over TLS with this certificate (and --tls-key)"
    )
    parser.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    parser.add_argument("--metrics-port", type=int, help="HTTP port for /metrics, /healthz, /readyz (worker i: +i)")
    add_amqp_argument(parser, "default: off")
    add_mqtt_arguments(parser, "default: off")
    add_observability_arguments(parser, trace=False)
    add_log_arguments(parser)


def _advertise(values: list[str] | None) -> tuple[str | None, dict[str, str] | None]:
    if not values:
        return None, None
    networks: dict[str, str] = {}
    default: str | None = None
    for value in values:
        network, sep, endpoint = value.partition("=")
        if not sep:
            default, network, endpoint = value, "default", value
        if not network or ":" not in endpoint:
            raise ConfigError(f"--advertise {value!r}: use NETWORK=HOST:PORT or HOST:PORT")
        networks[network] = endpoint
    return default or networks.get("default"), networks


def run(args: argparse.Namespace) -> int:
    worker = args.supervisor_pid is not None
    if worker:
        die_with_parent(args.supervisor_pid)
    workers = 1 if worker else worker_count(args.workers)
    default_endpoint, networks = _advertise(args.advertise)
    config = load_config(
        ProxyConfig, section="proxy", path=args.config,
        overrides={
            "host": args.host, "port": args.port, "advertise": default_endpoint, "networks": networks,
            "namesrv": parse_addresses(args.namesrv) if args.namesrv else None,
            "navigation": parse_navigation(args.navigation) if args.navigation else None, "zone": args.zone,
            "peers": parse_navigation(args.peers) if args.peers else None,
            "proxy_id": args.proxy_id, "drain_s": args.drain_s, "reuse_port": args.reuse_port or None,
            "metrics_port": args.metrics_port, **metrics_overrides(args),
            **security_overrides(args), "amqp.port": args.amqp_port, **mqtt_overrides(args),
        },
    )  # fmt: skip
    if config.tls.enabled:
        config.tls.read()  # a missing certificate is a one-line error before anything starts
    if not config.namesrv:
        raise ConfigError("--namesrv is required (or namesrv in the [proxy] table of the config file)")
    if config.reuse_port and config.proxy_id:
        config = replace(config, proxy_id=f"{config.proxy_id}-w{args.worker_index}")
    setup_logging(args.log_level, args.log_json)
    config.checked_address("proxy")
    metrics.configure(config.metrics)
    if workers > 1:
        return serve_workers(config, workers, log_flags(args.log_level, args.log_json))
    if worker:
        ops_file = args.ops_file
        return serve(lambda stop: serve_one(config, stop, ops_file=ops_file))
    return serve(lambda stop: serve_one(config, stop, on_listening=print_listening))


def print_listening(address: str) -> None:
    print(f"proxy listening on {address}", flush=True)


async def serve_one(
    config: ProxyConfig,
    stop: asyncio.Event,
    *,
    on_listening: Callable[[str], None] | None = None,
    ops_file: str | None = None,
) -> int:
    """One proxy process. A worker (`ops_file`) serves its operations endpoint on an ephemeral
    loopback port and writes that port to `ops_file` for its parent, which announces the pool."""
    readiness = Readiness()
    readiness.set("proxy", False)
    directory = ClusterDirectory(NameServerClient(config.namesrv), refresh_s=config.route_refresh_s,
                                 brokers=config.brokers, topics_max=config.caches.topics_max,
                                 auto_create=config.auto_create_topics)  # fmt: skip
    with contextlib.suppress(Unavailable):
        await directory.refresh_brokers()
    directory.start()

    def ops_ready(port: int) -> None:
        assert ops_file is not None
        Path(ops_file).write_text(f"{OPS_HOST}:{port}\n")

    try:
        ops = (ops_server(OPS_HOST, 0, readiness, on_ready=ops_ready) if ops_file
               else ops_server(config.host, config.metrics_port, readiness))  # fmt: skip
        async with ops:
            await serve_proxy(ProxyApp(config, directory), stop, on_ready=on_listening,
                              on_readiness=lambda ok: readiness.set("proxy", ok))  # fmt: skip
    finally:
        await directory.close()
    return 0


def serve_workers(config: ProxyConfig, count: int, log_flags: list[str]) -> int:
    """`count` workers serving `config`; this process supervises them and serves the operations
    endpoint (`metrics_port`) for all of them."""
    pool = WorkerPool(config, count, log_flags)

    async def main(stop: asyncio.Event) -> int:
        async with ops_server(config.host, config.metrics_port, Readiness(), children=pool):
            return await pool.run(stop, on_ready=lambda: print_listening(
                f"{config.host}:{config.port} ({count} workers)"))  # fmt: skip

    return serve(main)
