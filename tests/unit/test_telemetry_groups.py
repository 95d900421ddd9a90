"""A client's settings create its consumer group on every broker (proxy/grpc/telemetry.py): a group
starting from "latest" created on one broker only would skip, on the others, what was sent there
before the client's first receive or heartbeat reached them. A broker that lacks a group others
hold (one that joined later) gets their definition, never its defaults (proxy/firstuse.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.client.api import GroupInfo, GroupSpec
from common.errors import ConsumerGroupNotFound, Unavailable
from proxy.grpc import telemetry


class Broker:
    def __init__(self, *, fails: bool = False, stalls: bool = False) -> None:
        self.groups: dict[str, GroupInfo] = {}
        self.fails, self.stalls = fails, stalls

    async def get_group(self, name: str, *, auto_create: bool = False, like: GroupSpec | None = None) -> GroupInfo:
        if self.stalls:
            await asyncio.sleep(3600)
        if self.fails:
            raise Unavailable("down")
        if name not in self.groups:
            if not auto_create:
                raise ConsumerGroupNotFound(name)
            self.groups[name] = GroupInfo(like or GroupSpec(name), 1)
        return self.groups[name]


def app_of(brokers: dict[str, Broker]) -> Any:
    return SimpleNamespace(directory=SimpleNamespace(broker_names=lambda: sorted(brokers), broker=brokers.__getitem__))


def test_the_group_is_created_on_every_broker_that_answers() -> None:
    brokers = {"shard-0": Broker(fails=True), "shard-1": Broker(), "shard-2": Broker()}
    info = asyncio.run(telemetry._group_info(app_of(brokers), "g"))
    assert info is not None and info.spec.name == "g"
    assert [name for name, b in sorted(brokers.items()) if "g" in b.groups] == ["shard-1", "shard-2"]


def test_a_stalled_broker_does_not_hold_the_settings_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "GROUP_CREATE_WAIT_S", 0.05)
    brokers = {"shard-0": Broker(), "shard-1": Broker(stalls=True)}
    info = asyncio.run(telemetry._group_info(app_of(brokers), "g"))
    assert info is not None and "g" in brokers["shard-0"].groups


def test_no_broker_answers() -> None:
    assert asyncio.run(telemetry._group_info(app_of({"b": Broker(fails=True)}), "g")) is None


def test_a_broker_that_joined_later_gets_the_cluster_s_definition() -> None:
    fifo = GroupSpec("g", fifo=True, max_delivery_attempts=3)
    brokers = {"shard-0": Broker(), "shard-1": Broker(), "shard-2": Broker()}
    brokers["shard-1"].groups["g"] = GroupInfo(fifo, 1)  # created with `sluice admin` before shard-2 joined
    info = asyncio.run(telemetry._group_info(app_of(brokers), "g"))
    assert info is not None and info.spec == fifo
    assert {name: b.groups["g"].spec for name, b in brokers.items()} == dict.fromkeys(brokers, fifo)
