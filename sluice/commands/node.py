"""`sluice node`: one merged node (a broker and its own proxy in one process) of a cluster whose
NameServer runs elsewhere (docs/shards.md).

The broker registers with `--namesrv` together with the node's client endpoint; the proxy serves
its own broker in-process and the other nodes' brokers over their internal gRPC service, and its
routes send each client straight to the node that owns a queue. `sluice up --shards N` runs N of
these under one command; on other machines the same command joins that cluster. Configuration:
the `[broker]` and `[proxy]` tables of `--config`, with flags overriding them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from dataclasses import replace
from pathlib import Path

from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.server import run_broker
from common import metrics
from common.addresses import parse_advertise
from common.config import ConfigError, load_config, read_toml
from common.errors import Unavailable
from common.logs import kv, setup_logging
from nameserver.client import NameServerClient, parse_addresses
from ops.endpoint import Readiness, ops_server
from processes.runtime import add_log_arguments, die_with_parent, serve
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.directory import ClusterDirectory
from proxy.server import serve_proxy
from proxy.shards import ForwardedBroker, ShardDirectory
from sluice.commands.up import STARTUP_TIMEOUT_S
from sluice.obsflags import add_observability_arguments, metrics_overrides, trace_overrides
from sluice.proxyflags import add_mqtt_arguments, mqtt_overrides, security_overrides
from sluice.tierflags import add_tier_arguments, tier_overrides

NAME = "node"
HELP = "Run one merged node (broker + its own proxy) joining the cluster of a NameServer (--namesrv)."
log = logging.getLogger("sluice.node")
AWAIT_NODES_POLL_S = 0.2
OPS_HOST = "127.0.0.1"  # a supervised node's operations endpoint: loopback only, for its parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with [broker] and [proxy] tables")
    parser.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]", help="NameServer(s) of the cluster to join")
    parser.add_argument("--name", help="broker name of this node, unique in the cluster (default broker-a)")
    parser.add_argument("--data-dir", metavar="DIR", help="where this node's broker keeps its data")
    parser.add_argument("--host", help="address the node listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="client (proxy) port (default 8081)")
    parser.add_argument("--broker-port", type=int, help="broker's internal port (default 10911)")
    parser.add_argument(
        "--advertise", metavar="HOST[:PORT]",
        help="address other machines reach this node at: its client endpoint in routes (HOST alone: with --port); its "
        "broker is advertised on the same host (default: --host; with 0.0.0.0 the machine's one address)",
    )  # fmt: skip
    parser.add_argument("--flush", choices=("sync", "async"), help="acknowledge after fsync (sync) or write (async)")
    parser.add_argument("--no-auto-create", action="store_true", help="do not create topics and groups on first use")
    parser.add_argument("--auth", choices=("on", "off"), help="require signed requests and access rules (default off)")
    parser.add_argument("--tls-cert", metavar="PEM", help="serve clients over TLS with this certificate")
    parser.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    add_mqtt_arguments(parser, "default: off")
    parser.add_argument("--metrics-port", type=int, help="HTTP port for /metrics, /healthz, /readyz (0: off)")
    add_observability_arguments(parser, trace=True)
    add_tier_arguments(parser)
    add_log_arguments(parser)
    # Set by `sluice up --shards N` (processes/shardpool.py), not by people.
    parser.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ops-file", help=argparse.SUPPRESS)
    parser.add_argument("--await-nodes", type=int, default=1, help=argparse.SUPPRESS)


def configs(args: argparse.Namespace) -> tuple[BrokerConfig, ProxyConfig]:
    """The node's broker and proxy configuration; both know the NameServers, and the broker
    registers the proxy's client endpoint."""
    data = read_toml(args.config) if args.config else {}
    namesrv = parse_addresses(args.namesrv) if args.namesrv else None
    proxy = load_config(ProxyConfig, section="proxy", data=data, overrides={
        "host": args.host, "port": args.port, "advertise": args.advertise, "namesrv": namesrv,
        "metrics_port": args.metrics_port, **metrics_overrides(args), **security_overrides(args),
        **mqtt_overrides(args)})  # fmt: skip
    broker = load_config(
        BrokerConfig, section="broker", data=data,
        overrides={
            "name": args.name, "host": args.host, "port": args.broker_port, "data_dir": args.data_dir,
            "namesrv": namesrv, "auto_create": _auto_create(args, data),
            "store.commitlog.flush_policy": args.flush,
            **metrics_overrides(args), **trace_overrides(args), **tier_overrides(args),
        },
    )  # fmt: skip
    if not broker.namesrv:
        raise ConfigError("--namesrv is required (or namesrv in the [broker] table of the config file)")
    if not proxy.namesrv:
        proxy = replace(proxy, namesrv=broker.namesrv)
    if proxy.advertise and not broker.advertise:  # one machine, one address: the broker's is the proxy's host
        broker = replace(broker, advertise=parse_advertise(proxy.advertise)[0])
    return replace(broker, client_endpoint=proxy.advertised_address), proxy


