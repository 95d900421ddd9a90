"""`ServedConfig`: the keys every served Sluice process with a NameServer states alike.

The broker's `[broker]` and the proxy's `[proxy]` tables both begin with these: where the process
listens, the address other processes reach it by, its NameServers, and its operations endpoint
(`/healthz`, `/readyz`, `/metrics`: ops/endpoint.py) with the metrics it keeps. Each component's
config class derives from it and restates only its own default port.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from common.addresses import advertised, check_advertise, is_loopback, split_host_port
from common.metrics import MetricsConfig

log = logging.getLogger("sluice.config")


@dataclass(frozen=True)
class ServedConfig:
    # Where the process listens. Loopback by default: exposing it is a deliberate act.
    host: str = "127.0.0.1"
    # 0 picks a free port.
    port: int = 0
    # Address (host:port) other processes (and, for a proxy, clients in routes) use to reach it.
    # Default: host:port; with a wildcard host (0.0.0.0, ::) the machine's one address (a machine
    # with several refuses to start until this is given; common/addresses.py).
    advertise: str = ""
    # NameServers (host:port) to register with or read routes from; none: standalone.
    namesrv: list[str] = field(default_factory=list)
    # The operations endpoint's HTTP port (`/healthz`, `/readyz`, `/metrics`); 0: none.
    metrics_port: int = 0
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        check_advertise(self.advertise)

    @property
    def advertised_address(self) -> str:
        """Where others reach this process (common/addresses.py `advertised`: never a wildcard; a
        ConfigError when a wildcard host leaves it ambiguous, which each command raises at start)."""
        return advertised(self.host, self.port, self.advertise)

    def checked_address(self, what: str) -> str:
        """The advertised address, checked as a command starts: a ConfigError when a wildcard host
        leaves it ambiguous; a warning when a process listening beyond loopback advertises loopback
        (then only this machine can use what it hands out)."""
        address = self.advertised_address
        if is_loopback(split_host_port(address)[0]) and not is_loopback(self.host):
            log.warning("%s listens on %s but advertises %s: processes and clients on other machines cannot reach it "
                        "there (give --advertise)", what, self.host, address)  # fmt: skip
        return address
