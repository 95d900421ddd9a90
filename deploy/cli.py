"""Entry point of the `sluice` command."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

import deploy.commands
from common.config import ConfigError
from common.errors import SluiceError


def _command_modules() -> list[ModuleType]:
    mods = []
    for info in pkgutil.iter_modules(deploy.commands.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"deploy.commands.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.NAME)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sluice: a message broker for the Apache RocketMQ 5 gRPC clients.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc: int = args._run(args)
    except (ConfigError, SluiceError) as exc:
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
