"""The producer's fault-avoiding queue selection (proxy/core/health.py, routing.QueueSelector.pick).

A fake clock drives latency and isolation; nothing here touches the network.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from broker.client.api import NO_CONTEXT
from common.errors import IllegalMessageTag, NotPrimary, TooFewInSync, TooManyRequests, Unavailable
from common.model import MessageType, Permission
from proxy.config import SendHealthConfig
from proxy.core.health import BrokerHealth
from proxy.core.producer import ProducerService
from proxy.core.routing import QueueSelector
from proxy.directory import BrokerDirectory, BrokerRoute

ROUTES = [BrokerRoute(b, 4, Permission.READ_WRITE, frozenset({MessageType.NORMAL})) for b in ("a", "b")]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _health(clock: Clock) -> BrokerHealth:
    return BrokerHealth(SendHealthConfig(slow_ms=1_000, isolate_ms=1_000, isolate_max_ms=4_000), clock)


def _brokers_picked(selector: QueueSelector, health: BrokerHealth, sends: int = 16) -> set[str]:
    return {selector.pick("t", ROUTES, None, health.usable)[0] for _ in range(sends)}


def test_sends_spread_over_every_broker_while_all_are_healthy() -> None:
    clock = Clock()
    assert _brokers_picked(QueueSelector(), _health(clock)) == {"a", "b"}


def test_a_send_in_flight_too_long_moves_sends_away_until_it_ends_in_time() -> None:
    clock, selector = Clock(), QueueSelector()
    health = _health(clock)
    token = health.started("a")  # a broker that stopped answering
    clock.now += 0.5
    assert health.usable("a")  # not yet slow
    clock.now += 0.6
    assert not health.usable("a")
    assert _brokers_picked(selector, health) == {"b"}
    queues = [selector.pick("t", ROUTES, None, health.usable) for _ in range(8)]
    assert sorted(set(queues)) == [("b", q) for q in range(4)]  # spread over b's queues, not piled on one
    health.finished("a", token, Unavailable("timed out"))  # its send fails: isolated for isolate_ms
    clock.now += 0.9
    assert not health.usable("a")
    clock.now += 0.2
    assert health.usable("a")  # comes back: the next send probes it
    token = health.started("a")
    health.finished("a", token, None)
    assert _brokers_picked(selector, health) == {"a", "b"}


def test_repeated_failures_isolate_longer_but_a_batch_failing_together_counts_once() -> None:
    clock = Clock()
    health = _health(clock)
    for _ in range(50):  # 50 sends in flight fail at once: one failure
        health.finished("a", health.started("a"), Unavailable("down"))
    clock.now += 1.01
    assert health.usable("a")
    health.finished("a", health.started("a"), Unavailable("still down"))  # the probe fails: 2 s
    clock.now += 1.5
    assert not health.usable("a")
    clock.now += 0.6
    assert health.usable("a")
    health.finished("a", health.started("a"), None)  # recovered: failures forgotten
    health.finished("a", health.started("a"), Unavailable("down again"))
    clock.now += 1.01
    assert health.usable("a")


def test_a_slow_answer_isolates_and_a_refused_request_says_nothing_of_the_broker() -> None:
    clock = Clock()
    health = _health(clock)
    token = health.started("a")
    clock.now += 1.5
    health.finished("a", token, None)  # answered, but slowly
    assert not health.usable("a")
    clock.now += 1.01
    assert health.usable("a")
    health.finished("b", health.started("b"), IllegalMessageTag("bad tag"))
    assert health.usable("b")


def test_when_every_broker_is_avoided_sends_still_go_somewhere_and_groups_keep_their_queue() -> None:
    clock, selector = Clock(), QueueSelector()
    health = _health(clock)
    for broker in ("a", "b"):
        health.finished(broker, health.started(broker), Unavailable("down"))
    assert _brokers_picked(selector, health) == {"a", "b"}
    group_queue = selector.pick("t", ROUTES, "order-7")
    health.finished(group_queue[0], health.started(group_queue[0]), Unavailable("down"))
    assert selector.pick("t", ROUTES, "order-7", health.usable) == group_queue


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="send_health"):
        SendHealthConfig(isolate_ms=5_000, isolate_max_ms=1_000)


def test_a_send_the_client_gave_up_on_counts_as_timed_out_not_as_in_flight_forever() -> None:
    clock = Clock()
    health = _health(clock)
    hung = asyncio.Event()

    class _Hung:
        async def send(self, *args: object, **kwargs: object) -> list[object]:
            await hung.wait()
            return []

    class _Dir:
        def broker(self, name: str) -> _Hung:
            return _Hung()

    async def scenario() -> None:
        service = ProducerService(cast(BrokerDirectory, _Dir()), topics_max=8, health=health)
        send = asyncio.create_task(service._send_to(NO_CONTEXT, "a", "t", 0, []))
        await asyncio.sleep(0)
        send.cancel()  # the client's deadline passed: gRPC cancels the handler
        with pytest.raises(asyncio.CancelledError):
            await send

    asyncio.run(scenario())
    assert not health.usable("a")  # isolated as a timed-out send
    clock.now += 1.01
    assert health.usable("a")  # and not held as a send in flight for ever


# -- probing a broker that stopped answering (issue 43 item 3) ---------------------------------


class Prober:
    """A probe that answers while `up`, else raises as an unreachable broker's call does."""

    def __init__(self) -> None:
        self.up = False
        self.calls = 0

    async def __call__(self, broker: str) -> None:
        self.calls += 1
        if not self.up:
            raise Unavailable(f"broker {broker}: connection timed out")


