"""A member whose term began before the process froze its startup objects (processes/runtime.py
`_settle`, 5 s after start) reopens its data directory at once when the term ends.

Frozen objects are never collected as cycles. A term's parts hold column family handles (the
trace recorder, the pop state, the metadata, the pending transactions), and RocksDB keeps its
lock while any handle lives; in the soak (seed 3: blackhole-replicas, stop-primary, kill-primary)
the deposed primary's parts stayed alive in such cycles (with its calls' tasks and the tracebacks
of sends refused during the partition) and the member retried `STORE_RELOCK_S` (30 s), then the
process exited. Here the cycle is made explicitly through the trace recorder, one of the holders
the soak showed; the store is then opened the way `GroupMember` opens it after a term (no etcd:
`_open_store` only opens the data directory)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.replication import member as member_module
from broker.replication.config import ReplicationConfig
from broker.replication.member import GroupMember, RoleSwitch
from broker.store.index import StoreLocked
from broker.store.store import MessageStore
from common import frozen

GROUP = "g-relock"


def _config(tmp_path: Path) -> BrokerConfig:
    repl = ReplicationConfig(group=GROUP, etcd=["http://127.0.0.1:1"])  # never dialled here
    return BrokerConfig(name="b1", data_dir=tmp_path / "b1", replication=repl)


class _Leftover:
    """What a call of the term leaves: garbage in a cycle that keeps a part of the term alive."""

    def __init__(self, part: object) -> None:
        self.part = part
        self.cycle = self


async def _term_started_before_the_freeze(cfg: BrokerConfig) -> None:
    broker = LocalBroker(dataclasses.replace(cfg, name=GROUP), term=1, term_valid=lambda: True)
    await broker.start()
    _Leftover(broker.trace)  # a cycle through a handle holder, before the freeze as in the soak
    gc.freeze()  # what every server process does once started (processes/runtime.py)
    await broker.close()


def test_frozen_garbage_keeps_the_closed_store_locked_until_collect_frozen(tmp_path: Path) -> None:
    """The cause on its own: a plain collection does not release the closed store; `collect_frozen` does."""
    cfg = _config(tmp_path)
    try:
        asyncio.run(_term_started_before_the_freeze(cfg))
        gc.collect()
        with pytest.raises(StoreLocked):
            MessageStore(cfg.data_dir, cfg.store).close()
        frozen.collect_frozen()
        MessageStore(cfg.data_dir, cfg.store).close()
    finally:
        gc.unfreeze()


def test_a_deposed_member_reopens_its_store_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(tmp_path)
    monkeypatch.setattr(member_module, "STORE_RELOCK_S", 0.0)  # no retrying: the first attempt must open it

    async def scenario() -> None:
        await _term_started_before_the_freeze(cfg)
        member = GroupMember(cfg, RoleSwitch(cfg.name, GROUP), "127.0.0.1:1", None)
        store = await member._open_store()
        await asyncio.get_running_loop().run_in_executor(None, store.close)

    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()
