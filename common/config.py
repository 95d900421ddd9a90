"""Typed configuration: frozen dataclasses loaded from TOML and overridden from the command line.

Each component owns one dataclass tree (`BrokerConfig`, `NameServerConfig`, `ProxyConfig`, ...)
whose fields carry defaults, so a component runs with no file at all. A TOML file holds one table
per component (`[broker]`, `[broker.store]`, `[nameserver]`, ...); `load_config` reads the table
for one component, applies `--flag` overrides given as dotted keys (`store.flush_policy`), and
builds the dataclasses, checking every value's type. Unknown keys and wrong types are errors that
name the key and what was expected: a typo in a config file must not be silently ignored.

Units are last in field names (`segment_bytes`, `flush_interval_ms`), as everywhere in Sluice.
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or flag that cannot be used; the message names the key."""


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None


def check_bounds(
    obj: object, *, positive: Iterable[str] = (), not_negative: Iterable[str] = (), at_least_one: Iterable[str] = ()
) -> None:
    """For a config dataclass's `__post_init__`: ValueError naming the first of the named fields
    outside its bound (`load_config` turns it into a ConfigError naming the table)."""
    for names, outside, bound in (
        (positive, lambda v: v <= 0, "be positive"),
        (not_negative, lambda v: v < 0, "not be negative"),
        (at_least_one, lambda v: v < 1, "be at least 1"),
    ):
        for name in names:
            value = getattr(obj, name)
            if outside(value):
                raise ValueError(f"{name} must {bound}, got {value}")


def load_config(
    cls: type[T],
    *,
    section: str,
    path: str | Path | None = None,
    data: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from table `section` of a TOML file (or an already parsed mapping) plus overrides.

    Overrides are dotted keys relative to the section; a value of None means "flag not given".
    """
    root: Mapping[str, Any] = data if data is not None else (read_toml(path) if path else {})
    table = _dig(root, section)
    merged = _deep_copy(table)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(merged, dotted, value)
    return build(cls, merged, where=section)


def build(cls: type[T], table: Mapping[str, Any], *, where: str) -> T:
    """Build dataclass `cls` from a mapping, checking keys and types recursively."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"[{where}] unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}")
    try:
        return typing.cast(T, cls(**kwargs))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{where}] {exc}") from None


def to_dict(obj: Any) -> Any:
    """A config tree as plain TOML-compatible data (enums as their values)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return build(typing.cast(type, tp), value, where=where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(f"{where}: {value!r} is not one of {allowed}") from None
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_coerce(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        key_tp, val_tp = args or (Any, Any)
        return {_coerce(key_tp, k, where): _coerce(val_tp, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "on", "off", "yes", "no"):
            return value.lower() in ("true", "on", "yes")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, str | Path):
            return Path(value)
        raise ConfigError(f"{where}: expected a path, got {value!r}")
    raise ConfigError(f"{where}: unsupported config type {tp!r}")


def _dig(root: Mapping[str, Any], dotted: str) -> Mapping[str, Any]:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            raise ConfigError(f"[{dotted}] is not a table")
        node = node.get(part, {})
    if not isinstance(node, Mapping):
        raise ConfigError(f"[{dotted}] is not a table")
    return node


def _deep_copy(table: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in table.items()}


def _set_dotted(table: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = table
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted}: {part} is not a table")
        node = child
    node[parts[-1]] = value
