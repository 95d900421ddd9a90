"""`AckGate.acked_state`: the latest consumer state change a FIFO message group's next message may
be released on (docs/replication.md, "FIFO message groups"): held by every in-sync member, with at
least `min_insync` in sync, never going back, and -1 until every in-sync member has acknowledged the
new term's state once (the state the term began with may hold an ack its predecessor applied that
reached this member only)."""

from __future__ import annotations

from typing import cast

from broker.replication.config import ReplicationConfig
from broker.replication.coordinator import Coordinator, Leader
from broker.replication.gate import AckGate

LEADER = Leader("b1", 2, 0, "127.0.0.1:1", "127.0.0.1:2")


def _gate(insync: tuple[str, ...], min_insync: int = 2, seq: int = 0) -> AckGate:
    config = ReplicationConfig(group="g1", etcd=["http://127.0.0.1:2379"], min_insync=min_insync)
    return AckGate(config, cast(Coordinator, None), LEADER, insync, state_seq=lambda: seq)


def test_nothing_is_held_until_every_in_sync_replica_acknowledged_the_terms_state() -> None:
    gate = _gate(("b1", "b2", "b3"))
    assert gate.acked_state() == -1
    gate.on_state_ack("b2", 0)  # its snapshot of this term (taken before any change)
    assert gate.acked_state() == -1  # b3 may lack an ack the last primary applied
    gate.on_state_ack("b3", 0)
    assert gate.acked_state() == 0


def test_the_slowest_in_sync_replica_decides_and_it_never_goes_back() -> None:
    gate = _gate(("b1", "b2", "b3"))
    gate.on_state_ack("b2", 7)
    gate.on_state_ack("b3", 5)
    assert gate.acked_state() == 5
    gate.insync.discard("b3")  # left the set (it stopped answering): b2 alone decides
    assert gate.acked_state() == 7
    gate.insync.discard("b2")  # below min_insync: nothing more is held, nothing held is taken back
    gate.on_state_ack("b2", 9)
    assert gate.acked_state() == 7


def test_alone_with_min_insync_1_everything_is_held() -> None:
    assert _gate(("b1",), min_insync=1, seq=4).acked_state() == 4
