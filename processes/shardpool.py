"""The shards of `sluice up --shards N`: N merged nodes (`sluice node`), one per core, supervised
from asyncio (docs/shards.md).

Shard `i` is broker `shard-<i>` with its own proxy, data directory `<data dir>/shard-<i>`, client
port and internal port (shard 0: `--port` and `--broker-port`; the others: free ports this parent
picks once, kept across restarts); all register with the parent's NameServer. Shard 0 alone serves
AMQP: it is the AMQP metadata home broker, which holds every AMQP queue.
The supervision is the proxy workers' (processes/workerpool.py): each shard is started with
`posix_spawn`, given its resolved configuration as a TOML file, restarted when it exits (backoff,
at most `MAX_RESTARTS` times) while the others keep serving, stopped with SIGTERM, and it dies with
its parent. Its operations endpoint is merged into the parent's with the label `shard="<i>"`.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from broker.config import BrokerConfig
from cluster.tomlwrite import dumps
from common.addresses import host_port, parse_advertise, reachable_host
from common.config import ConfigError, to_dict
from common.served import ServedConfig
from processes.workerpool import WorkerPool

SHARD_PREFIX = "shard-"
# `sluice up`'s default: one shard per usable core, at most this many (each is a Python process with
# a broker, its proxy and its RocksDB; more cores than this are better used by `sluice node`s).
MAX_DEFAULT_SHARDS = 16


@dataclass(frozen=True)
class UpConfig:
    """The `[up]` table of `sluice up`: how it uses cores."""

    # Merged nodes (broker shard-<i> with its own proxy), one core each (docs/shards.md). Unset: one
    # per usable core (at most 16), unless the data directory already holds one process's data (1)
    # or more shards than that (their number). 1: everything in one process.
    shards: int | None = None

    def __post_init__(self) -> None:
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"shards is {self.shards}; it must be at least 1")


def shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index}"


def shard_dirs(base: Path, count: int) -> list[Path]:
    """Each shard's data directory under `base`. Refuses (ConfigError) a `base` whose data would be
    orphaned: a shard directory beyond `count`, or a single process's broker data in `base` itself.
    Adding shards to existing ones is fine (the new ones start empty)."""
    if base.is_dir():
        indexes = sorted(_index(p.name) for p in base.iterdir() if p.name.startswith(SHARD_PREFIX))
        extra = [i for i in indexes if i >= count]
        if extra:
            raise ConfigError(
                f"{base} holds data of {', '.join(map(shard_name, extra))}, which --shards {count} would not run: "
                f"start with --shards {extra[-1] + 1} or more (consume what they hold first), or move them away"
            )
        own = [p.name for p in base.iterdir() if not p.name.startswith(SHARD_PREFIX)]
        if own:
            raise ConfigError(f"{base} holds a single broker's data ({', '.join(sorted(own)[:3])}); --shards needs "
                              "a data directory of its own (give --data-dir), or run without --shards")  # fmt: skip
    return [base / shard_name(i) for i in range(count)]


def _index(name: str) -> int:
    """The index of a `shard-<i>` directory name (-1 if it is no such name)."""
    tail = name[len(SHARD_PREFIX) :]
    return int(tail) if tail.isdigit() else -1


def default_shards(base: Path, cores: int) -> int:
    """The shards of `sluice up` when neither `--shards` nor `[up] shards` says: what the data
    directory `base` was used with if it holds data (a single process's broker data: 1, so that an
    existing directory keeps working; shards: at least as many as it holds, never orphaning one),
    else one per usable core, at most MAX_DEFAULT_SHARDS."""
    per_core = max(1, min(cores, MAX_DEFAULT_SHARDS))
    if not base.is_dir():
        return per_core
    names = [p.name for p in base.iterdir()]
    if any(_index(name) < 0 for name in names):
        return 1
    return max([per_core, *(_index(name) + 1 for name in names)])


def refuse_shard_data(data_dir: Path) -> None:
    """One process (`sluice up` without --shards) must not start over a sharded data directory,
    whose shards it would orphan."""
    if data_dir.is_dir() and any(_index(p.name) >= 0 for p in data_dir.iterdir()):
        raise ConfigError(f"{data_dir} holds the data of shards (shard-<i>): run with the --shards it was used with")


def shard_configs(broker: BrokerConfig, count: int, base: Path) -> list[BrokerConfig]:
    """Shard `i`'s broker: named `shard-<i>`, in its own directory; shard 0 on the internal port, the
    others on free ports."""
    dirs = shard_dirs(base, count)
    ports = [broker.port, *(free_port(broker.host) for _ in range(count - 1))]
    host = advertised_host(broker)  # each shard on its own port of the one address others reach
    return [replace(broker, name=shard_name(i), port=ports[i], data_dir=dirs[i], advertise=host)
            for i in range(count)]  # fmt: skip


def advertised_host(config: ServedConfig) -> str:
    """The host others reach `config`'s process at: that of its advertise setting, else its listening
    host (a wildcard: the machine's one address; common/addresses.py)."""
    return parse_advertise(config.advertise)[0] if config.advertise else reachable_host(config.host)


def free_port(host: str) -> int:
    """A port free on `host` now (the kernel's pick). Shards keep theirs across restarts, so clients
    holding a route find a restarted shard where it was."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class ShardPool(WorkerPool):
    """`count` merged nodes; `config` is shard 0's proxy, shard `i` serves clients on `client_ports[i]`."""

    brokers: list[BrokerConfig] = field(default_factory=list)
    client_ports: list[int] = field(default_factory=list)
    label = "shard"

    def _write_configs(self, run_dir: Path) -> None:
        host = advertised_host(self.config)
        for i, broker in enumerate(self.brokers):
            port = self.client_ports[i]
            proxy = replace(self.config, port=port, metrics_port=0, advertise=host_port(host, port))
            if i:  # AMQP is served by shard 0 alone: it holds every AMQP queue (docs/amqp.md, "Shards")
                proxy = replace(proxy, amqp=replace(proxy.amqp, port=-1))
            # MQTT is served by every shard on the same ports (docs/mqtt.md, "Placement").
            proxy = replace(proxy, mqtt=replace(proxy.mqtt, shared_port=self.count > 1))
            text = dumps({"broker": _plain(to_dict(broker)), "proxy": _plain(to_dict(proxy))})
            (run_dir / f"{shard_name(i)}.toml").write_text(text)

    def _argv(self, index: int, run_dir: Path, ops_file: Path) -> list[str]:
        return [sys.executable, "-m", "sluice", "node", "--config", str(run_dir / f"{shard_name(index)}.toml"),
                "--supervisor-pid", str(os.getpid()), "--ops-file", str(ops_file), "--await-nodes", str(self.count),
                *self.log_args]  # fmt: skip


def _plain(value: object) -> object:
    """`to_dict`'s tree with paths as strings and unset (None) values left out, as TOML needs."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value
