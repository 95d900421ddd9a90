"""`sluice admin broker list`: a broker's `BrokerInfo` as columns, or its error in the row."""

from __future__ import annotations

import time

import pytest

from admin.brokers import info_fields
from broker.client.api import BrokerInfo
from common.errors import Unavailable

GIB = 1024**3


def test_a_brokers_info_becomes_its_columns() -> None:
    started_ms = int((time.time() - 90) * 1000)
    row = info_fields(BrokerInfo("1.2.3", started_ms, 3 * GIB, 12 * GIB, 5_000, 10, 20, 7))
    assert row["version"] == "1.2.3" and 89 <= row["uptime_s"] <= 95
    assert (row["disk_used_pct"], row["store_bytes"], row["unflushed_bytes"]) == (25.0, 5_000, 10)
    assert (row["dispatch_lag_bytes"], row["dispatch_lag_ms"], row["error"]) == (20, 7, "")


def test_a_broker_that_does_not_answer_keeps_its_row_with_the_reason() -> None:
    assert info_fields(Unavailable("broker b down")) == {"error": "broker b down"}
    assert info_fields(BrokerInfo("1", 0, 0, 0, 0, 0, 0, 0))["disk_used_pct"] is None  # no filesystem size


def test_an_unexpected_failure_is_not_hidden_in_a_row() -> None:
    with pytest.raises(RuntimeError):
        info_fields(RuntimeError("bug"))
