"""Structured logging for every Sluice process.

`setup_logging(level, json_lines)` configures the root logger once per process. Log calls pass
context as `extra={"kv": {...}}`; the text formatter appends it as `key=value`, the JSON formatter
as fields. `set_level` changes the level at runtime (the ops endpoint's `PUT /loglevel`, see
deploy/ops.py and docs/observability.md).

Request context: the proxy's edge calls `bind_request(request_id, client_id)` once per RPC; a
filter on the handler adds both to every record logged while that RPC runs (each gRPC call runs in
its own asyncio task, so the context variables never leak between calls).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

_TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")

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


def setup_logging(level: str = "info", json_lines: bool = False) -> None:
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


def get_level() -> str:
    return logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()


def kv(**fields: Any) -> dict[str, Any]:
    """`log.info("msg", extra=kv(topic=t))`: structured fields for one log line."""
    return {"kv": fields}
