"""`pop_anywhere`: a receive served by the first broker that has messages (proxy/core/gather.py);
`pop_in_group`: a broker lacking the consumer group gets the cluster's definition, never defaults.

The brokers here are small in-memory stand-ins with the BrokerApi calls the gather makes (pop with
a long poll, change_invisible_duration): what is tested is the order brokers are asked in, that a
long poll over several brokers ends on the first that gets a message, that a failing broker is
skipped, and that messages popped by a losing long poll are not stranded.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from broker.client import receipt
from broker.client.api import NO_CONTEXT, BrokerApi, GroupInfo, GroupSpec, PopRequest, StoredMessage
from common.errors import ConsumerGroupNotFound, IllegalInvisibleTime, SluiceError, Unavailable
from common.model import MessageType
from proxy.core.gather import EMPTY_FOR_S, RELEASE_INVISIBLE_MS, EmptyBrokers, pop_anywhere, pop_in_group
from proxy.directory import BrokerDirectory
from tests.helpers.records import delivered


def _message(broker: str, offset: int) -> StoredMessage:
    handle = receipt.encode(broker, 0, offset, 1, 0, 0, 0)
    return delivered("t", 0, offset, b"x", f"{broker}-{offset}", MessageType.NORMAL, None, (), None, {}, {},
                         0, "", 0, "", 0, 1, receipt_handle=handle)  # fmt: skip


class _Broker:
    def __init__(self, name: str, *, failing: bool = False, refusing: SluiceError | None = None) -> None:
        self.name = name
        self.ready: list[StoredMessage] = []
        self.arrived = asyncio.Event()
        self.pops: list[int] = []  # long_poll_ms of each pop
        self.released: list[tuple[str, int]] = []
        self.failing = failing
        self.refusing = refusing

    def put(self, count: int) -> None:
        self.ready += [_message(self.name, len(self.ready) + i) for i in range(count)]
        self.arrived.set()

    async def pop(self, request: PopRequest, *, ctx: object = NO_CONTEXT) -> list[StoredMessage]:
        self.pops.append(request.long_poll_ms)
        if self.refusing is not None:
            raise self.refusing
        if self.failing:
            raise Unavailable(f"broker {self.name} is unreachable")
        if not self.ready and request.long_poll_ms > 0:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), request.long_poll_ms / 1000)
            except TimeoutError:
                return []
        taken, self.ready = self.ready[: request.max_messages], self.ready[request.max_messages :]
        return taken

    async def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int, *, ctx: object = NO_CONTEXT
    ) -> str:
        self.released.append((handle, invisible_ms))
        return handle


class _Directory:
    def __init__(self, *brokers: _Broker) -> None:
        self.brokers = {b.name: b for b in brokers}

    def broker(self, name: str) -> BrokerApi:
        return cast(BrokerApi, self.brokers[name])


def _gather(directory: _Directory, order: list[str], long_poll_ms: int, max_messages: int = 16) -> list[StoredMessage]:
    request = PopRequest("g", "t", None, max_messages, 15_000, long_poll_ms=long_poll_ms)
    return asyncio.run(pop_anywhere(cast(BrokerDirectory, directory), order, request, ctx=NO_CONTEXT))


def test_the_named_broker_serves_when_it_has_messages_and_no_other_is_asked() -> None:
    a, b = _Broker("a"), _Broker("b")
    a.put(2)
    b.put(2)
    got = _gather(_Directory(a, b), ["a", "b"], 3_000)
    assert [m.message_id for m in got] == ["a-0", "a-1"]
    assert (a.pops, b.pops) == ([0], [])


def test_an_empty_named_broker_is_served_from_the_one_that_has_messages_without_waiting() -> None:
    a, b = _Broker("a"), _Broker("b")
    b.put(3)
    got = _gather(_Directory(a, b), ["a", "b"], 30_000)
    assert [receipt.broker_of(m.receipt_handle) for m in got] == ["b", "b", "b"]  # acks go to b
    assert (a.pops, b.pops) == ([0], [0])  # neither long-polled: b had them at once


def test_a_long_poll_over_every_broker_ends_on_the_first_that_gets_a_message() -> None:
    a, b = _Broker("a"), _Broker("b")

    async def scenario() -> list[StoredMessage]:
        request = PopRequest("g", "t", None, 16, 15_000, long_poll_ms=30_000)
        gather = asyncio.create_task(pop_anywhere(cast(BrokerDirectory, _Directory(a, b)), ["a", "b"], request,
                                                  ctx=NO_CONTEXT))  # fmt: skip
        await asyncio.sleep(0.05)
        b.put(1)
        return await asyncio.wait_for(gather, 5)

    got = asyncio.run(scenario())
    assert [m.message_id for m in got] == ["b-0"]
    assert (a.pops, b.pops) == ([0, 30_000], [0, 30_000])


def test_a_failing_broker_is_skipped_and_only_all_failing_fails_the_receive() -> None:
    a, b = _Broker("a", failing=True), _Broker("b")
    b.put(1)
    assert [m.message_id for m in _gather(_Directory(a, b), ["a", "b"], 1_000)] == ["b-0"]
    assert _gather(_Directory(_Broker("a", failing=True), _Broker("b")), ["a", "b"], 50) == []
    with pytest.raises(Unavailable):
        _gather(_Directory(_Broker("a", failing=True), _Broker("b", failing=True)), ["a", "b"], 50)


def test_a_refusal_of_the_request_itself_is_raised_at_once() -> None:
    a, b = _Broker("a", refusing=IllegalInvisibleTime("too short")), _Broker("b")
    b.put(1)
    with pytest.raises(IllegalInvisibleTime):
        _gather(_Directory(a, b), ["a", "b"], 1_000)
    assert b.pops == []


def test_messages_a_losing_long_poll_popped_are_handed_out_or_released() -> None:
    a, b = _Broker("a"), _Broker("b")

    async def scenario() -> list[StoredMessage]:
        request = PopRequest("g", "t", None, 3, 15_000, long_poll_ms=30_000)
        gather = asyncio.create_task(pop_anywhere(cast(BrokerDirectory, _Directory(a, b)), ["a", "b"], request,
                                                  ctx=NO_CONTEXT))  # fmt: skip
        await asyncio.sleep(0.05)
        a.put(2)  # both long polls answer in the same loop turn: the answers cross
        b.put(2)
        return await asyncio.wait_for(gather, 5)

    got = asyncio.run(scenario())
    assert len(got) == 3  # the batch size, no more
    released = a.released + b.released
    assert len(released) == 1 and released[0][1] == RELEASE_INVISIBLE_MS
    assert {m.receipt_handle for m in got}.isdisjoint(h for h, _ in released)


def test_a_broker_the_send_health_avoids_is_not_asked_first_but_still_long_polled() -> None:
    a, b = _Broker("a"), _Broker("b")
    b.put(1)
    request = PopRequest("g", "t", None, 16, 15_000, long_poll_ms=1_000)
    directory = cast(BrokerDirectory, _Directory(a, b))
    got = asyncio.run(pop_anywhere(directory, ["a", "b"], request, ctx=NO_CONTEXT, usable=lambda n: n != "a"))
    assert [m.message_id for m in got] == ["b-0"] and a.pops == []  # a (hung) did not hold the receive
    got = asyncio.run(pop_anywhere(directory, ["a", "b"], request, ctx=NO_CONTEXT, usable=lambda n: n != "a"))
    assert got == [] and a.pops == [1_000]  # nothing anywhere: a takes part in the long poll
    a.put(1)
    quick = PopRequest("g", "t", None, 16, 15_000, long_poll_ms=0)
    got = asyncio.run(pop_anywhere(directory, ["a", "b"], quick, ctx=NO_CONTEXT, usable=lambda n: False))
    assert [m.message_id for m in got] == ["a-0"]  # every broker avoided: all asked the same


def test_a_broker_empty_lately_is_asked_after_the_others_until_that_lapses() -> None:
    a, b = _Broker("a"), _Broker("b")
    b.put(4)
    now = [100.0]
    empty = EmptyBrokers(clock=lambda: now[0])
    directory = cast(BrokerDirectory, _Directory(a, b))
    request = PopRequest("g", "t", None, 1, 15_000, long_poll_ms=1_000)

    def receive(order: list[str]) -> list[str]:
        got = asyncio.run(pop_anywhere(directory, order, request, ctx=NO_CONTEXT, empty=empty))
        return [m.message_id for m in got]

    assert receive(["a", "b"]) == ["b-0"] and a.pops == [0]  # a named and empty: asked, remembered
    assert receive(["a", "b"]) == ["b-1"] and a.pops == [0]  # b first now, a not asked at all
    other = PopRequest("g2", "t", None, 1, 15_000, long_poll_ms=0)
    asyncio.run(pop_anywhere(directory, ["a", "b"], other, ctx=NO_CONTEXT, empty=empty))
    assert a.pops == [0, 0]  # the memory is per group (that receive took b-2)
    a.put(1)
    now[0] += EMPTY_FOR_S + 0.1  # lapsed: a named is asked first again, and has one
    assert receive(["a", "b"]) == ["a-0"]
    assert receive(["a", "b"]) == ["b-3"] and a.pops == [0, 0, 0, 0]  # a had it: still asked first
    assert receive(["a", "b"]) == [] and a.pops[-1] == 1_000 and b.pops[-1] == 1_000  # all empty: all polled


class _GroupBroker:
    """A broker that pops only for the consumer groups it holds, and creates one only as told."""

    def __init__(self, name: str, groups: dict[str, GroupInfo] | None = None, *, creates: bool = True) -> None:
        self.name = name
        self.groups = dict(groups or {})
        self.creates = creates

    async def pop(self, request: PopRequest, *, ctx: object = NO_CONTEXT) -> list[StoredMessage]:
        if request.group not in self.groups:
            raise ConsumerGroupNotFound(f"group {request.group} does not exist on {self.name}")
        return [_message(self.name, 0)]

    async def get_group(self, name: str, *, auto_create: bool = False, like: GroupSpec | None = None) -> GroupInfo:
        if name not in self.groups:
            if not (auto_create and self.creates):
                raise ConsumerGroupNotFound(name)
            self.groups[name] = GroupInfo(like or GroupSpec(name), 1)
        return self.groups[name]


class _Cluster(_Directory):
    def broker_names(self) -> list[str]:
        return sorted(self.brokers)


def _pop_in_group(cluster: _Cluster, name: str, group: str) -> list[StoredMessage]:
    request = PopRequest(group, "t", None, 16, 15_000)
    return asyncio.run(pop_in_group(cast(BrokerDirectory, cluster), cluster.broker(name), request, NO_CONTEXT))


def test_a_broker_lacking_the_group_gets_the_clusters_definition_before_the_pop() -> None:
    """A pop that reaches a broker before the client's settings or heartbeat did: the group is
    created there as the broker holding it defines it (FIFO stays FIFO), then the pop is served.
    Before, the broker's pop created it with its defaults."""
    fifo = GroupSpec("g", fifo=True, max_delivery_attempts=3)
    holder, joined = _GroupBroker("a", {"g": GroupInfo(fifo, 1)}), _GroupBroker("b")
    cluster = _Cluster(holder, joined)  # type: ignore[arg-type]
    assert [m.message_id for m in _pop_in_group(cluster, "b", "g")] == ["b-0"]
    assert joined.groups["g"].spec == fifo


def test_a_group_no_broker_holds_or_creates_is_not_found() -> None:
    cluster = _Cluster(_GroupBroker("a", creates=False), _GroupBroker("b", creates=False))  # type: ignore[arg-type]
    with pytest.raises(ConsumerGroupNotFound):
        _pop_in_group(cluster, "b", "g")
