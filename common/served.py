"""`ServedConfig`: the keys every served Sluice process with a NameServer states alike.

The broker's `[broker]` and the proxy's `[proxy]` tables both begin with these: where the process
listens, the address other processes reach it by, its NameServers, and its operations endpoint
(`/healthz`, `/readyz`, `/metrics`: ops/endpoint.py) with the metrics it keeps. Each component's
config class derives from it and restates only its own default port.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.metrics import MetricsConfig


@dataclass(frozen=True)
class ServedConfig:
    # Where the process listens. Loopback by default: exposing it is a deliberate act.
    host: str = "127.0.0.1"
    # 0 picks a free port.
    port: int = 0
    # Address other processes (and, for a proxy, clients in routes) use to reach it (default host:port).
    advertise: str = ""
    # NameServers (host:port) to register with or read routes from; none: standalone.
    namesrv: list[str] = field(default_factory=list)
    # The operations endpoint's HTTP port (`/healthz`, `/readyz`, `/metrics`); 0: none.
    metrics_port: int = 0
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    @property
    def advertised_address(self) -> str:
        return self.advertise or f"{self.host}:{self.port}"
