"""`HttpLimits`: the bounds of one HTTP server (common/httpserver.py enforces them).

Apart from the server so that a configuration naming them (`[navigation.http_limits]`) is read
without importing aiohttp: `sluice admin` reads navigation's configuration module and never
serves HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import check_bounds


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds of one HTTP server (`[navigation.http_limits]`). Units are last in every name."""

    max_request_line_bytes: int = 8 * 1024
    max_header_bytes: int = 8 * 1024  # one header line
    max_headers: int = 64
    max_body_bytes: int = 64 * 1024
    max_query_params: int = 32
    max_connections: int = 256
    idle_timeout_s: float = 30.0  # a keep-alive connection may wait this long for the next request
    handler_timeout_s: float = 30.0
    keep_alive: bool = True

    def __post_init__(self) -> None:
        check_bounds(
            self,
            at_least_one=("max_request_line_bytes", "max_header_bytes", "max_headers", "max_query_params",
                          "max_connections"),
            not_negative=("max_body_bytes",),
            positive=("idle_timeout_s", "handler_timeout_s"),
        )  # fmt: skip
