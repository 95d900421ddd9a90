"""`ConsoleConfig`: the `[console]` table of a Sluice config file (flags of `sluice console` override it).

Checked when built (`common.config.load_config` names the table in the error), so a running console
never holds a nonsensical setting. Loopback by default: exposing the console is a deliberate act.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import check_bounds

DEFAULT_PORT = 8080
MAX_PORT = 65535
AUTH_MODES = ("on", "off")
PROMETHEUS_SCHEMES = ("http://", "https://")


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0 picks a free port
    # NameServers (`HOST:PORT[;HOST:PORT]`): the console finds brokers through them, as `sluice admin` does.
    namesrv: str = "127.0.0.1:9876"
    # A navigation server (`HOST:PORT`, gRPC): the cluster page lists its proxies. "" leaves them out.
    navigation: str = ""
    # Without navigation: proxies (`HOST:PORT`, the client endpoints) to list on the cluster page
    # besides those the brokers' client reports name (`sluice up` gives its own).
    proxies: tuple[str, ...] = ()
    # "on": every page needs a login of a user with ADMIN on `*` (the cluster runs `--auth on`).
    auth: str = "off"
    # No page offers an action, and every POST but login/logout is refused.
    read_only: bool = False
    # Deadline of each call to a NameServer or broker.
    timeout_s: float = 5.0
    # NameServer answers (brokers, topic list, routes) and the proxies' client reports are reused
    # within one page (a page of 50 rows asks once) for at most this long; a page never shows an
    # answer asked before it was requested (another page's, the sampler's).
    nameserver_cache_s: float = 1.0
    # Rows per page of a long list.
    page_rows: int = 50
    # Plots: topics and groups viewed in the last `history_s` are sampled every `sample_interval_s`,
    # at most `watched_max` of them, and `history_s` of points are kept in memory.
    sample_interval_s: float = 10.0
    history_s: float = 3600.0
    watched_max: int = 200
    # The cluster page's message rates sample every user topic while the page is watched; above
    # this many topics they are not sampled (Prometheus, `prometheus` below, gives them).
    cluster_topics_max: int = 1000
    # Prometheus (`http://HOST:9090`) that scrapes the cluster: plots are read from it (the last
    # `history_s`, one point per `sample_interval_s`) instead of the console's samples. "" = off.
    prometheus: str = ""
    # The range of PromQL `rate()` for rates read from Prometheus (at least 2 scrape intervals).
    prometheus_rate_window_s: float = 60.0
    # A session (login and CSRF token) ends after this long without a request.
    session_idle_s: float = 3600.0
    sessions_max: int = 10_000

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host is empty; use an address to listen on, e.g. 127.0.0.1")
        if not 0 <= self.port <= MAX_PORT:
            raise ValueError(f"port {self.port} is out of range 0..{MAX_PORT}")
        if not self.namesrv:
            raise ValueError("namesrv is empty; give the NameServers as HOST:PORT[;HOST:PORT]")
        if self.prometheus and not self.prometheus.startswith(PROMETHEUS_SCHEMES):
            raise ValueError(f"prometheus must be an http:// or https:// URL, got {self.prometheus!r}")
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be on or off, got {self.auth!r}")
        if self.nameserver_cache_s < 0:
            raise ValueError(f"nameserver_cache_s must be 0 (off) or more, got {self.nameserver_cache_s}")
        check_bounds(
            self,
            positive=("timeout_s", "sample_interval_s", "history_s", "session_idle_s", "prometheus_rate_window_s"),
            at_least_one=("page_rows", "watched_max", "sessions_max", "cluster_topics_max"),
        )

    @property
    def auth_required(self) -> bool:
        return self.auth == "on"
