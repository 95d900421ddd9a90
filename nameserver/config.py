"""`NameServerConfig`: the `[nameserver]` table of a Sluice config file.

Every field has a default, so a NameServer runs with no file at all. Values are checked when the
dataclass is built (`common.config.load_config` turns the ValueError into a ConfigError naming the
table), so a running NameServer never holds a nonsensical setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import check_bounds
from nameserver.registry import DEFAULT_MAX_BROKERS

DEFAULT_PORT = 9876
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    # Where the internal gRPC service listens. Loopback by default: exposing it is a deliberate act.
    host: str = "127.0.0.1"
    # 0 picks a free port (the command prints the one it got).
    port: int = DEFAULT_PORT
    # A broker not heard from for this long drops out of every route and listing.
    broker_expiry_s: float = 120.0
    # For this long after start, routes are marked young: a live broker may not have re-registered
    # yet (a broker's heartbeat interval, 5 s, plus its reconnect backoff cap, 5 s, plus a margin),
    # so proxies keep brokers a young route lacks (docs/nameserver.md).
    young_s: float = 12.0
    # How often expired brokers are removed from memory (reads already skip them).
    sweep_interval_s: float = 1.0
    # On SIGTERM, in-flight calls get this long to finish before they are cancelled.
    shutdown_grace_s: float = 5.0
    # Largest request or response; a registration carries a broker's whole topic list.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Calls served at once; further calls are refused (RESOURCE_EXHAUSTED) rather than queued.
    max_concurrent_rpcs: int = 1024
    # Distinct brokers held at once; a registration of one more is refused.
    max_brokers: int = DEFAULT_MAX_BROKERS

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host is empty; use an address to listen on, e.g. 127.0.0.1")
        if not 0 <= self.port <= MAX_PORT:
            raise ValueError(f"port {self.port} is out of range 0..{MAX_PORT}")
        check_bounds(
            self,
            positive=("broker_expiry_s", "sweep_interval_s"),
            not_negative=("young_s", "shutdown_grace_s"),
            at_least_one=("max_message_bytes", "max_concurrent_rpcs", "max_brokers"),
        )
