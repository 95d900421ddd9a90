"""`sluice etcd`: run a one-member etcd on this machine for the broker groups of a local cluster.

A convenience for `sluice cluster up` (deploy/topologies/replicated.toml) and development: it
replaces itself with the `etcd` binary (Debian: `apt-get install etcd-server`) listening on the
given client and peer ports, so the supervisor's signals reach etcd itself. Production runs its
own etcd cluster (docs/replication.md); brokers only need its client URLs (`--etcd`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from processes.runtime import LOG_LEVELS

NAME = "etcd"
HELP = "Run a single-member etcd (the etcd binary) for local broker groups."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="etcd", help="member name (default etcd)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=2379, help="client port (default 2379)")
    parser.add_argument("--peer-port", type=int, default=2380, help="peer port (default 2380)")
    parser.add_argument("--data-dir", metavar="DIR", default="data/etcd", help="etcd's data directory")
    parser.add_argument("--metrics-port", type=int, help="accepted for symmetry with other commands; unused")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")


def argv(args: argparse.Namespace, binary: str) -> list[str]:
    client, peer = f"http://{args.host}:{args.port}", f"http://{args.host}:{args.peer_port}"
    level = "warn" if args.log_level == "warning" else args.log_level
    return [
        binary, "--name", args.name, "--data-dir", str(Path(args.data_dir)),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{args.name}={peer}", "--log-level", level,
    ]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    binary = shutil.which("etcd")
    if binary is None:
        print(
            "sluice etcd: the etcd binary is not installed (Debian/Ubuntu: apt-get install etcd-server)",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    os.execv(binary, argv(args, binary))
    return 0  # not reached
