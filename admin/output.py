"""What an admin subcommand prints: a `Report` rendered as an aligned table or as JSON.

A report has columns and rows (dicts keyed by column); the table shows exactly those, in that
order. JSON prints `data` when given (richer than the table: full properties, bodies), else the
rows. Text cells are made printable and single-line, so a message body cannot break the table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.model import MessageType

EMPTY_TABLE = "(none)"
CELL_CHARS_MAX = 60
_COLUMN_GAP = "  "
_MS_PER_S = 1000


@dataclass
class Report:
    columns: Sequence[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    data: Any = None  # what --json prints, when it differs from the rows
    note: str = ""  # one line printed under the table (not in JSON)
    streamed: bool = False  # the command printed its output as it went (message tail): print nothing more


def render_table(report: Report) -> str:
    cells = [[cell(row.get(column)) for column in report.columns] for row in report.rows]
    header = [column.upper() for column in report.columns]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    lines = [_line(header, widths)]
    lines.extend(_line(r, widths) for r in cells)
    if not cells:
        lines.append(EMPTY_TABLE)
    if report.note:
        lines.append(report.note)
    return "\n".join(lines)


def render_json(report: Report) -> str:
    return json.dumps(report.data if report.data is not None else report.rows, indent=2, default=_json_default)


def format_types(types: Iterable[MessageType]) -> str:
    return ",".join(t.name.lower() for t in sorted(types))


def format_time_ms(epoch_ms: int) -> str:
    if epoch_ms <= 0:
        return ""
    moment = dt.datetime.fromtimestamp(epoch_ms / _MS_PER_S, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_bytes(count: int) -> str:
    """1536 -> "1.5 KiB" (binary units, as the console shows them)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def preview(body: bytes, chars_max: int = CELL_CHARS_MAX) -> str:
    text = body.decode("utf-8", "replace")
    return text if len(text) <= chars_max else text[: chars_max - 1] + "…"


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple | frozenset | set):
        return ",".join(cell(v) for v in value)
    if isinstance(value, Mapping):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items())
    text = str(value)
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return _COLUMN_GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _json_default(value: Any) -> Any:
    if isinstance(value, frozenset | set | tuple):
        return sorted(value) if isinstance(value, frozenset | set) else list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
