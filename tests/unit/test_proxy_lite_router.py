"""LiteRouter: a client's lite subscriptions follow the bind topic's route when it grows after the
client subscribed (a topic just created, its second broker registering it a moment later), so the
subscriptions sit where producers now send each lite topic's messages (routing.lite_broker).

The brokers here are recorders of the syncs they get: what is under test is the router's placement,
not a broker's subscription store (tests/contract/test_lite_contract.py)."""

from __future__ import annotations

import asyncio

import pytest

from broker.client.api import LiteAction, LiteSync
from common.errors import LiteSubscriptionQuotaExceeded, Unavailable
from common.model import MessageType, Permission
from proxy.core.lite import LiteRouter
from proxy.core.routing import lite_broker
from proxy.directory import BrokerRoute

TOPIC = "bind"


class Recorder:
    """A broker's lite subscriptions as plain sets, and every sync it was sent; like a broker, it
    refuses a sync that would grow a client's set here beyond the sync's quota."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], set[str]] = {}
        self.syncs: list[LiteSync] = []
        self.down = False

    async def sync_lite_subscription(self, sync: LiteSync) -> int:
        if self.down:
            raise Unavailable("broker down")
        self.syncs.append(sync)
        names = self.held.setdefault((sync.group, sync.client_id), set())
        if sync.action is LiteAction.PARTIAL_ADD:
            new = names | set(sync.lite_topics)
        elif sync.action is LiteAction.PARTIAL_REMOVE:
            new = names - set(sync.lite_topics)
        elif sync.action is LiteAction.COMPLETE_ADD:
            new = set(sync.lite_topics)
        else:
            new = set()
        if sync.quota and len(new) > sync.quota and len(new) > len(names):
            raise LiteSubscriptionQuotaExceeded(f"{len(new)} lite topics here; the sync's quota is {sync.quota}")
        names.clear()
        names |= new
        return len(names)


class Directory:
    def __init__(self, *brokers: str) -> None:
        self.brokers = {b: Recorder() for b in ("a", "b", "c")}
        self.routes = [self.route_of(b) for b in brokers]

    @staticmethod
    def route_of(broker: str) -> BrokerRoute:
        return BrokerRoute(broker, 1, Permission.READ_WRITE, frozenset({MessageType.LITE}))

    async def route(self, topic: str) -> list[BrokerRoute]:
        return list(self.routes)

    def broker(self, name: str) -> Recorder:
        return self.brokers[name]

    def where(self, client: str) -> dict[str, set[str]]:
        return {b: set(r.held.get(("g", client), set())) for b, r in self.brokers.items() if r.held.get(("g", client))}


NAMES = tuple(f"lite-{i}" for i in range(12))


def owners(directory: Directory, names: tuple[str, ...]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name in names:
        out.setdefault(lite_broker(TOPIC, directory.routes, name), set()).add(name)
    return out


def router(directory: Directory, quota: int = 100, clients_max: int = 16) -> LiteRouter:
    return LiteRouter(directory, quota=quota, poll_ms=1000, clients_max=clients_max)  # type: ignore[arg-type]


def names_on(directory: Directory, broker: str, n: int, prefix: str) -> tuple[str, ...]:
    """`n` lite topic names the current route places on `broker`."""
    pool = (f"{prefix}-{i}" for i in range(10_000))
    return tuple(name for name in pool if lite_broker(TOPIC, directory.routes, name) == broker)[:n]


def part_quota(directory: Directory, broker: str) -> int:
    """The quota the last PARTIAL_ADD sent to `broker` carried."""
    return directory.brokers[broker].syncs[-1].quota


def test_subscriptions_move_to_the_broker_a_grown_route_names() -> None:
    async def run() -> None:
        d = Directory("a")
        r = router(d)
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_ADD, NAMES))
        assert d.where("c1") == {"a": set(NAMES)}
        assert await r.replace_moved() == 0  # the route is the same: nothing sent
        sent = len(d.brokers["a"].syncs)

        d.routes.append(d.route_of("b"))  # the topic's second broker registered it
        moved = await r.replace_moved()
        want = owners(d, NAMES)
        assert set(want) == {"a", "b"}, "the names must spread over both brokers for this test"
        assert moved == len(want["b"])
        assert d.where("c1") == want
        assert [s.action for s in d.brokers["b"].syncs] == [LiteAction.PARTIAL_ADD]
        assert [s.action for s in d.brokers["a"].syncs[sent:]] == [LiteAction.PARTIAL_REMOVE]
        assert await r.replace_moved() == 0  # placed over the new route now

    asyncio.run(run())


def test_a_partial_add_after_the_route_grew_moves_what_the_client_held_first() -> None:
    async def run() -> None:
        d = Directory("a")
        r = router(d)
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, NAMES[:6]))
        d.routes.append(d.route_of("b"))
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, NAMES[6:]))
        assert d.where("c1") == owners(d, NAMES)
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_REMOVE, NAMES[:3]))
        assert d.where("c1") == owners(d, NAMES[3:])
        assert await r.replace_moved() == 0

    asyncio.run(run())


def test_a_failed_move_is_tried_again_and_a_removed_client_is_forgotten() -> None:
    async def run() -> None:
        d = Directory("a")
        r = router(d)
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_ADD, NAMES))
        d.routes.append(d.route_of("b"))
        d.brokers["b"].down = True
        assert await r.replace_moved() == 0
        assert d.where("c1") == {"a": set(NAMES)}  # nothing lost while the new broker is down
        d.brokers["b"].down = False
        assert await r.replace_moved() == len(owners(d, NAMES)["b"])
        assert d.where("c1") == owners(d, NAMES)

        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_REMOVE, ()))
        d.routes.append(d.route_of("c"))
        assert await r.replace_moved() == 0  # it holds nothing: nothing to move
        assert d.where("c1") == {}

    asyncio.run(run())


def test_a_forgotten_client_loses_its_placement_and_counts_together() -> None:
    async def run() -> None:
        d = Directory("a", "b")
        r = router(d, clients_max=2)
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_ADD, NAMES))
        await r.sync(LiteSync("g", TOPIC, "c2", LiteAction.COMPLETE_ADD, NAMES))
        # c1 again: broker a answers (nothing new there), then b fails; a's answer makes c1 the most
        # recent client, for its counts and its placement alike
        d.brokers["b"].down = True
        again = names_on(d, "a", 1, "lite") + names_on(d, "b", 1, "new")
        with pytest.raises(Unavailable):
            await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, again))
        d.brokers["b"].down = False
        await r.sync(LiteSync("g", TOPIC, "c3", LiteAction.COMPLETE_ADD, NAMES))  # c2 is forgotten

        before = owners(d, NAMES)
        d.routes.append(d.route_of("c"))
        after = owners(d, NAMES)
        moved = sum(len(after[b] - before.get(b, set())) for b in after)
        assert moved > 0, "the names must move for this test"
        assert await r.replace_moved() == 2 * moved  # c1 and c3; this proxy no longer knows c2's
        assert d.where("c1") == d.where("c3") == after
        assert d.where("c2") == before

        # c1's counts, kept with its placement and updated by the moves, hold its part to the quota
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, names_on(d, "c", 1, "more")))
        assert part_quota(d, "c") == 100 - len(after["a"]) - len(after["b"])
        await r.sync(LiteSync("g", TOPIC, "c2", LiteAction.PARTIAL_ADD, names_on(d, "c", 1, "more")))
        assert part_quota(d, "c") == 100  # nothing known of c2 on the other brokers

    asyncio.run(run())


def test_a_partial_add_is_held_to_the_quota_less_what_the_client_holds_on_other_brokers() -> None:
    async def run() -> None:
        d = Directory("a", "b", "c")
        r = router(d, quota=8)
        on_a, on_b = names_on(d, "a", 4, "x"), names_on(d, "b", 3, "x")
        with pytest.raises(LiteSubscriptionQuotaExceeded):  # a COMPLETE_ADD is checked whole
            await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_ADD, on_a + on_b + names_on(d, "c", 2, "y")))
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_ADD, on_a + on_b))

        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, names_on(d, "b", 1, "y")))
        assert part_quota(d, "b") == 8 - 4  # what it holds on a counts against b's part
        sent = len(d.brokers["c"].syncs)
        with pytest.raises(LiteSubscriptionQuotaExceeded):  # 4 on a and 4 on b: no room on c
            await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, names_on(d, "c", 1, "y")))
        assert len(d.brokers["c"].syncs) == sent  # refused here, nothing sent

        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_REMOVE, on_a[:2]))
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.PARTIAL_ADD, names_on(d, "c", 1, "y")))
        assert part_quota(d, "c") == 8 - 2 - 4
        assert d.where("c1") == {"a": set(on_a[2:]), "b": set(on_b + names_on(d, "b", 1, "y")),
                                 "c": set(names_on(d, "c", 1, "y"))}  # fmt: skip

    asyncio.run(run())


def test_a_client_at_its_quota_is_moved_when_the_route_grows() -> None:
    """The lite topics a move adds on the new broker are those it then drops from the old one:
    they do not count twice against the quota."""

    async def run() -> None:
        d = Directory("a")
        r = router(d, quota=len(NAMES))
        await r.sync(LiteSync("g", TOPIC, "c1", LiteAction.COMPLETE_ADD, NAMES))
        d.routes.append(d.route_of("b"))
        assert await r.replace_moved() == len(owners(d, NAMES)["b"])
        assert d.where("c1") == owners(d, NAMES)
        assert d.brokers["b"].syncs[-1].quota == len(owners(d, NAMES)["b"])

    asyncio.run(run())