def _probed(prober: Prober) -> BrokerHealth:
    return BrokerHealth(SendHealthConfig(slow_ms=50, isolate_ms=20, isolate_max_ms=20), probe=prober)


async def _avoided_until_a_probe_answers(health: BrokerHealth, prober: Prober) -> None:
    """Broker "a" stays avoided (sends go to "b") while its probes go unanswered, many isolations
    long, and is used again once one answers; then the health is closed."""
    await asyncio.sleep(0.2)
    assert not health.usable("a") and prober.calls >= 2
    assert _brokers_picked(QueueSelector(), health) == {"b"}
    prober.up = True
    for _ in range(50):
        if health.usable("a"):
            break
        await asyncio.sleep(0.02)
    assert health.usable("a")
    await health.close()


def test_a_failed_broker_is_avoided_until_a_probe_answers_not_probed_with_sends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cut-off broker: after its isolation a client's send went to it again and waited for the
    client's deadline; now a background probe must answer first."""
    prober = Prober()

    async def scenario() -> None:
        health = _probed(prober)
        health.finished("a", health.started("a"), Unavailable("connection lost"))
        health.finished("a", health.started("a"), Unavailable("connection lost"))  # a second failure: one watch
        await _avoided_until_a_probe_answers(health, prober)

    with caplog.at_level("INFO", logger="sluice.proxy.health"):
        asyncio.run(scenario())
    stopped = [r for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].__dict__["kv"]["broker"] == "a"
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_a_broker_whose_connection_went_silent_is_avoided_without_a_send_of_this_proxy() -> None:
    """Issue 43: another proxy's send waited on a cut broker; this proxy's own connection to it
    answered no keepalive PING (`silent`), so sends avoid it before one of them waits too, until a
    probe answers."""
    prober = Prober()

    async def scenario() -> None:
        health = _probed(prober)
        health.silent("a", "the server answered no keepalive PING within 1 s")
        await _avoided_until_a_probe_answers(health, prober)

    asyncio.run(scenario())


def test_closing_stops_the_probes() -> None:
    """And none starts after: a connection cut while the proxy stops (its keepalive fires before
    the channels close) must not leave a probe task behind."""

    async def scenario() -> None:
        health = _probed(Prober())
        health.finished("a", health.started("a"), Unavailable("connection lost"))
        assert not health.usable("a")
        await health.close()
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("probe-")]
        health.silent("b", "the server answered no keepalive PING within 1 s")
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("probe-")]

    asyncio.run(scenario())


@pytest.mark.parametrize("answer", [TooManyRequests("overloaded"), NotPrimary("a replica"), TooFewInSync("1 of 2")])
def test_a_broker_that_answers_no_is_not_watched(answer: Exception) -> None:
    """A refusal is an answer: isolated as before, no probe, no 'stopped answering'."""
    prober = Prober()

    async def scenario() -> None:
        health = _probed(prober)
        health.finished("a", health.started("a"), answer)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert health.usable("a") and prober.calls == 0
        await health.close()

    asyncio.run(scenario())