def _auto_create(args: argparse.Namespace, data: dict[str, object]) -> bool | None:
    """Off with --no-auto-create, else as `[broker] auto_create` of the file says (None: no
    override), else on: a node creates topics and groups on first use, as `sluice up`'s shards do."""
    if args.no_auto_create:
        return False
    table = data.get("broker")
    return None if isinstance(table, dict) and "auto_create" in table else True


def run(args: argparse.Namespace) -> int:
    if args.supervisor_pid is not None:
        die_with_parent(args.supervisor_pid)
    broker_cfg, proxy_cfg = configs(args)
    if proxy_cfg.tls.enabled:
        proxy_cfg.tls.read()
    setup_logging(args.log_level, args.log_json)
    broker_cfg.checked_address(f"broker {broker_cfg.name}")
    proxy_cfg.checked_address(f"proxy of {broker_cfg.name}")
    metrics.configure(proxy_cfg.metrics)
    ops_file, nodes = args.ops_file, args.await_nodes
    return serve(lambda stop: serve_node(broker_cfg, proxy_cfg, stop, ops_file=ops_file, await_nodes=nodes))


async def _await_nodes(cluster: ClusterDirectory, count: int, stop: asyncio.Event) -> None:
    """Until the NameServer lists `count` merged nodes (those `sluice up --shards` starts with this
    one), so the first routes this node serves name every shard; at most STARTUP_TIMEOUT_S."""
    deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
    while not stop.is_set() and asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(Unavailable):
            await cluster.refresh_brokers()
        if len(cluster.client_endpoints()) >= count:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), AWAIT_NODES_POLL_S)
    log.warning(
        "serving before every node registered", extra=kv(expected=count, listed=len(cluster.client_endpoints()))
    )


async def serve_node(broker_cfg: BrokerConfig, proxy_cfg: ProxyConfig, stop: asyncio.Event, *,
                     ops_file: str | None = None, await_nodes: int = 1) -> int:  # fmt: skip
    """The broker and its proxy until `stop`; a supervised node (`ops_file`) serves its operations
    endpoint on an ephemeral loopback port and writes that address to `ops_file` for its parent.
    With `await_nodes`, clients are served once that many merged nodes registered (_await_nodes)."""
    readiness = Readiness()
    readiness.set("proxy", False)

    def ops_ready(port: int) -> None:
        assert ops_file is not None
        Path(ops_file).write_text(f"{OPS_HOST}:{port}\n")

    def broker_ready(address: str) -> None:
        print(f"broker {broker_cfg.name} listening on {address}", flush=True)

    def proxy_ready(address: str) -> None:
        print(f"proxy of {broker_cfg.name} listening on {address} (clients connect here)", flush=True)

    broker_stop = asyncio.Event()
    ready: asyncio.Future[LocalBroker] = asyncio.get_running_loop().create_future()
    ops = (ops_server(OPS_HOST, 0, readiness, on_ready=ops_ready) if ops_file
           else ops_server(proxy_cfg.host, proxy_cfg.metrics_port, readiness))  # fmt: skip
    async with ops, asyncio.TaskGroup() as tasks:
        broker_task = tasks.create_task(run_broker(broker_cfg, broker_stop, on_ready=broker_ready,
                                                   on_broker=ready.set_result))  # fmt: skip
        try:
            broker = await asyncio.wait_for(asyncio.shield(ready), STARTUP_TIMEOUT_S)
            cluster = ClusterDirectory(NameServerClient(proxy_cfg.namesrv), refresh_s=proxy_cfg.route_refresh_s,
                                       brokers=proxy_cfg.brokers, topics_max=proxy_cfg.caches.topics_max,
                                       remote=ForwardedBroker)  # fmt: skip
            await _await_nodes(cluster, await_nodes, stop)
            cluster.start()
            directory = ShardDirectory(broker, proxy_cfg.advertised_address, cluster,
                                       auto_create=broker_cfg.auto_create,
                                       topics_max=proxy_cfg.caches.topics_max)  # fmt: skip
            try:
                await serve_proxy(ProxyApp(proxy_cfg, directory, home=broker.name), stop, on_ready=proxy_ready,
                                  on_readiness=lambda ok: readiness.set("proxy", ok))  # fmt: skip
            finally:
                await directory.close()
        finally:
            broker_stop.set()
            await broker_task
    return 0
