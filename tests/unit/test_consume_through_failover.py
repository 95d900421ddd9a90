"""Receives, acks and invisible-duration changes that meet a broker group failing over: the proxy
waits for the group's new primary within the call's deadline and calls there (proxy/core/failover.py),
as it does for sends, instead of handing the client "not its primary" or "failed to connect".

The directory and brokers are small stand-ins: what is tested is the proxy's core deciding to wait,
where to call and what it answers; the real group is exercised end to end in
tests/e2e/test_failover_schedules.py.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.client import receipt
from broker.client.api import AckResult, BrokerApi, CallContext, PopRequest, StoredMessage
from common.errors import InvalidReceiptHandle, NotPrimary, SluiceError, Unreachable
from common.model import MessageType, Permission
from proxy.config import ReceiveConfig
from proxy.context import RequestContext
from proxy.core.consumer import ConsumerService, ReceiveSpec
from proxy.core.renewer import AutoRenewer
from proxy.directory import BrokerDirectory, BrokerRoute

GROUP = "g1"
DELIVERED = SimpleNamespace(body=b"a message")  # what the stand-in pop returns


class Member:
    """One member of the group as the proxy reaches it: refusing with `refusal`, or answering."""

    def __init__(self, refusal: SluiceError | None) -> None:
        self.refusal = refusal
        self.calls: list[str] = []
        self.pops: list[PopRequest] = []

    def _called(self, what: str) -> None:
        self.calls.append(what)
        if self.refusal is not None:
            raise self.refusal

    async def pop(self, request: PopRequest, *, ctx: CallContext) -> list[StoredMessage]:
        self._called("pop")
        self.pops.append(request)
        return [cast(StoredMessage, DELIVERED)]

    async def ack(self, group: str, topic: str, handles: list[str], *, ctx: CallContext) -> list[AckResult]:
        self._called("ack")
        return [AckResult(h) for h in handles]

    async def change_invisible_duration(self, group: str, topic: str, handle: str, invisible_ms: int, *,
                                        ctx: CallContext) -> str:  # fmt: skip
        self._called("change_invisible_duration")
        return "new-handle"


class FailingOverDirectory:
    """A NameServer view of one group whose address changes to `successor` on its `after`-th look."""

    def __init__(self, old: Member, successor: Member | None, after: int = 1) -> None:
        self.current = old
        self._successor = successor
        self._after = after
        self.looks = 0

    async def route(self, topic: str) -> list[BrokerRoute]:
        return [BrokerRoute(GROUP, 4, Permission.READ_WRITE, frozenset({MessageType.NORMAL}))]

    def broker(self, name: str) -> BrokerApi:
        assert name == GROUP
        return cast(BrokerApi, self.current)

    async def lookup(self, name: str) -> BrokerApi | None:
        return cast(BrokerApi, self.current) if name == GROUP else None

    async def moved(self, name: str) -> BrokerApi | None:
        self.looks += 1
        if self._successor is not None and self.looks >= self._after:
            self.current, self._successor = self._successor, None
            return cast(BrokerApi, self.current)
        return None

    def broker_names(self) -> list[str]:
        return [GROUP]

    async def close(self) -> None:
        return None


def _service(directory: FailingOverDirectory) -> ConsumerService:
    config = ReceiveConfig()
    return ConsumerService(cast(BrokerDirectory, directory), AutoRenewer(cast(BrokerDirectory, directory), config),
                           config)  # fmt: skip


def _ctx(deadline_s: float) -> RequestContext:
    return RequestContext(deadline=time.monotonic() + deadline_s)


def _handle() -> str:
    return receipt.encode(GROUP, 1, 7, 3, 0, receipt.name_crc("t"), receipt.name_crc("cg"))


def _spec(long_poll_ms: int) -> ReceiveSpec:
    return ReceiveSpec("cg", "t", GROUP, cast(Any, None), 16, 30_000, long_poll_ms)


@pytest.mark.parametrize("refusal", [NotPrimary("broker b1 is a fenced primary of group g1, not its primary"),
                                     Unreachable("broker g1: failed to connect")])  # fmt: skip
def test_a_receive_waits_for_the_new_primary(refusal: SluiceError) -> None:
    old, new = Member(refusal), Member(None)
    directory = FailingOverDirectory(old, new)
    got = asyncio.run(_service(directory).receive(_ctx(10), _spec(long_poll_ms=5_000)))
    assert got == [DELIVERED] and old.calls == ["pop"] and new.calls == ["pop"]
    # The retried pop long-polls only for what is left of the call's deadline, less the margin.
    assert 0 < new.pops[0].long_poll_ms < 10_000 - 500


def test_an_ack_waits_for_the_new_primary() -> None:
    old, new = Member(Unreachable("broker g1: failed to connect")), Member(None)
    handle = _handle()
    results = asyncio.run(_service(FailingOverDirectory(old, new)).ack(_ctx(10), "cg", "t", [handle]))
    assert [r.ok for r in results] == [True] and new.calls == ["ack"]


def test_an_invisible_duration_change_waits_for_the_new_primary() -> None:
    old, new = Member(NotPrimary("broker b1 is a replica of group g1, not its primary")), Member(None)
    service = _service(FailingOverDirectory(old, new))
    assert asyncio.run(service.change_invisible_duration(_ctx(10), "cg", "t", _handle(), 5_000)) == "new-handle"
    assert new.calls == ["change_invisible_duration"]


def test_an_old_terms_handle_the_new_primary_does_not_know_is_an_invalid_handle() -> None:
    """The successor holds no live delivery under that handle's version: its refusal reaches the
    client as INVALID_RECEIPT_HANDLE (the message comes back after its invisible time), not as an
    internal or availability error."""
    old = Member(NotPrimary("broker b1 is a fenced primary of group g1, not its primary"))
    new = Member(InvalidReceiptHandle("receipt handle expired: the message was redelivered"))
    results = asyncio.run(_service(FailingOverDirectory(old, new)).ack(_ctx(10), "cg", "t", [_handle()]))
    assert isinstance(results[0].error, InvalidReceiptHandle)


def test_a_group_without_a_new_primary_is_refused_within_the_deadline() -> None:
    old = Member(NotPrimary("broker b1 is a fenced primary of group g1, not its primary"))
    directory = FailingOverDirectory(old, None)
    start = time.monotonic()
    results = asyncio.run(_service(directory).ack(_ctx(1.5), "cg", "t", [_handle()]))
    assert isinstance(results[0].error, NotPrimary)
    assert time.monotonic() - start < 1.5  # answered before the client's deadline
    assert directory.looks >= 2 and len(old.calls) >= 2  # it did look, and asked again
