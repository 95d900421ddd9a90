"""The MQTT janitor (proxy/mqtt/janitor.py) and the session index it reads (proxy/mqtt/state.py):
a round looks at what expired and at the sessions of proxies that died, through the `x`, `w` and
`h` entries every record write keeps, never at every session; each change is a compare-and-set.
The state store is an in-memory one with the home broker's semantics (sorted keys, atomic writes
with expectations)."""

from __future__ import annotations

import asyncio
import bisect
import functools
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from common.errors import PreconditionFailed
from proxy.mqtt import convert, state
from proxy.mqtt.janitor import DEAD_ROUNDS, SWEEP_PAGE, Janitor

INTERVAL_S = 10.0


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test run on its own event loop."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return wrapper


class MemoryState:
    """StateStore's calls over a sorted dict: atomic writes, expectations, prefix scans."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.writes = 0

    async def get_one(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    async def write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes] = (),
                    expect: Sequence[tuple[bytes, bytes | None]] = ()) -> None:  # fmt: skip
        if any(self.data.get(k) != v for k, v in expect):
            raise PreconditionFailed("changed")
        self.writes += 1
        for k in deletes:
            self.data.pop(k, None)
        self.data.update(puts)

    async def scan(self, prefix: bytes, after: bytes = b"", limit: int = 1000) -> list[tuple[bytes, bytes]]:
        keys = sorted(self.data)
        at = bisect.bisect_right(keys, after) if after else bisect.bisect_left(keys, prefix)
        out = [(k, self.data[k]) for k in keys[at:] if k.startswith(prefix)]
        return out[:limit]


@dataclass
class Services:
    state: MemoryState
    proxy_id: str = "me"


@dataclass
class Sessions:
    svc: Services
    dropped: list[tuple[str, str]] = field(default_factory=list)
    wills: list[tuple[str, str]] = field(default_factory=list)

    async def drop_stored(self, namespace: str, client_id: str, rec: state.SessionRecord) -> None:
        self.dropped.append((namespace, client_id))
        _, deletes = state.record_write(namespace, client_id, state.index_keys(namespace, client_id, rec), None)
        await self.svc.state.write([], deletes)

    async def publish_will(self, namespace: str, origin: str, will: Any) -> None:
        self.wills.append((origin, will.topic))


def store(mem: MemoryState, namespace: str, client_id: str, rec: state.SessionRecord) -> None:
    puts, _ = state.record_write(namespace, client_id, set(), rec)
    mem.data.update(puts)


def janitor() -> tuple[Janitor, MemoryState, Sessions]:
    mem = MemoryState()
    sessions = Sessions(Services(mem))
    return Janitor(cast(Any, sessions), INTERVAL_S), mem, sessions


def test_a_record_write_moves_its_index_entries() -> None:
    rec = state.SessionRecord(5, 60, owner="p1")
    assert state.index_keys("ns", "c", rec) == {state.owned_key("p1", "ns", "c")}
    before = state.index_keys("ns", "c", rec)
    rec.owner, rec.gone_ms = "", 1_000
    puts, deletes = state.record_write("ns", "c", before, rec)
    assert deletes == [state.owned_key("p1", "ns", "c")]
    assert dict(puts) == {state.expiry_key(61_000, "ns", "c"): b"", state.session_key("ns", "c"): rec.encode()}
    assert state.parse_expiry(state.expiry_key(61_000, "ns", "c")) == (61_000, "ns", "c")
    _, gone = state.record_write("ns", "c", state.index_keys("ns", "c", rec), None)
    assert sorted(gone) == sorted([state.expiry_key(61_000, "ns", "c"), state.session_key("ns", "c")])


@run
async def test_expired_sessions_are_dropped_and_the_others_kept() -> None:
    j, mem, sessions = janitor()
    now = convert.now_ms()
    store(mem, "", "old", state.SessionRecord(4, 10, gone_ms=now - 20_000))
    store(mem, "", "young", state.SessionRecord(4, 3600, gone_ms=now))
    store(mem, "", "online", state.SessionRecord(4, 10, owner="me"))
    await j.round()
    assert sessions.dropped == [("", "old")]
    assert state.session_key("", "old") not in mem.data
    assert state.expiry_key(now + 3_600_000, "", "young") in mem.data


@run
async def test_a_reconnect_between_the_scan_and_the_drop_wins() -> None:
    j, mem, sessions = janitor()
    now = convert.now_ms()
    rec = state.SessionRecord(4, 10, gone_ms=now - 20_000)
    store(mem, "", "back", rec)
    real_get = mem.get_one

    async def reconnected_meanwhile(key: bytes) -> bytes | None:
        raw = await real_get(key)
        back = state.SessionRecord(4, 10, owner="other", epoch=2)
        puts, deletes = state.record_write("", "back", state.index_keys("", "back", rec), back)
        await mem.write(puts, deletes)
        return raw

    mem.get_one = reconnected_meanwhile  # type: ignore[method-assign]
    await j.expire()
    assert sessions.dropped == []
    assert state.SessionRecord.decode(mem.data[state.session_key("", "back")]).owner == "other"


@run
async def test_a_round_reads_a_page_of_due_entries_not_every_session() -> None:
    j, mem, sessions = janitor()
    now = convert.now_ms()
    for i in range(SWEEP_PAGE + 10):
        store(mem, "", f"c{i:04d}", state.SessionRecord(4, 1, gone_ms=now - 5_000))
    for i in range(1_000):
        store(mem, "", f"live{i:04d}", state.SessionRecord(4, 60, owner="me"))
    await j.expire()
    assert len(sessions.dropped) == SWEEP_PAGE
    await j.expire()
    assert len(sessions.dropped) == SWEEP_PAGE + 10


@run
async def test_the_sessions_of_a_proxy_that_died_are_disconnected_with_their_wills() -> None:
    j, mem, sessions = janitor()
    now = convert.now_ms()
    stale = now - int((DEAD_ROUNDS + 1) * INTERVAL_S * 1000)
    mem.data[state.heartbeat_key("dead")] = state.heartbeat_value(stale)
    mem.data[state.heartbeat_key("alive")] = state.heartbeat_value(now)
    will = {"t": "a/will", "p": "", "q": 1, "r": False, "props": {}}
    store(mem, "", "orphan", state.SessionRecord(5, 60, owner="dead", epoch=3, will=will))
    store(mem, "", "clean", state.SessionRecord(5, 0, owner="dead", epoch=1))
    store(mem, "", "served", state.SessionRecord(5, 60, owner="alive"))
    await j.round()
    orphan = state.SessionRecord.decode(mem.data[state.session_key("", "orphan")])
    assert (orphan.owner, orphan.epoch, orphan.will) == ("", 4, None) and orphan.gone_ms >= now
    assert mem.data[state.kick_key("dead", "", "orphan")] == b"4"  # closes it if that proxy only paused
    assert sessions.wills == [("\x00orphan", "a/will")]
    assert sessions.dropped == [("", "clean")]  # expiry 0: gone with its connection
    assert state.SessionRecord.decode(mem.data[state.session_key("", "served")]).owner == "alive"
    assert state.heartbeat_key(j.svc.proxy_id) in mem.data
    # Its sessions handled, the dead proxy's kicks go, then its heartbeat.
    await j.round()
    await j.round()
    assert state.heartbeat_key("dead") not in mem.data
    assert not [k for k in mem.data if k.startswith(state.kick_prefix("dead"))]
    assert state.heartbeat_key("alive") in mem.data


@pytest.mark.parametrize("expiry_s", [0, 60])
@run
async def test_a_round_without_work_writes_only_the_heartbeat(expiry_s: int) -> None:
    j, mem, _ = janitor()
    for i in range(100):
        store(mem, "", f"c{i}", state.SessionRecord(4, expiry_s, owner="me"))
    await j.round()
    assert mem.writes == 1
