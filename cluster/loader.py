"""Load a topology file (TOML) into a `Topology`, with errors that name the file, the entry and the key.

    load_topology(path, run_dir=DIR, port_offset=0) -> Topology

Beyond the type of each value (schema.py) it checks: only known top-level tables; each kind is an
array of tables (`[[broker]]`); a merged topology (`[[up]]`) holds nothing else; there is a
NameServer when there are brokers or proxies; names are unique; no port is used twice, and with
`port_offset` every port stays in 1..65535; `args` hold only flags the command has and none the
topology sets itself; each process's config — `[config.<component>]` merged with the entry's
`config` — loads with the component's own loader (`BrokerConfig`, `ProxyConfig`, ...), so a typo
fails here, before anything starts, and never in a child. Relative data dirs are under `run_dir`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from cluster.errors import TopologyError
from cluster.schema import (
    ENTRY_TYPES,
    NAME_PATTERN,
    BrokerEntry,
    Entry,
    EtcdEntry,
    NavigationEntry,
    ProxyEntry,
    UpEntry,
    required_keys,
)
from cluster.topology import (
    KINDS,
    PORT_MAX,
    START_RANK,
    WILDCARD_HOSTS,
    ClusterSettings,
    Probe,
    ProcessSpec,
    Topology,
    connect_host,
    host_port,
)
from common.config import ConfigError, build, load_config, read_toml
from nameserver.config import NameServerConfig
from navigation.config import NavigationConfig
from proxy.config import ProxyConfig

TOP_LEVEL = ("cluster", "config", *KINDS)
# The config sections each kind reads from its --config file, with the dataclass that loads them.
SECTIONS: dict[str, tuple[tuple[str, type], ...]] = {
    "etcd": (),
    "nameserver": (("nameserver", NameServerConfig),),
    "navigation": (("navigation", NavigationConfig),),
    "broker": (("broker", BrokerConfig),),
    "proxy": (("proxy", ProxyConfig),),
    "up": (("nameserver", NameServerConfig), ("broker", BrokerConfig), ("proxy", ProxyConfig)),
}
# Flags the topology sets from an entry's keys; `args` may not repeat them.
_COMMON_FLAGS = ("--config", "--host", "--port", "--metrics-port", "--log-level")
# The last four are internal to --workers (processes/workerpool.py).
_WORKERS = ("--workers", "--reuse-port", "--worker-index", "--supervisor-pid", "--ops-file")
RESERVED_FLAGS: dict[str, frozenset[str]] = {
    "etcd": frozenset((*_COMMON_FLAGS, "--name", "--peer-port", "--data-dir")),
    "nameserver": frozenset(_COMMON_FLAGS),
    "navigation": frozenset((*_COMMON_FLAGS, "--http-port")),
    "broker": frozenset(
        (*_COMMON_FLAGS, "--name", "--data-dir", "--namesrv", "--advertise", "--group", "--etcd", "--min-insync")
    ),
    "proxy": frozenset((*_COMMON_FLAGS, "--namesrv", "--navigation", "--zone", "--advertise", "--proxy-id", *_WORKERS)),
    "up": frozenset((*_COMMON_FLAGS, "--namesrv-port", "--broker-port", "--data-dir")),
}
# Config keys the topology always sets through flags; setting them in a config table would be ignored.
RESERVED_KEYS: dict[str, frozenset[str]] = {
    "nameserver": frozenset(("host", "port")),
    "navigation": frozenset(("host", "port", "http_port")),
    "broker": frozenset(("name", "host", "port", "data_dir", "namesrv", "metrics_port")),
    "proxy": frozenset(("host", "port", "namesrv", "navigation", "proxy_id", "metrics_port", "reuse_port")),
}


def load_topology(path: str | Path, *, run_dir: str | Path, port_offset: int = 0) -> Topology:
    source = Path(path)
    try:
        return _load(source, Path(run_dir).resolve(), port_offset)
    except ConfigError as exc:
        raise TopologyError(f"topology {source}: {exc}") from None


def _load(source: Path, run_dir: Path, port_offset: int) -> Topology:
    data = read_toml(source)
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(TOP_LEVEL)}")
    settings = build(ClusterSettings, _table(data, "cluster"), where="cluster")
    config_root = _config_root(data)
    entries = [_shift(e, port_offset) for e in _entries(data)]
    _check_relations(entries)
    namesrv = ";".join(_address(e.host or settings.host, e.port) for e in entries if e.kind == "nameserver")
    navigation = ";".join(_address(e.host or settings.host, e.port) for e in entries if e.kind == "navigation")
    etcd = ",".join(f"http://{_address(e.host or settings.host, e.port)}" for e in entries if e.kind == "etcd")
    specs = [_spec(e, settings, run_dir, config_root, namesrv, navigation, etcd) for e in entries]
    specs.sort(key=lambda s: START_RANK[s.kind])  # stable: file order within a kind
    return Topology(source.resolve(), run_dir, settings, tuple(specs), port_offset)


@dataclasses.dataclass(frozen=True)
class _Located:
    """An entry with its kind (the table it came from)."""

    kind: str
    entry: Entry

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def host(self) -> str:
        return self.entry.host

    @property
    def port(self) -> int:
        return self.entry.port


def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"[{key}] must be a table")
    return value


def _config_root(data: Mapping[str, Any]) -> Mapping[str, Any]:
    root = _table(data, "config")
    known = ("nameserver", "navigation", "broker", "proxy")
    for key, value in root.items():
        if key not in known:
            raise ConfigError(f"[config.{key}] is not a component; known: {', '.join(known)}")
        if not isinstance(value, Mapping):
            raise ConfigError(f"[config.{key}] must be a table")
    return root


def _entries(data: Mapping[str, Any]) -> list[_Located]:
    out: list[_Located] = []
    for kind in KINDS:
        raw = data.get(kind, [])
        if isinstance(raw, Mapping):
            raise ConfigError(f"write [[{kind}]] (an array of tables, one per process), not [{kind}]")
        if not isinstance(raw, list):
            raise ConfigError(f"{kind} must be an array of tables ([[{kind}]])")
        for index, table in enumerate(raw, start=1):
            out.append(_Located(kind, _entry(kind, index, table)))
    if not out:
        raise ConfigError(f"no process: add at least one of {', '.join(f'[[{k}]]' for k in KINDS)}")
    return out


def _entry(kind: str, index: int, table: Any) -> Entry:
    name = table.get("name") if isinstance(table, Mapping) else None
    where = f"{kind}.{name}" if isinstance(name, str) and NAME_PATTERN.fullmatch(name) else f"{kind}#{index}"
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{where}] must be a table")
    cls = ENTRY_TYPES[kind]
    missing = [key for key in required_keys(cls) if key not in table]
    if missing:
        raise ConfigError(f"[{where}] missing key(s) {', '.join(missing)}")
    return build(cls, table, where=where)


def _shift(located: _Located, offset: int) -> _Located:
    if offset == 0:
        return located
    entry = located.entry
    shifted: dict[str, Any] = {}
    for role, port in entry.port_roles().items():
        if role == "metrics_port" and port == 0:
            continue
        if not 1 <= port + offset <= PORT_MAX:
            raise ConfigError(
                f"port offset {offset} moves {located.name}'s {role} {port} to {port + offset}, outside 1..{PORT_MAX}"
            )
        shifted[role] = port + offset
    return _Located(located.kind, dataclasses.replace(entry, **shifted))


def _check_relations(entries: list[_Located]) -> None:
    kinds = {e.kind for e in entries}
    if "up" in kinds and kinds != {"up"}:
        raise ConfigError("a topology is merged ([[up]] only) or separated (no [[up]]), not both")
    if kinds & {"broker", "proxy"} and "nameserver" not in kinds:
        raise ConfigError("brokers and proxies need a NameServer: add a [[nameserver]]")
    grouped = [e.name for e in entries if isinstance(e.entry, BrokerEntry) and e.entry.group]
    if grouped and "etcd" not in kinds:
        raise ConfigError(f"brokers in a group ({', '.join(grouped)}) need etcd: add an [[etcd]]")
    names: dict[str, str] = {}
    ports: dict[int, str] = {}
    for e in entries:
        if e.name in names:
            raise ConfigError(f"name {e.name!r} is used twice ({names[e.name]} and {e.kind}); names must be unique")
        names[e.name] = e.kind
        for role, port in _all_ports(e).items():
            if port in ports:
                raise ConfigError(f"port {port} is used twice ({ports[port]} and {e.name} {role})")
            ports[port] = f"{e.name} {role}"


def _all_ports(located: _Located) -> dict[str, int]:
    """Every port of an entry, by role (a proxy's workers share its port and its metrics port)."""
    return {role: port for role, port in located.entry.port_roles().items() if port}


def _address(host: str, port: int) -> str:
    return host_port(connect_host(host), port)


# -- one process ------------------------------------------------------------------------------------


def _spec(
    located: _Located,
    settings: ClusterSettings,
    run_dir: Path,
    config_root: Mapping[str, Any],
    namesrv: str,
    navigation: str,
    etcd: str = "",
) -> ProcessSpec:
    kind, entry = located.kind, located.entry
    host = entry.host or settings.host
    _check_args(kind, entry)
    config, loaded = _component_config(kind, entry, config_root)
    data_dir = _data_dir(entry, run_dir)
    config_path = run_dir / "config" / f"{entry.name}.toml" if config else None
    argv = [kind, "--host", host, "--port", str(entry.port)]
    argv += _kind_flags(kind, entry, host, data_dir, namesrv, navigation)
    if isinstance(entry, BrokerEntry) and entry.group:
        argv += ["--group", entry.group, "--etcd", etcd]
        if entry.min_insync:
            argv += ["--min-insync", str(entry.min_insync)]
    if entry.metrics_port:
        argv += ["--metrics-port", str(entry.metrics_port)]
    argv += ["--log-level", settings.log_level]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    argv += entry.args
    stop_timeout_s = settings.stop_timeout_s
    if kind == "proxy" and navigation:
        stop_timeout_s += loaded["proxy"].drain_s  # a proxy in a fleet keeps serving drain_s after SIGTERM
    return ProcessSpec(
        name=entry.name,
        kind=kind,
        host=host,
        argv=tuple(argv),
        ports=_all_ports(located),
        config=config,
        config_path=config_path,
        data_dir=data_dir,
        log_path=run_dir / "logs" / f"{entry.name}.log",
        probes=_probes(kind, entry, host),
        stop_timeout_s=stop_timeout_s,
    )


def _kind_flags(kind: str, entry: Entry, host: str, data_dir: Path | None, namesrv: str, navigation: str) -> list[str]:
    flags: list[str] = []
    if isinstance(entry, NavigationEntry):
        flags += ["--http-port", str(entry.http_port)]
    elif isinstance(entry, EtcdEntry):
        flags += ["--name", entry.name, "--peer-port", str(entry.peer_port), "--data-dir", str(data_dir)]
    elif isinstance(entry, BrokerEntry):
        flags += ["--name", entry.name, "--data-dir", str(data_dir), "--namesrv", namesrv]
        if host in WILDCARD_HOSTS and not entry.advertise:
            raise ConfigError(f"broker {entry.name} listens on {host!r}: set advertise to the address others use")
        if entry.advertise:
            flags += ["--advertise", entry.advertise]
    elif isinstance(entry, ProxyEntry):
        flags += ["--namesrv", namesrv, "--proxy-id", entry.name]
        if entry.workers:
            flags += ["--workers", str(entry.workers)]
        if navigation:
            flags += ["--navigation", navigation]
        if entry.zone:
            flags += ["--zone", entry.zone]
        if host in WILDCARD_HOSTS and not entry.advertise:
            raise ConfigError(f"proxy {entry.name} listens on {host!r}: set advertise to the address clients use")
        for endpoint in entry.advertise:
            flags += ["--advertise", endpoint]
    elif isinstance(entry, UpEntry):
        flags += ["--namesrv-port", str(entry.namesrv_port), "--broker-port", str(entry.broker_port)]
        flags += ["--data-dir", str(data_dir)]
    assert kind in SECTIONS, kind
    return flags


def _data_dir(entry: Entry, run_dir: Path) -> Path | None:
    if not isinstance(entry, BrokerEntry | UpEntry | EtcdEntry):
        return None
    path = Path(entry.data_dir or f"data/{entry.name}")
    return path if path.is_absolute() else run_dir / path


def _probes(kind: str, entry: Entry, host: str) -> tuple[Probe, ...]:
    target = connect_host(host)
    if entry.metrics_port:
        return (Probe(target, entry.metrics_port, "/readyz"),)
    ports = [entry.port, entry.http_port] if isinstance(entry, NavigationEntry) else [entry.port]
    return tuple(Probe(target, port) for port in ports)


def _component_config(kind: str, entry: Entry, root: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The --config file content of one process, and each section loaded by its component's loader."""
    content: dict[str, Any] = {}
    for key in entry.config:
        if kind == "up" and key not in dict(SECTIONS["up"]):
            raise ConfigError(
                f"[{kind}.{entry.name}] config.{key}: an up process's config holds component tables "
                "(nameserver, broker, proxy)"
            )
    for section, _ in SECTIONS[kind]:
        own = entry.config.get(section, {}) if kind == "up" else entry.config
        if not isinstance(own, Mapping):
            raise ConfigError(f"[{kind}.{entry.name}] config.{section} must be a table")
        merged = _deep_merge(root.get(section, {}), own)
        reserved = sorted(set(merged) & RESERVED_KEYS[section])
        if reserved:
            raise ConfigError(
                f"config key(s) {', '.join(f'{section}.{k}' for k in reserved)} of {entry.name} are set by the "
                "topology (from the entry's keys and the other processes' addresses); remove them"
            )
        if merged:
            content[section] = merged
    loaded: dict[str, Any] = {}
    for section, cls in SECTIONS[kind]:
        try:
            loaded[section] = load_config(cls, section=section, data=content)
        except ConfigError as exc:
            raise ConfigError(f"config of {entry.name}: {exc}") from None
    return content, loaded


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _check_args(kind: str, entry: Entry) -> None:
    known = command_flags(kind)
    for arg in entry.args:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_FLAGS[kind]:
            raise ConfigError(f"[{kind}.{entry.name}] args: {flag} is set by the topology; use the entry's keys")
        if flag not in known:
            raise ConfigError(f"[{kind}.{entry.name}] args: sluice {kind} has no flag {flag}")


@functools.cache
def command_flags(command: str) -> frozenset[str]:
    """Every option string of `sluice <command>` (from the real parser)."""
    from sluice.main import build_parser  # deferred: sluice.main imports this package's command

    return frozenset(o for action in subcommand_parser(build_parser(), command)._actions for o in action.option_strings)


def subcommand_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    raise KeyError(f"sluice has no command {command!r}")
