"""The entries of a topology file, one dataclass per process kind, as written in TOML.

    [[nameserver]]  name, port, [host, metrics_port, args, config]
    [[navigation]]  name, port, http_port, [host, metrics_port, args, config]
    [[etcd]]        name, port, peer_port, [host, data_dir]   (a one-member etcd for broker groups)
    [[broker]]      name, port, [host, metrics_port, data_dir, advertise, group, min_insync, args, config]
    [[proxy]]       name, port, [host, metrics_port, zone, workers, advertise, args, config]
    [[up]]          name, port, namesrv_port, broker_port, [host, metrics_port, data_dir, args, config]

Each is built with `common.config.build`, so an unknown key or a wrong type is an error naming the
entry and the key. Values are checked here; relations between entries (unique names and ports, a
NameServer for brokers) are checked by the loader. `metrics_port = 0` means "no metrics endpoint":
the process is then probed by a TCP connect to its port.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from cluster.topology import PORT_MAX

NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # all patterns: fullmatch
ZONE_PATTERN = re.compile(r"[A-Za-z0-9._-]{0,64}")
ENDPOINT_PATTERN = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]=]+):[0-9]{1,5}")
WORKERS_MAX = 64


@dataclass(frozen=True, kw_only=True)
class Entry:
    name: str
    port: int
    host: str = ""  # empty: [cluster] host
    metrics_port: int = 0
    args: list[str] = field(default_factory=list)  # extra flags, after the ones the topology sets
    config: dict[str, Any] = field(default_factory=dict)  # merged over [config.<component>]

    def __post_init__(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(
                f"name {self.name!r}: use 1-63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit (it names log and config files)"
            )
        for role, port in self.port_roles().items():
            if role == "metrics_port" and port == 0:
                continue
            if not 1 <= port <= PORT_MAX:
                raise ValueError(f"{role} {port} is out of range 1..{PORT_MAX} (ports are fixed, 0 is not allowed)")
        for arg in self.args:
            if not isinstance(arg, str):
                raise ValueError(f"args must be strings, got {arg!r}")

    def port_roles(self) -> dict[str, int]:
        """Every port field of the entry (metrics_port included, 0 when unset)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name == "port" or f.name.endswith("_port")}


@dataclass(frozen=True, kw_only=True)
class NameServerEntry(Entry):
    pass


@dataclass(frozen=True, kw_only=True)
class NavigationEntry(Entry):
    http_port: int


@dataclass(frozen=True, kw_only=True)
class EtcdEntry(Entry):
    peer_port: int
    data_dir: str = ""  # default data/<name>; relative to the run dir


@dataclass(frozen=True, kw_only=True)
class BrokerEntry(Entry):
    data_dir: str = ""  # default data/<name>; relative to the run dir
    advertise: str = ""  # HOST:PORT other processes use (default host:port)
    group: str = ""  # broker group (docs/replication.md); needs an [[etcd]]
    min_insync: int = 0  # 0: the broker's default

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.advertise and not ENDPOINT_PATTERN.fullmatch(self.advertise):
            raise ValueError(f"advertise {self.advertise!r}: use HOST:PORT")
        if self.group and not NAME_PATTERN.fullmatch(self.group):
            raise ValueError(f"group {self.group!r}: use lowercase letters, digits and '-'")
        if self.min_insync < 0:
            raise ValueError(f"min_insync must not be negative, got {self.min_insync}")


@dataclass(frozen=True, kw_only=True)
class ProxyEntry(Entry):
    zone: str = ""
    workers: int = 0  # processes on its port (0: the cores the proxy may use); one metrics endpoint for all
    advertise: list[str] = field(default_factory=list)  # [NETWORK=]HOST:PORT, each passed as --advertise

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.workers <= WORKERS_MAX:
            raise ValueError(f"workers must be in 0..{WORKERS_MAX} (0: one per core), got {self.workers}")
        if not ZONE_PATTERN.fullmatch(self.zone):
            raise ValueError(f"zone {self.zone!r}: use up to 64 letters, digits, '.', '_' and '-'")
        for endpoint in self.advertise:
            if not ENDPOINT_PATTERN.fullmatch(endpoint.partition("=")[2] or endpoint):
                raise ValueError(f"advertise {endpoint!r}: use [NETWORK=]HOST:PORT")


@dataclass(frozen=True, kw_only=True)
class UpEntry(Entry):
    namesrv_port: int
    broker_port: int
    data_dir: str = ""


ENTRY_TYPES: dict[str, type[Entry]] = {
    "etcd": EtcdEntry,
    "nameserver": NameServerEntry,
    "navigation": NavigationEntry,
    "broker": BrokerEntry,
    "proxy": ProxyEntry,
    "up": UpEntry,
}


def required_keys(cls: type[Entry]) -> list[str]:
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
