"""Structured logging for every Sluice process.

`setup_logging(level, json_lines)` configures the root logger once per process. Log calls pass
context as `extra={"kv": {...}}`; the text formatter appends it as `key=value`, the JSON formatter
as fields. `set_level` changes the level at runtime (the admin API and SIGUSR1 use it).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        kv = getattr(record, "kv", None)
        if kv:
            base += " " + " ".join(f"{k}={_short(v)}" for k, v in kv.items())
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
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _short(value: Any) -> str:
    text = str(value)
    return text if " " not in text else json.dumps(text)


def setup_logging(level: str = "info", json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if json_lines else _TextFormatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)


def set_level(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    logging.getLogger().setLevel(numeric)


def kv(**fields: Any) -> dict[str, Any]:
    """`log.info("msg", extra=kv(topic=t))`: structured fields for one log line."""
    return {"kv": fields}
