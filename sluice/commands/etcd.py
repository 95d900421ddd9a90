"""`sluice etcd`: run a one-member etcd on this machine for the broker groups of a local cluster.

A convenience for `sluice cluster up` (deploy/topologies/replicated.toml) and development: it
replaces itself with the `etcd` binary (Debian: `apt-get install etcd-server`) listening on the
given client and peer ports, so the supervisor's signals reach etcd itself. Production runs its
own etcd cluster (docs/replication.md); brokers only need its client URLs (`--etcd`).

It listens on `--host` and advertises the address other machines reach it at, as every Sluice
process does (common/addresses.py): `--advertise HOST`, else `--host`, else for a wildcard the
machine's one address (several: it refuses to start, naming `--advertise`). etcd hands its
advertised client URLs to clients that ask for the cluster's members; `0.0.0.0` there would send
them to their own machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from common.addresses import advertised, check_advertise, host_port, parse_advertise
from common.config import ConfigError
from processes.runtime import LOG_LEVELS

NAME = "etcd"
HELP = "Run a single-member etcd (the etcd binary) for local broker groups."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="etcd", help="member name (default etcd)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--advertise", metavar="HOST",
        help="address other machines reach this etcd at, in its client and peer URLs, each with its own port "
        "(default: --host; with 0.0.0.0 or :: the machine's one address, and several refuse to start without this)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=2379, help="client port (default 2379)")
    parser.add_argument("--peer-port", type=int, default=2380, help="peer port (default 2380)")
    parser.add_argument("--data-dir", metavar="DIR", default="data/etcd", help="etcd's data directory")
    parser.add_argument("--metrics-port", type=int, help="accepted for symmetry with other commands; unused")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")


def argv(args: argparse.Namespace, binary: str) -> list[str]:
    """The etcd command line; a ConfigError when the advertised address is refused or ambiguous."""
    advertise = _advertise_host(args.advertise)
    client, peer = (f"http://{host_port(args.host, port)}" for port in (args.port, args.peer_port))
    client_url, peer_url = (f"http://{advertised(args.host, port, advertise)}" for port in (args.port, args.peer_port))
    level = "warn" if args.log_level == "warning" else args.log_level
    return [
        binary, "--name", args.name, "--data-dir", str(Path(args.data_dir)),
        "--listen-client-urls", client, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"{args.name}={peer_url}", "--log-level", level,
    ]  # fmt: skip


def _advertise_host(value: str | None) -> str:
    """`--advertise HOST`: a host alone (the client and peer ports go with it); "" when not given."""
    if value is None:
        return ""
    try:
        check_advertise(value, "--advertise")
        host, port = parse_advertise(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if port is not None:
        raise ConfigError(f"--advertise {value!r}: give the host alone; the client and peer URLs take their own "
                          "ports (--port, --peer-port)")  # fmt: skip
    return host


def run(args: argparse.Namespace) -> int:
    binary = shutil.which("etcd")
    if binary is None:
        print(
            "sluice etcd: the etcd binary is not installed (Debian/Ubuntu: apt-get install etcd-server)",
            file=sys.stderr,
        )
        return 2
    command = argv(args, binary)  # a refused address stops here, before etcd starts
    sys.stdout.flush()
    os.execv(binary, command)
    return 0  # not reached
