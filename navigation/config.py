"""`NavigationConfig`: the `[navigation]` table of a Sluice config file (and `[navigation.http_limits]`).

Every field has a default, so a navigation server runs with no file at all. Values are checked when
the dataclass is built (`common.config.load_config` turns the ValueError into a ConfigError naming
the table), so a running navigation server never holds a nonsensical setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.config import check_bounds
from common.httplimits import HttpLimits
from navigation.registry import DEFAULT_MAX_PROXIES

# Next to the NameServer's 9876. The HTTP port avoids 8080/8088, which Spark/YARN hosts often hold.
DEFAULT_PORT = 9877
DEFAULT_HTTP_PORT = 9878
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class NavigationConfig:
    # Where the gRPC and HTTP services listen. Loopback by default: exposing them is a deliberate act.
    host: str = "127.0.0.1"
    # gRPC (proxies register here; clients may ask here). 0 picks a free port.
    port: int = DEFAULT_PORT
    # Plain HTTP (`/v1/endpoints`, `/v1/proxies`, `/healthz`, `/readyz`). 0 picks a free port.
    http_port: int = DEFAULT_HTTP_PORT
    # A proxy not heard from for this long is left out of every answer and listing.
    proxy_expiry_s: float = 15.0
    # How often expired proxies are removed from memory (reads already skip them).
    sweep_interval_s: float = 1.0
    # `/readyz` answers 503 after a start until a proxy registered or this long passed, so a
    # restarted navigation server does not take traffic before the fleet's heartbeats refilled it.
    warmup_s: float = 5.0
    # On SIGTERM, in-flight calls and HTTP requests get this long to finish before they are cancelled.
    shutdown_grace_s: float = 5.0
    # Largest gRPC request or response (an answer lists at most max_proxies proxies).
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # gRPC calls served at once; further calls are refused (RESOURCE_EXHAUSTED) rather than queued.
    max_concurrent_rpcs: int = 1024
    # Distinct proxies held at once; a registration of one more is refused (TOO_MANY_REQUESTS).
    max_proxies: int = DEFAULT_MAX_PROXIES
    # Sizes, counts and timeouts of the HTTP server.
    http_limits: HttpLimits = field(default_factory=HttpLimits)

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host is empty; use an address to listen on, e.g. 127.0.0.1")
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) <= MAX_PORT:
                raise ValueError(f"{name} {getattr(self, name)} is out of range 0..{MAX_PORT}")
        if self.port and self.port == self.http_port:
            raise ValueError(f"port and http_port are both {self.port}; give each its own port")
        check_bounds(
            self,
            positive=("proxy_expiry_s", "sweep_interval_s"),
            not_negative=("warmup_s", "shutdown_grace_s"),
            at_least_one=("max_message_bytes", "max_concurrent_rpcs", "max_proxies"),
        )
