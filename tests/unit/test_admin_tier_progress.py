"""`tier upload-now` reports progress while the brokers upload (admin/tier.upload_now)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from admin import tier
from broker.client.api import TierStatus, TierTopicStatus
from common.model import Permission
from nameserver.model import BrokerQueues, TopicRoute


class _Broker:
    name = "broker-a"

    def __init__(self) -> None:
        self.left = 30

    async def tier_upload_now(self, topic: str, timeout_s: float) -> TierTopicStatus:
        while self.left > 0:
            await asyncio.sleep(0.02)
            self.left -= 10
        return TierTopicStatus(topic, (), 0, 0.0, 1, 1, "", 0, 1)

    async def tier_status(self) -> TierStatus:
        return TierStatus(True, "s3", (TierTopicStatus("t", (), self.left, 1.0, 0, 0, "", 0, 0),))


class _Cluster:
    def __init__(self) -> None:
        self.broker = _Broker()

    async def route(self, topic: str) -> TopicRoute:
        return TopicRoute(topic, (BrokerQueues("broker-a", "127.0.0.1:1", "c", 1, Permission.READ_WRITE, frozenset()),))

    async def on_each(self, targets: Any, call: Callable[[Any], Awaitable[Any]]) -> list[Any]:
        return [await call(self.broker)]


def test_upload_now_prints_progress_until_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier, "PROGRESS_INTERVAL_S", 0.015)
    lines: list[str] = []
    report = asyncio.run(tier.upload_now(_Cluster(), "t", 10.0, progress=lines.append))  # type: ignore[arg-type]
    assert lines and all(line.startswith("tiering t: ") and "still to upload" in line for line in lines)
    assert report.rows[0]["broker"] == "broker-a"
