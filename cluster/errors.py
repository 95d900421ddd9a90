"""Errors of `sluice cluster`: each message is one line a user can act on."""

from __future__ import annotations

from common.config import ConfigError


class TopologyError(ConfigError):
    """A topology file that cannot be used; the message names the file, the entry and the key."""


class ClusterError(RuntimeError):
    """A cluster that cannot be started, inspected or stopped as asked."""


class NoCluster(ClusterError):
    """No state file, or the one there records a cluster that has stopped."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(f"no cluster is running in {run_dir} (start one with sluice cluster up)")
