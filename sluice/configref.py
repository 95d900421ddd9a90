"""The configuration reference (docs/configuration.md), generated from the typed configuration.

Every key of every component's dataclass tree (`[nameserver]`, `[navigation]`, `[broker]`,
`[proxy]` and their sub-tables), with its type, default, unit (from the name's suffix), the
command-line flag that sets it, and the comment written above or beside the field in the source.
`python scripts/gen_config_docs.py` rewrites the page; a unit test fails when it is stale.

Flags: a top-level key `foo_bar` is set by `--foo-bar` where the command has that option; other
keys a flag sets are listed in `_FLAGS` (checked against the parsers, so a renamed flag fails).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import textwrap
import types
import typing
from typing import Any

from broker.config import BrokerConfig
from nameserver.config import NameServerConfig
from navigation.config import NavigationConfig
from processes.shardpool import UpConfig
from proxy.config import ProxyConfig
from sluice import main as cli

COMPONENTS: list[tuple[str, type, str]] = [
    ("nameserver", NameServerConfig, "nameserver"),
    ("navigation", NavigationConfig, "navigation"),
    ("broker", BrokerConfig, "broker"),
    ("proxy", ProxyConfig, "proxy"),
    ("up", UpConfig, "up"),
]
# Keys set by a flag whose name is not the key's (dotted keys relative to the component's table).
_FLAGS: dict[str, dict[str, str]] = {
    "broker": {
        "namesrv": "--namesrv",
        "store.commitlog.flush_policy": "--flush",
        "store.commitlog.segment_bytes": "--segment-bytes",
        "tiering.endpoint_url": "--s3-endpoint",
        "tiering.bucket": "--s3-bucket",
        "tiering.prefix": "--s3-prefix",
        "tiering.region": "--s3-region",
        "tiering.min_age_s": "--tier-min-age",
        "metrics.enabled": "--no-metrics",
        "trace.enabled": "--no-trace",
        "replication.group": "--group",
        "replication.etcd": "--etcd",
        "replication.min_insync": "--min-insync",
        "replication.port": "--repl-port",
        "replication.advertise": "--repl-advertise",
        "replication.dial": "--repl-dial",
    },
    "proxy": {
        "auth.enabled": "--auth",
        "tls.cert_file": "--tls-cert",
        "tls.key_file": "--tls-key",
        "metrics.enabled": "--no-metrics",
        "amqp.port": "--amqp-port",
        "mqtt.port": "--mqtt-port",
        "mqtt.ws_port": "--mqtt-ws-port",
    },
}
_UNITS = [("_ms", "milliseconds"), ("_s", "seconds"), ("_bytes", "bytes"), ("_mib", "MiB"), ("_mb", "MB"),
          ("_per_s", "per second"), ("_pct", "percent"), ("_ratio", "ratio")]  # fmt: skip

HEADER = """# Configuration reference

Generated from the typed configuration by `scripts/gen_config_docs.py` (a test fails when this page
is stale): do not edit by hand. The server commands (`up`, `nameserver`, `broker`, `proxy`,
`navigation`, `console`) and `sluice spark` take `--config FILE`, a TOML file with one table per
component; a key not given keeps its default, an unknown key or a wrong type is an error naming
the key. Flags override the file. `sluice up` reads `[nameserver]`, `[broker]` and `[proxy]` of
one file (its `--port` is the proxy's, `--namesrv-port` the NameServer's, `--broker-port` the
broker's); `sluice cluster` writes each process's table from the topology file.

Units are the last part of a key's name: `_s` seconds, `_ms` milliseconds, `_bytes` bytes.
"""


def _comments(cls: type) -> dict[str, str]:
    """Field name -> the comment lines right above it plus its trailing comment, from the source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out: dict[str, str] = {}
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef)
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        above: list[str] = []
        i = stmt.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            text = lines[i].strip().lstrip("#").strip()
            if not (text.startswith("--") and text.endswith("--")):  # a section rule, not the field's
                above.insert(0, text)
            i -= 1
        line = lines[stmt.lineno - 1]
        trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        out[stmt.target.id] = " ".join(p for p in [*above, trailing] if p and not p.startswith("fmt:"))
    return out


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):  # `int | None`: "int | unset"
        return " | ".join("unset" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return f'`"{value}"`' if value else '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | tuple | dict | frozenset | set):
        return f"`{value!r}`" if value else "empty"
    return f"`{value!r}`"


def _unit(name: str) -> str:
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), "")


def _options(command: str) -> set[str]:
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for action in sub.choices[command]._actions for s in action.option_strings}


def _flag(component: str, key: str, options: set[str]) -> str:
    explicit = _FLAGS.get(component, {}).get(key)
    if explicit is not None:
        if explicit not in options:
            raise ValueError(f"configref: {explicit} (for [{component}] {key}) is no option of sluice {component}")
        return f"`{explicit}`"
    conventional = "--" + key.replace("_", "-")
    return f"`{conventional}`" if "." not in key and conventional in options else ""


def _rows(component: str, cls: type, instance: Any, prefix: str, options: set[str]) -> list[tuple[str, list[str]]]:
    """(table name, markdown rows) of `cls` and, after it, of each nested table."""
    hints = typing.get_type_hints(cls)
    notes: dict[str, str] = {}
    for base in reversed(cls.__mro__):  # a derived class's comment on a field it restates wins
        if dataclasses.is_dataclass(base):
            notes.update({k: v for k, v in _comments(base).items() if v})
    rows: list[str] = []
    nested: list[tuple[str, list[str]]] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value = getattr(instance, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            nested.extend(_rows(component, type(value), value, f"{key}.", options))
            continue
        text = notes.get(f.name, "").replace("|", "\\|")
        cells = [f"`{f.name}`", _type_name(hints[f.name]).replace("|", "\\|"), _default(value), _unit(f.name),
                 _flag(component, key, options), text]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    table = f"{component}.{prefix[:-1]}" if prefix else component
    return [(table, rows), *nested]


def render() -> str:
    parts = [HEADER]
    for component, cls, command in COMPONENTS:
        options = _options(command)
        for table, rows in _rows(component, cls, cls(), "", options):
            if not rows:
                continue
            parts.append(f"\n## `[{table}]`\n")
            doc = inspect.getdoc(cls) if table == component else None
            if doc and not doc.startswith(cls.__name__ + "("):
                parts.append(doc.splitlines()[0] + "\n")
            parts.append("| key | type | default | unit | flag | what |\n|---|---|---|---|---|---|")
            parts.append("\n".join(rows))
    return "\n".join(parts) + "\n"
