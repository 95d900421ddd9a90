"""Structured logging for every Sluice process.

`setup_logging(level, json_lines)` configures the root logger once per process. Log calls pass
context as `extra={"kv": {...}}`; the text formatter appends it as `key=value`, the JSON formatter
as fields. `set_level` changes the level at runtime (the ops endpoint's `PUT /loglevel`, see
ops/endpoint.py and docs/observability.md).

Request context: the proxy's edge calls `bind_request(request_id, client_id)` once per RPC; a
filter on the handler adds both to every record logged while that RPC runs (each gRPC call runs in
its own asyncio task, so the context variables never leak between calls).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import sys
import time
from collections.abc import Hashable
from typing import Any

_TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")
# Libraries whose DEBUG lines say nothing about Sluice (gRPC logs `[_cygrpc] Loaded running loop`
# once per call, botocore every HTTP header): at `debug` they stay at INFO, so debug is ours.
QUIET_LIBRARIES = ("grpc", "botocore", "boto3", "s3transfer", "urllib3", "aiohttp", "asyncio")

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("sluice_request_id", default="")
_client_id: contextvars.ContextVar[str] = contextvars.ContextVar("sluice_client_id", default="")


def bind_request(request_id: str, client_id: str) -> None:
    """Tag every log line of the current task (one RPC) with its request id and client id."""
    _request_id.set(request_id)
    _client_id.set(client_id)


def current_request() -> tuple[str, str]:
    """(request id, client id) of the RPC the current task serves; empty strings outside one."""
    return _request_id.get(), _client_id.get()


# gRPC metadata keys that carry the two across Sluice's internal RPCs (RemoteBroker -> broker), so
# the broker's log lines of a proxied call name the same request and client.
MD_REQUEST_ID = "x-sluice-request-id"
MD_CLIENT_ID = "x-sluice-client-id"


class RequestContextFilter(logging.Filter):
    """Adds `request_id` and `client_id` of the RPC being served (empty outside one) to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get()
        record.client_id = _client_id.get()
        return True


def _context(record: logging.LogRecord) -> dict[str, str]:
    out = {}
    for name in ("request_id", "client_id"):
        value = getattr(record, name, "")
        if value:
            out[name] = value
    return out


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        fields = {**(getattr(record, "kv", None) or {}), **_context(record)}
        if fields:
            base += " " + " ".join(f"{k}={_short(v)}" for k, v in fields.items())
        return base


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        kv = getattr(record, "kv", None)
        if kv:
            doc.update(kv)
        doc.update(_context(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _short(value: Any) -> str:
    text = str(value)
    return text if " " not in text else json.dumps(text)


class MalformedHttpFilter(logging.Filter):
    """aiohttp logs a request it cannot parse (answered 400) at ERROR with a full traceback; a gRPC
    client pointed at an HTTP port (the console's given as --namesrv) made one per connection.
    This makes such a record one WARNING line saying what probably happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not any(c.__name__ == "HttpProcessingError" for c in type(exc).__mro__):
            return True
        what = str(getattr(exc, "message", "") or exc).strip().splitlines()[0].rstrip(":")
        record.msg = (f"{record.getMessage()}: not an HTTP/1.1 request ({what}), answered 400; an HTTP/2 or "
                      "gRPC client? (e.g. this HTTP port given as a gRPC address such as --namesrv)")  # fmt: skip
        record.args = ()
        record.exc_info = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def setup_logging(level: str = "info", json_lines: bool = False) -> None:
    aiohttp_server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpFilter) for f in aiohttp_server.filters):
        aiohttp_server.addFilter(MalformedHttpFilter())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if json_lines else _TextFormatter(_TEXT_FORMAT))
    handler.addFilter(RequestContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)


def set_level(level: str) -> None:
    numeric = logging.getLevelName(level.strip().upper())
    if level.strip().lower() not in LEVELS or not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    logging.getLogger().setLevel(numeric)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(numeric, logging.INFO))


def get_level() -> str:
    return logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()


def kv(**fields: Any) -> dict[str, Any]:
    """`log.info("msg", extra=kv(topic=t))`: structured fields for one log line."""
    return {"kv": fields}


class BurstLog:
    """One INFO line per burst of like events instead of one per event (a consumer that fails
    every message dead-letters hundreds in a row): per key, the first event is logged at once, the
    ones that follow within `window_s` are counted and logged as one line when the window ends
    (`count=N`, with the last event's fields). Every event is logged at DEBUG too. The closing line
    is scheduled on the running event loop; without one it is logged with the next event (a window
    still open when the process stops is not logged: the DEBUG lines and the metrics have it)."""

    def __init__(self, logger: logging.Logger, message: str, window_s: float = 10.0) -> None:
        self._log = logger
        self._message = message
        self._window_s = window_s
        self._open: dict[Hashable, tuple[float, int, dict[str, Any]]] = {}  # key -> (window end, count, last)
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}

    def event(self, key: Hashable, **fields: Any) -> None:
        self._log.debug(self._message, extra=kv(**fields))
        now = time.monotonic()
        window = self._open.get(key)
        if window is not None and now >= window[0]:
            self._close(key)
            window = None
        if window is not None:
            end, count, _ = window
            self._open[key] = (end, count + 1, fields)
            return
        self._open[key] = (now + self._window_s, 0, fields)
        self._log.info(self._message, extra=kv(**fields))
        try:  # the window closes on time (and its key goes) even if no event follows
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timers[key] = loop.call_later(self._window_s, self._close, key)

    def _close(self, key: Hashable) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        _, count, last = self._open.pop(key, (0.0, 0, {}))
        if count:
            self._log.info(f"{self._message} (more within {self._window_s:g} s)", extra=kv(count=count, **last))
