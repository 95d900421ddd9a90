"""`sluice up`: the merged topology — NameServer, broker and proxy started by one command.

One Python process uses one core. By default (`--shards`, `[up] shards`: one per usable core)
this process keeps the NameServer and the console and runs N merged nodes (`sluice node`: broker
`shard-<i>` with its own proxy and data dir) whose routes send clients straight to the shard owning
a queue (`run_shards`, processes/shardpool.py, docs/shards.md). With `--shards 1` NameServer, broker
and proxy run in this one process and the proxy calls the broker in-process (no serialisation);
only there `--workers N` runs the client-facing proxy in N worker processes over the one broker
(processes/workerpool.py, docs/workers.md: measured at 0.76-1.0x of one process, kept for
comparison). Either way the brokers register with the embedded NameServer, so
`sluice admin --namesrv 127.0.0.1:9876 ...` works against them. Topics and groups are created on
first use unless `--no-auto-create` is given. Configuration: the `[up]`, `[nameserver]`, `[broker]`
and `[proxy]` tables of `--config`, with flags overriding them. Stops in reverse order on
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.server import run_broker
from cluster.topology import connect_host
from common import metrics
from common.addresses import parse_advertise
from common.config import ConfigError, load_config, read_toml
from common.logs import setup_logging
from console.config import ConsoleConfig
from console.server import run_console
from nameserver.config import NameServerConfig
from nameserver.service import run_nameserver
from ops.endpoint import Readiness, ops_server
from processes.runtime import add_log_arguments, serve
from processes.shardpool import (
    MAX_DEFAULT_SHARDS,
    ShardPool,
    UpConfig,
    default_shards,
    free_port,
    refuse_shard_data,
    shard_configs,
)
from processes.workerpool import WorkerPool, available_cores, log_flags, worker_count
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from proxy.directory import LocalDirectory
from proxy.server import serve_proxy
from sluice.obsflags import add_observability_arguments, metrics_overrides, trace_overrides
from sluice.ports import is_free, require_free
from sluice.proxyflags import add_amqp_argument, add_mqtt_arguments, mqtt_overrides, security_overrides
from sluice.tierflags import add_tier_arguments, tier_overrides

log = logging.getLogger("sluice.up")

NAME = "up"
HELP = "Run the merged topology (NameServer + broker + proxy, one command) on an embedded default."
STARTUP_TIMEOUT_S = 60.0
# The ops endpoint's default port is the client port plus this: on by default, and a second
# instance started with another --port gets another metrics port.
METRICS_PORT_OFFSET = 1000
SECOND_INSTANCE_HINT = (
    "is another sluice up running? give this one other ports "
    "(--port, --namesrv-port, --broker-port, --metrics-port, --console-port)"
)
DEFAULT_CONSOLE_PORT = 8080
DEFAULT_AMQP_PORT = 5672
DEFAULT_MQTT_PORT = 1883
CONSOLE_OFF = -1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with [nameserver], [broker], [proxy] tables")
    parser.add_argument("--data-dir", metavar="DIR", help="where the broker keeps its data (default ./data)")
    parser.add_argument("--host", help="address every part listens on (default 127.0.0.1)")
    parser.add_argument(
        "--advertise", metavar="HOST",
        help="address other machines reach this one at, in routes and registrations, each part with its own port "
        "(default: --host; with 0.0.0.0 or :: the machine's one address, and several refuse to start without this)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, help="client (proxy) port (default 8081)")
    parser.add_argument("--namesrv-port", type=int, help="NameServer port (default 9876)")
    parser.add_argument("--broker-port", type=int, help="broker's internal port (default 10911)")
    parser.add_argument("--flush", choices=("sync", "async"), help="acknowledge after fsync (sync) or write (async)")
    parser.add_argument("--no-auto-create", action="store_true", help="do not create topics and groups on first use")
    parser.add_argument(
        "--workers", type=int,
        help="with --shards 1 only: proxy processes serving the client port over the one broker (default 1; "
        "they measured 0.76-1.0x of one process: use --shards to use cores; docs/workers.md)",
    )  # fmt: skip
    parser.add_argument(
        "--shards", type=int,
        help="merged nodes (broker shard-<i> with its own proxy and data dir), one core each; clients are "
        "routed to the shard owning each queue (default: [up] shards of --config, else one per usable core, "
        f"at most {MAX_DEFAULT_SHARDS}, or what --data-dir was used with; 1: one process; docs/shards.md)",
    )  # fmt: skip
    parser.add_argument("--auth", choices=("on", "off"), help="require signed requests and access rules (default off)")
    parser.add_argument(
        "--tls-cert", metavar="PEM", help="serve clients over TLS with this certificate (and --tls-key)"
    )
    parser.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help=f"HTTP port for /metrics, /healthz, /readyz (default: the client port + {METRICS_PORT_OFFSET}, "
        "so 9081; 0 turns it off)",
    )
    parser.add_argument(
        "--console-port",
        type=int,
        default=DEFAULT_CONSOLE_PORT,
        help=f"HTTP port of the operator's console, on loopback (default {DEFAULT_CONSOLE_PORT}; 0 picks one; -1: off)",
    )
    add_observability_arguments(parser, trace=True)
    add_tier_arguments(parser)
    add_amqp_argument(parser, f"default {DEFAULT_AMQP_PORT}, served when free")
    add_mqtt_arguments(parser, f"default {DEFAULT_MQTT_PORT}, served when free")
    add_log_arguments(parser)


def configs(args: argparse.Namespace) -> tuple[NameServerConfig, BrokerConfig, ProxyConfig]:
    data = read_toml(args.config) if args.config else {}
    ns = load_config(NameServerConfig, section="nameserver", data=data,
                     overrides={"host": args.host, "port": args.namesrv_port})  # fmt: skip
    broker = load_config(
        BrokerConfig, section="broker", data=data,
        overrides={
            "host": args.host, "port": args.broker_port, "data_dir": args.data_dir or "data/broker",
            "advertise": _advertise_host(args.advertise),
            "namesrv": [f"{ns.host}:{ns.port}"], "auto_create": not args.no_auto_create,
            "store.commitlog.flush_policy": args.flush,
            **metrics_overrides(args), **trace_overrides(args),
            **tier_overrides(args),
        },
    )  # fmt: skip
    proxy = load_config(ProxyConfig, section="proxy", data=data, overrides={
        "host": args.host, "port": args.port, "advertise": _advertise_host(args.advertise), **metrics_overrides(args),
        **security_overrides(args), "amqp.port": args.amqp_port, **mqtt_overrides(args)})  # fmt: skip
    return ns, broker, with_default_mqtt(args, data, with_default_amqp(args, data, proxy))


def _advertise_host(value: str | None) -> str | None:
    """`--advertise HOST`: a host alone, each part advertised with its own port."""
    if value is None:
        return None
    try:
        host, port = parse_advertise(value)
    except ValueError as exc:
        raise ConfigError(f"--advertise {value!r}: {exc}") from None
    if port is not None:
        raise ConfigError(f"--advertise {value!r}: give the host alone; each part is advertised with its own port "
                          "(--port, --broker-port)")  # fmt: skip
    return host


def with_default_amqp(args: argparse.Namespace, data: dict[str, object], proxy: ProxyConfig) -> ProxyConfig:
    """Without --amqp-port and `[proxy.amqp] port`, AMQP is served on 5672 when that port is free;
    when it is taken (another broker, another instance) the rest starts without AMQP, as the
    console does without its port. A port given explicitly must be free (checked with the others)."""
    table = data.get("proxy")
    amqp = table.get("amqp") if isinstance(table, dict) else None
    if args.amqp_port is not None or (isinstance(amqp, dict) and "port" in amqp):
        return proxy
    if not is_free(proxy.host, DEFAULT_AMQP_PORT):
        log.warning(
            "AMQP port %s is in use: serving without AMQP (give --amqp-port, or -1 for none)", DEFAULT_AMQP_PORT
        )
        return proxy
    return replace(proxy, amqp=replace(proxy.amqp, port=DEFAULT_AMQP_PORT))


def with_default_mqtt(args: argparse.Namespace, data: dict[str, object], proxy: ProxyConfig) -> ProxyConfig:
    """Without --mqtt-port and `[proxy.mqtt] port`, MQTT is served on 1883 when that port is free
    (as AMQP on 5672: another broker there, and the rest starts without MQTT)."""
    table = data.get("proxy")
    mqtt = table.get("mqtt") if isinstance(table, dict) else None
    if args.mqtt_port is not None or (isinstance(mqtt, dict) and "port" in mqtt):
        return proxy
    if not is_free(proxy.host, DEFAULT_MQTT_PORT):
        log.warning(
            "MQTT port %s is in use: serving without MQTT (give --mqtt-port, or -1 for none)", DEFAULT_MQTT_PORT
        )
        return proxy
    return replace(proxy, mqtt=replace(proxy.mqtt, port=DEFAULT_MQTT_PORT))


def mqtt_ports(proxy: ProxyConfig) -> list[tuple[str, str, int]]:
    """The MQTT ports for the start-up check (a port given explicitly must be free)."""
    ports = (("mqtt", proxy.mqtt.port), ("mqtt-ws", proxy.mqtt.ws_port))
    return [(name, proxy.host, port) for name, port in ports if port > 0]


def shared_mqtt_ports(proxy: ProxyConfig) -> ProxyConfig:
    """Every shard serves the same MQTT ports (SO_REUSEPORT, docs/mqtt.md "Placement"): a port of 0
    is picked here once, for all of them."""
    mqtt = proxy.mqtt
    port = free_port(proxy.host) if mqtt.port == 0 else mqtt.port
    ws_port = free_port(proxy.host) if mqtt.ws_port == 0 else mqtt.ws_port
    return replace(proxy, mqtt=replace(mqtt, port=port, ws_port=ws_port))


def ops_port(flag: int | None, proxy: ProxyConfig) -> int:
    """The flag, else `[proxy] metrics_port`, else the client port + METRICS_PORT_OFFSET (0: off)."""
    if flag is not None:
        return flag
    if proxy.metrics_port:
        return proxy.metrics_port
    return proxy.port + METRICS_PORT_OFFSET if proxy.port else 0


def console_config(args: argparse.Namespace, ns: NameServerConfig, proxy: ProxyConfig) -> ConsoleConfig | None:
    """The console of the merged process: the `[console]` table, auth as the proxy's. It stays on
    loopback even with `--host` (its own `[console] host` exposes it): a console is not for everyone."""
    if args.console_port == CONSOLE_OFF:
        return None
    data = read_toml(args.config) if args.config else {}
    return load_config(ConsoleConfig, section="console", data=data, overrides={
        "port": args.console_port, "namesrv": f"{ns.host}:{ns.port}", "proxies": (proxy.advertised_address,),
        "auth": "on" if proxy.auth.enabled else "off"})  # fmt: skip


def console_port(config: ConsoleConfig | None) -> list[tuple[str, str, int]]:
    """The console's port for the start-up check: a taken one fails `sluice up` like the others
    (the README sends the user to it; another cluster's console would answer there)."""
    return [] if config is None else [("console", config.host, config.port)]


async def _console(config: ConsoleConfig, stop: asyncio.Event) -> None:
    """The console, best effort once started: its port was checked free before anything started
    (console_port); one taken in between costs the console, never the broker and proxy."""
    try:
        await run_console(config, stop, on_ready=lambda url: print(f"console listening on {url}", flush=True))
    except OSError as exc:
        log.error("console not started: cannot listen on %s:%s: %s (give --console-port, or -1 for none)",
                  config.host, config.port, exc.strerror or exc)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    up = load_config(UpConfig, section="up", path=args.config, overrides={"shards": args.shards})
    shards = up.shards if up.shards is not None else default_shards(shards_base(args), available_cores())
    if shards > 1:
        if args.workers is not None and args.workers > 1:
            how = f"--shards {shards}" if up.shards is not None else f"{shards} shards (the default, one per core)"
            raise ConfigError(f"--workers and {how} are two ways to use cores: give one of them (--workers runs "
                              "proxy processes over one broker and needs --shards 1; docs/workers.md)")  # fmt: skip
        return run_shards(args, shards)
    workers = worker_count(args.workers, default=1)
    ns_cfg, broker_cfg, proxy_cfg = configs(args)
    refuse_shard_data(Path(broker_cfg.data_dir))
    console_cfg = console_config(args, ns_cfg, proxy_cfg)
    if proxy_cfg.tls.enabled:
        proxy_cfg.tls.read()  # a missing certificate is a one-line error before anything starts
    metrics_port = ops_port(args.metrics_port, proxy_cfg)
    require_free([("client", proxy_cfg.host, proxy_cfg.port), ("nameserver", ns_cfg.host, ns_cfg.port),
                  ("broker", broker_cfg.host, broker_cfg.port), ("metrics", proxy_cfg.host, metrics_port),
                  ("amqp", proxy_cfg.host, max(proxy_cfg.amqp.port, 0)), *mqtt_ports(proxy_cfg),
                  *console_port(console_cfg)], SECOND_INSTANCE_HINT)  # fmt: skip
    setup_logging(args.log_level, args.log_json)
    broker_cfg.checked_address(f"broker {broker_cfg.name}")
    proxy_cfg.checked_address("proxy")
    # One process, one switch: the proxy's table decides (the flag sets both).
    metrics.configure(proxy_cfg.metrics)

    def proxy_ready(address: str, how: str = "") -> None:
        print(f"proxy listening on {address} (clients connect here{how})", flush=True)
        if metrics_port:
            print(f"metrics on http://{proxy_cfg.host}:{metrics_port}/metrics (health: /healthz, /readyz)", flush=True)

    pool: WorkerPool | None = None
    if workers > 1:
        # The workers are proxies of the embedded NameServer's cluster, creating topics on first
        # use where the broker does; the parent's endpoint serves their metrics.
        worker_cfg = replace(proxy_cfg, namesrv=[f"{connect_host(ns_cfg.host)}:{ns_cfg.port}"],
                             auto_create_topics=broker_cfg.auto_create)  # fmt: skip
        pool = WorkerPool(worker_cfg, workers, log_flags(args.log_level, args.log_json))

    async def serve_clients(broker: LocalBroker, stop: asyncio.Event, readiness: Readiness) -> None:
        if pool is None:
            directory = LocalDirectory(broker, topics_max=proxy_cfg.caches.topics_max)
            await serve_proxy(ProxyApp(proxy_cfg, directory), stop, on_ready=proxy_ready,
                              on_readiness=lambda ok: readiness.set("proxy", ok))  # fmt: skip
            return
        readiness.set("proxy", True)  # the workers' readiness is the pool's (ops_server children)
        address = f"{proxy_cfg.host}:{proxy_cfg.port}"
        code = await pool.run(stop, on_ready=lambda: proxy_ready(address, f"; {workers} worker processes"))
        if code:
            raise SystemExit(f"proxy workers could not be kept running on {address}; see the log above")

    async def main(stop: asyncio.Event) -> int:
        ns_stop, broker_stop = asyncio.Event(), asyncio.Event()
        broker_ready: asyncio.Future[LocalBroker] = asyncio.get_running_loop().create_future()
        readiness = Readiness()
        readiness.set("proxy", False)
        ops = ops_server(proxy_cfg.host, metrics_port, readiness, children=pool)
        async with ops, asyncio.TaskGroup() as tasks:
            ns_task = tasks.create_task(run_nameserver(
                ns_cfg, ns_stop, on_ready=lambda a: print(f"nameserver listening on {a}", flush=True)))  # fmt: skip
            broker_task = tasks.create_task(run_broker(
                broker_cfg, broker_stop, on_ready=lambda a: print(f"broker listening on {a}", flush=True),
                on_broker=broker_ready.set_result))  # fmt: skip
            console_stop = asyncio.Event()
            try:
                broker = await asyncio.wait_for(asyncio.shield(broker_ready), STARTUP_TIMEOUT_S)
                if console_cfg is not None:
                    tasks.create_task(_console(console_cfg, console_stop))
                await serve_clients(broker, stop, readiness)
            finally:
                console_stop.set()
                broker_stop.set()
                await broker_task
                ns_stop.set()
                await ns_task
        return 0

    return serve(main)


def shards_base(args: argparse.Namespace) -> Path:
    """The directory holding `shard-<i>`: `--data-dir`, else `data` (one process's broker: `data/broker`)."""
    return Path(args.data_dir) if args.data_dir else Path("data")


def run_shards(args: argparse.Namespace, count: int) -> int:
    """`count` merged nodes (processes/shardpool.py) under this process, which runs the NameServer,
    the console and the one operations endpoint of all of them."""
    ns_cfg, broker_cfg, proxy_cfg = configs(args)
    console_cfg = console_config(args, ns_cfg, proxy_cfg)
    if proxy_cfg.tls.enabled:
        proxy_cfg.tls.read()
    metrics_port = ops_port(args.metrics_port, proxy_cfg)
    base = shards_base(args)
    require_free([("client", proxy_cfg.host, proxy_cfg.port), ("nameserver", ns_cfg.host, ns_cfg.port),
                  ("broker", broker_cfg.host, broker_cfg.port), ("metrics", proxy_cfg.host, metrics_port),
                  ("amqp", proxy_cfg.host, max(proxy_cfg.amqp.port, 0)), *mqtt_ports(proxy_cfg),
                  *console_port(console_cfg)], SECOND_INSTANCE_HINT)  # fmt: skip
    setup_logging(args.log_level, args.log_json)
    proxy_cfg.checked_address("proxy")
    proxy_cfg = shared_mqtt_ports(proxy_cfg)
    brokers = shard_configs(broker_cfg, count, base)
    client_ports = [proxy_cfg.port, *(free_port(proxy_cfg.host) for _ in range(count - 1))]
    if console_cfg is not None:  # the console lists every shard's proxy
        host = connect_host(proxy_cfg.host)
        console_cfg = replace(console_cfg, proxies=tuple(f"{host}:{p}" for p in client_ports))
    metrics.configure(proxy_cfg.metrics)
    pool = ShardPool(replace(proxy_cfg, namesrv=[f"{connect_host(ns_cfg.host)}:{ns_cfg.port}"]), count,
                     log_flags(args.log_level, args.log_json), brokers=brokers, client_ports=client_ports)  # fmt: skip

    def shards_ready() -> None:
        print(f"proxy listening on {proxy_cfg.host}:{proxy_cfg.port} (clients connect here; {count} shards, "
              f"client ports {', '.join(map(str, client_ports))})", flush=True)  # fmt: skip
        if metrics_port:
            print(f"metrics on http://{proxy_cfg.host}:{metrics_port}/metrics (health: /healthz, /readyz)", flush=True)

    async def main(stop: asyncio.Event) -> int:
        ns_stop, console_stop = asyncio.Event(), asyncio.Event()
        async with ops_server(proxy_cfg.host, metrics_port, Readiness(), children=pool), asyncio.TaskGroup() as tasks:
            ns_task = tasks.create_task(run_nameserver(
                ns_cfg, ns_stop, on_ready=lambda a: print(f"nameserver listening on {a}", flush=True)))  # fmt: skip
            if console_cfg is not None:
                tasks.create_task(_console(console_cfg, console_stop))
            try:
                code = await pool.run(stop, on_ready=shards_ready)
            finally:
                console_stop.set()
                ns_stop.set()
                await ns_task
        if code:
            raise SystemExit("shards could not be kept running; see the log above")
        return 0

    return serve(main)
