"""Write the config file of one process: nested tables of strings, numbers, booleans and lists.

The stdlib reads TOML (`tomllib`) but does not write it. The topology's `[config.*]` tables hold
only what TOML can hold, so a small writer suffices: scalars and lists first, then sub-tables as
`[a.b]` headers. Keys that are not bare are quoted. `tomllib.loads(dumps(t)) == t` for every table
this accepts; anything else (None, dates, arrays of tables) raises TypeError.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dumps(table: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _table(lines, (), table)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars)
    for key, sub in tables:
        _table(lines, (*path, key), sub)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as a TOML value")


def _string(text: str) -> str:
    # JSON's string escapes are TOML basic-string escapes (\", \\, \n, \uXXXX). Non-ASCII stays as is
    # (an escaped astral character would be a surrogate pair, which TOML refuses); DEL must be escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
