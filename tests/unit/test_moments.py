"""Moments relative to now (`now-2h`), so that the README's Spark and admin examples keep working
over data produced today (they named a fixed day in 2024 and found nothing)."""

from __future__ import annotations

import time

import pytest

from admin.parse import parse_time_ms
from common.config import ConfigError
from common.errors import BadRequest
from common.moments import relative_ms
from spark_jobs.options import parse_time

NOW_MS = 1_780_000_000_000


@pytest.mark.parametrize(
    ("text", "ago_ms"),
    [("now", 0), ("now-90s", 90_000), ("now-30m", 1_800_000), ("NOW-2h", 7_200_000), ("now - 7d", 604_800_000)],
)
def test_relative_moments(text: str, ago_ms: int) -> None:
    assert relative_ms(text, NOW_MS) == NOW_MS - ago_ms


@pytest.mark.parametrize("text", ["", "now+1h", "now-h", "now-2w", "yesterday", "2024-06-01", "123"])
def test_anything_else_is_not_relative(text: str) -> None:
    assert relative_ms(text, NOW_MS) is None


def test_spark_and_admin_times_accept_relative_moments() -> None:
    before = int(time.time() * 1000)
    for parse in (lambda t: parse_time(t, "from"), lambda t: parse_time_ms(t, "--from")):
        assert before - 3_600_000 <= parse("now-1h") <= int(time.time() * 1000) - 3_600_000
        assert parse("2024-06-01T00:00:00Z") == 1_717_200_000_000  # absolute forms unchanged
    with pytest.raises(BadRequest, match=r"now, now-90s"):
        parse_time("later", "from")
    with pytest.raises(ConfigError, match=r"now, now-90s"):
        parse_time_ms("later", "--from")
