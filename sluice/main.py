"""Entry point of the `sluice` command."""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import sys
from types import ModuleType

import sluice.commands
from common.config import ConfigError
from common.errors import SluiceError
from proto import token


def _command_names() -> list[str]:
    return sorted(i.name for i in pkgutil.iter_modules(sluice.commands.__path__) if not i.name.startswith("_"))


def _command_modules(only: str | None = None) -> list[ModuleType]:
    """Command modules; with `only`, just that one (a process imports what it runs, nothing more)."""
    mods = []
    for name in [only] if only else _command_names():
        mod = importlib.import_module(f"sluice.commands.{name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.NAME)


class _VersionAction(argparse.Action):
    """`--version`: like argparse's own, but the version is looked up only when asked for (reading
    the installed package's metadata costs every other command ~20 ms)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: object, values: object, _option_string: str | None = None
    ) -> None:
        print(version())
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sluice: a message broker for the Apache RocketMQ 5 gRPC clients.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _command_modules(only):
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args`, but an unknown option is reported by the (sub)command it was given to,
    with that command's usage and the closest options it has (argparse reported it with the
    top-level usage, which names no option of the command)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = _innermost(parser, argv)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(owner, unknown)}")
    return args


def _innermost(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser `argv` reaches (`sluice admin topic create ...`: topic create's)."""
    current = parser
    for word in argv:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            current = subs[0].choices[word]
    return current


def did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """`; did you mean --port?` for the first unknown option close to options `parser` has (spelt
    alike, or one word of a longer name: `--group` of `--message-group`), else ""."""
    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    for word in unknown:
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=2, cutoff=0.75)
        close += [o for o in options if name[2:] in o[2:].split("-") and o not in close]
        if close:
            return f"; did you mean {' or '.join(close[:3])}?"
    return ""


def _first_known(group: BaseExceptionGroup) -> BaseException | None:
    for exc in group.exceptions:
        if isinstance(exc, ConfigError | SluiceError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (inner := _first_known(exc)) is not None:
            return inner
    return None


def version() -> str:
    from common.version import sluice_version  # importlib.metadata: only for --version

    return f"sluice {sluice_version()} (Python {sys.version.split()[0]})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = argv[0] if argv and argv[0] in _command_names() else None
    parser = build_parser(only)
    args = parse(parser, argv)
    try:
        token.configure(token.from_environment())
        rc: int = args._run(args)
    except (ConfigError, SluiceError) as exc:
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # parts started together (sluice up): the first known cause
        cause = _first_known(group)
        if cause is None:
            raise
        print(f"sluice {args.command}: {cause}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
