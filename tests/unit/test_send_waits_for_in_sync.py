"""A send a broker group's primary refuses because too few members are in sync (`TooFewInSync`:
its replicas cut off, or a new primary's not caught up yet) waits in the proxy within the client's
deadline and goes through once the group takes writes again (proxy/core/failover.py), when the
group is the topic's only broker; acks do not (the primary applied the ack before refusing it).

Before, the proxy handed the refusal to the client at once; the official clients retry a send at
once, so all their attempts met the same refusal and the send failed (the soak's failed sends after
a partition of both replicas and after a failover to a primary with no replica in sync yet).

Also: a send cancelled because the proxy learned the group's new address while it ran goes there.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest

from broker.client.api import CallContext, MessagingApi
from common.errors import TooFewInSync, Unavailable
from proxy.core.failover import call_through_failover
from proxy.directory import BrokerDirectory
from tests.unit.test_consume_through_failover import GROUP, FailingOverDirectory, Member


class CatchingUp(Member):
    """The group's primary: refuses writes for too few in sync `refusals` times, then takes them."""

    def __init__(self, refusals: int) -> None:
        super().__init__(None)
        self.left = refusals

    async def send(self) -> str:
        self.calls.append("send")
        if self.left:
            self.left -= 1
            raise TooFewInSync("group g1 has 1 member(s) in sync, fewer than min_insync 2")
        return "stored"


async def _yes() -> bool:
    return True


def _send(directory: FailingOverDirectory, deadline_s: float, *, only_broker: bool) -> str:
    async def send(api: MessagingApi) -> str:
        return await cast(CatchingUp, api).send()

    ctx = CallContext(deadline=time.monotonic() + deadline_s)
    kwargs = {"wait_in_sync": _yes} if only_broker else {}
    return asyncio.run(call_through_failover(cast(BrokerDirectory, directory), GROUP, send, ctx, **kwargs))


def test_a_send_waits_until_the_group_is_back_in_sync() -> None:
    primary = CatchingUp(refusals=3)
    assert _send(FailingOverDirectory(primary, None), 10, only_broker=True) == "stored"
    assert primary.calls == ["send"] * 4


def test_a_send_is_refused_within_its_deadline_if_the_group_stays_short() -> None:
    primary = CatchingUp(refusals=1_000)
    start = time.monotonic()
    with pytest.raises(TooFewInSync):
        _send(FailingOverDirectory(primary, None), 1.5, only_broker=True)
    assert time.monotonic() - start < 1.5 and len(primary.calls) >= 2


def test_with_other_brokers_to_try_the_refusal_goes_back_at_once() -> None:
    primary = CatchingUp(refusals=1)
    with pytest.raises(TooFewInSync):
        _send(FailingOverDirectory(primary, None), 10, only_broker=False)
    assert primary.calls == ["send"]


def test_a_call_cancelled_because_the_group_moved_meanwhile_goes_to_the_new_address() -> None:
    """The route refresh learned the group's new primary while a send hung on the old one (paused)
    and closed the old client, cancelling the send: it goes to the new primary within the same
    attempt. Before, the proxy asked the NameServer whether the group had moved, saw the address it
    already had, and failed the attempt."""
    new = CatchingUp(refusals=0)
    directory = FailingOverDirectory(Member(None), None)

    class Paused(CatchingUp):
        async def send(self) -> str:
            self.calls.append("send")
            directory.current = new  # the refresh loop's `_learn`, while the call hung
            raise Unavailable("broker g1 at 127.0.0.1:1: the send was cancelled")

    old = Paused(refusals=0)
    directory.current = old
    assert _send(directory, 10, only_broker=True) == "stored"
    assert old.calls == ["send"] and new.calls == ["send"] and directory.looks == 0
