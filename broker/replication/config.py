"""`[broker.replication]`: the broker group a broker belongs to and how it replicates."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicationConfig:
    # The broker group; empty (the default) means no replication and no etcd at all.
    group: str = ""
    # etcd client URLs (http://host:port); required with a group.
    etcd: list[str] = field(default_factory=list)
    # A write is acknowledged once every in-sync member holds it and at least this many are in sync.
    min_insync: int = 1
    # The member's etcd lease; a dead primary is replaced about this long after it stopped.
    lease_ttl_s: int = 3
    # The primary stops acknowledging this long before its lease could expire in etcd.
    fence_margin_s: float = 0.5
    # Where replicas connect to fetch the CommitLog (0: a free port, published in etcd).
    port: int = 0
    # host:port replicas connect to for this member's replication endpoint, published in etcd
    # (default: the broker's advertised host and `port`); set it when a NAT, a load balancer or a
    # relay sits between the members.
    advertise: str = ""
    # Where this member dials another member's replication endpoint, by that member's name
    # (host:port), instead of the `advertise` address it published in etcd: for a path between two
    # members that is not everyone's (a relay or tunnel on that path only).
    dial: dict[str, str] = field(default_factory=dict)
    # A replica further behind than this (bytes) or not caught up for this long leaves the in-sync set.
    max_lag_bytes: int = 64 * 1024 * 1024
    max_lag_ms: int = 3_000
    # A replica that has kept a write waiting this long while the other in-sync members (at least
    # min_insync with the primary) hold it leaves the in-sync set then, not after max_lag_ms.
    stall_ms: int = 500
    # Largest piece of CommitLog one replication frame carries.
    max_frame_bytes: int = 4 * 1024 * 1024
    # How often a member looks at the leader key (a failover is noticed within this).
    poll_interval_ms: int = 200

    def __post_init__(self) -> None:
        if self.min_insync < 1:
            raise ValueError(f"replication.min_insync must be at least 1, got {self.min_insync}")
        if self.group and not self.etcd:
            raise ValueError("replication.group needs replication.etcd (the etcd client URLs)")
        if self.lease_ttl_s < 2:
            raise ValueError(f"replication.lease_ttl_s must be at least 2 (etcd's minimum), got {self.lease_ttl_s}")
        if not 0 <= self.fence_margin_s < self.lease_ttl_s / 2:
            raise ValueError("replication.fence_margin_s must be below half the lease TTL")
        if self.max_lag_bytes <= 0 or self.max_lag_ms <= 0 or self.max_frame_bytes <= 0 or self.stall_ms <= 0:
            raise ValueError("replication: max_lag_bytes, max_lag_ms, stall_ms and max_frame_bytes must be positive")
        if self.advertise and not _is_host_port(self.advertise):
            raise ValueError(f"replication.advertise must be host:port, got {self.advertise!r}")
        for member, address in self.dial.items():
            if not _is_host_port(address):
                raise ValueError(f"replication.dial.{member} must be host:port, got {address!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.group)


def _is_host_port(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit())
