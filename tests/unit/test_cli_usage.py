"""A misspelt option is reported by the command it was given to, with that command's usage and
the option meant (`sluice up --prot` printed the top-level usage, which names no option of up)."""

from __future__ import annotations

import pytest

from common.config import ConfigError
from sluice import main as cli
from sluice.commands import admin


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("argv", "usage", "last"),
    [
        (["up", "--prot", "9000"], "usage: sluice up ",
         "sluice up: error: unrecognized arguments: --prot 9000; did you mean --port?"),
        (["admin", "topic", "create", "t", "--queus", "3"], "usage: sluice admin topic create ",
         "sluice admin topic create: error: unrecognized arguments: --queus 3; did you mean --queues?"),
        (["admin", "message", "send", "t", "b", "--group", "g"], "usage: sluice admin message send ",
         "sluice admin message send: error: unrecognized arguments: --group g; did you mean --message-group?"),
        (["console", "--port", "1", "stray"], "usage: sluice console ",
         "sluice console: error: unrecognized arguments: stray"),
    ],
)  # fmt: skip
def test_an_unknown_option_gets_its_commands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, last: str
) -> None:
    lines = _error(capsys, *argv)
    assert lines[0].startswith(usage), lines
    assert lines[-1] == last, lines


@pytest.mark.parametrize(
    "argv",
    [["message", "get", "orders", "--id", "01A"], ["message", "get", "--topic", "orders", "--id", "01A"],
     ["message", "range", "orders", "--from", "now-1h"], ["message", "find", "orders", "--key", "k"]],
)  # fmt: skip
def test_every_message_command_takes_the_topic_first(argv: list[str]) -> None:
    """send, tail and list took TOPIC positionally, get, find and range as --topic (still accepted)."""
    args = cli.build_parser("admin").parse_args(["admin", *argv])
    admin._resolve_topic(args)
    assert args.topic == "orders"


def test_a_topic_given_twice_or_not_at_all_is_a_bad_argument() -> None:
    parser = cli.build_parser("admin")
    with pytest.raises(ConfigError, match="two topics given"):
        admin._resolve_topic(parser.parse_args(["admin", "message", "get", "a", "--topic", "b", "--id", "x"]))
    with pytest.raises(ConfigError, match="give the topic: message get TOPIC"):
        admin._resolve_topic(parser.parse_args(["admin", "message", "get", "--id", "x"]))
