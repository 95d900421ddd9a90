"""Consumer state replication between two real stores over loopback TCP, coordinated by a real etcd.

A replica gets the primary's replicated column families as a snapshot when it connects and then
every change in order; `AckGate.wait_state()` returns only once the in-sync replica has written
the changes made so far (so an ack answered after it is on the replica), and refuses once the replica
left the in-sync set. Committed offsets carry topic names, so a replica whose topic ids differ from
the primary's still files them under the right topic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.local import BROKER_CFS
from broker.popstate import EntryState, PopState
from broker.replication import state as S
from broker.replication.config import ReplicationConfig
from broker.replication.coordinator import Coordinator, Leader, MemberInfo
from broker.replication.epochs import LocalEpoch
from broker.replication.gate import AckGate
from broker.replication.primary import ReplicationServer
from broker.replication.replica import Replica
from broker.replication.state import REPLICATED_CFS, StateApplier, snapshot_incomplete
from broker.store.config import StoreConfig
from broker.store.statelog import StateRecorder
from broker.store.store import MessageStore
from common.errors import Unavailable
from common.record import MessageRecord
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.procs import free_port

TIMEOUT_S = 60
GROUP = "billing"
TOPIC = "orders"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield proc
    proc.stop()


@dataclass
class Primary:
    store: MessageStore
    gate: AckGate
    leader: Leader
    recorder: StateRecorder
    server: ReplicationServer


@contextlib.asynccontextmanager
async def _primary(etcd: EtcdProcess, group: str, data_dir: Path, cfg: ReplicationConfig) -> AsyncIterator[Primary]:
    store = MessageStore(data_dir, StoreConfig(), extra_cfs=BROKER_CFS)
    recorder = StateRecorder(REPLICATED_CFS, {cf: store.index.handle(cf) for cf in REPLICATED_CFS},
                             lambda: store.writer.written_position, cfg.max_lag_bytes)  # fmt: skip
    store.index.recorder = recorder
    port = free_port()
    coord = Coordinator(
        etcd.url, "test", group, MemberInfo("p", "-", f"127.0.0.1:{port}"), lease_ttl_s=2, fence_margin_s=0.3
    )
    await coord.start()
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(coord.keep_alive(stop))
        leader = await coord.campaign(store.writer.written_position)
        assert leader is not None
        insync, _ = await coord.insync()
        assert insync is not None
        gate = AckGate(cfg, coord, leader, insync.members, lambda: store.writer.written_position,
                       state_seq=lambda: recorder.seq)  # fmt: skip
        server = ReplicationServer(store, gate, coord.epochs, group=group, max_frame_bytes=cfg.max_frame_bytes)
        await server.start("127.0.0.1", port)
        tasks.create_task(gate.maintain(stop))
        try:
            yield Primary(store, gate, leader, recorder, server)
        finally:
            stop.set()
            await server.close()
    await coord.close()
    store.close()


def _inflight(state: PopState, qid: int, offset: int) -> EntryState | None:
    entry = state.entry(GROUP, TOPIC, qid, offset)
    return None if entry is None else entry.state


def test_state_reaches_the_replica_before_the_wait_returns(etcd: EtcdProcess, tmp_path: Path) -> None:
    cfg = ReplicationConfig(group="g-state", etcd=[etcd.url], min_insync=2, max_lag_ms=1_000)

    async def body() -> None:
        async with _primary(etcd, "g-state", tmp_path / "p", cfg) as primary:
            store = primary.store
            await store.append([MessageRecord(TOPIC, q, b"m", message_id=f"m{q}") for q in range(2)])
            store.wait_dispatched()
            pop = PopState(store.index)
            batch = pop.batch()  # before the replica exists: it gets this in its snapshot
            batch.add_inflight(GROUP, TOPIC, 0, 0, 10**13, "")
            batch.set_cursor(GROUP, TOPIC, 0, 1)
            batch.commit()
            store.commit_offset(GROUP, TOPIC, 1, 7)

            # The replica met another topic first: its topic ids differ from the primary's.
            replica_store = MessageStore(tmp_path / "r", StoreConfig(), extra_cfs=BROKER_CFS)
            tb = replica_store.index.batch()
            replica_store.index.intern_topic("elsewhere", tb)
            replica_store.index.write(tb)
            stop = asyncio.Event()
            replica = Replica(replica_store, LocalEpoch(tmp_path / "r" / "replication"), group="g-state",
                              name="r", max_frame_bytes=cfg.max_frame_bytes)  # fmt: skip
            following = asyncio.create_task(replica.follow(primary.leader, stop))
            for _ in range(200):
                if "r" in primary.gate.insync:
                    break
                await asyncio.sleep(0.05)
            assert primary.gate.insync == {"r"}
            replica_pop = PopState(replica_store.index)
            assert _inflight(replica_pop, 0, 0) is EntryState.INFLIGHT
            assert replica_store.committed_offset(GROUP, TOPIC, 1) == 7
            assert replica_store.index.topic_id(TOPIC) != store.index.topic_id(TOPIC)

            # An ack and an offset commit: once wait_state returns, the replica holds both.
            entry = pop.entry(GROUP, TOPIC, 0, 0)
            assert entry is not None
            batch = pop.batch()
            batch.remove(GROUP, TOPIC, 0, 0, entry)
            batch.commit()
            store.commit_offset(GROUP, TOPIC, 1, 9)
            await asyncio.wait_for(primary.gate.wait_state(), 10)
            assert _inflight(PopState(replica_store.index), 0, 0) is None
            assert replica_store.committed_offset(GROUP, TOPIC, 1) == 9
            for cf in REPLICATED_CFS:
                if cf != "offsets":  # keyed by topic id, which differs here
                    assert list(replica_store.index.cf(cf).items()) == list(store.index.cf(cf).items()), cf

            # The replica goes away: the next change is refused once it left the in-sync set.
            stop.set()
            await following
            store.commit_offset(GROUP, TOPIC, 1, 11)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(primary.gate.wait_state(), 10)
            replica_store.close()

    asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))


def test_a_snapshot_larger_than_a_frame_streams_in_pieces(etcd: EtcdProcess, tmp_path: Path) -> None:
    """State of many frames reaches a replica whole; what the replica held before is replaced."""
    frame = 16 << 10
    cfg = ReplicationConfig(group="g-big", etcd=[etcd.url], min_insync=2, max_lag_ms=5_000, max_frame_bytes=frame)

    async def body() -> None:
        async with _primary(etcd, "g-big", tmp_path / "p", cfg) as primary:
            index = primary.store.index
            for start in range(0, 4000, 500):  # ~1 MiB of trace and security state: ~130 frames
                batch = index.batch()
                for n in range(start, start + 500):
                    batch.put(f"trace-{n:06d}".encode(), bytes(200), index.handle("trace"))
                index.write(batch)
            replica_store = MessageStore(tmp_path / "r", StoreConfig(), extra_cfs=BROKER_CFS)
            stale = replica_store.index.batch()
            stale.put(b"not-on-the-primary", b"x", replica_store.index.handle("trace"))
            replica_store.index.write(stale)
            stop = asyncio.Event()
            replica = Replica(replica_store, LocalEpoch(tmp_path / "r" / "replication"), group="g-big",
                              name="r", max_frame_bytes=frame)  # fmt: skip
            following = asyncio.create_task(replica.follow(primary.leader, stop))
            for _ in range(600):
                if "r" in primary.gate.insync:
                    break
                await asyncio.sleep(0.05)
            await asyncio.wait_for(primary.gate.wait_state(), 30)  # holds the snapshot
            assert primary.server.snapshot_frames > 1
            for cf in REPLICATED_CFS:
                assert list(replica_store.index.cf(cf).items()) == list(index.cf(cf).items()), cf
            assert not snapshot_incomplete(replica_store.index)
            stop.set()
            await following
            replica_store.close()

    asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))


def test_a_replica_cut_off_mid_snapshot_is_marked_incomplete(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "r", StoreConfig(), extra_cfs=BROKER_CFS)
    try:
        applier = StateApplier(store.index, 1 << 10)
        put = (1, "trace", b"k", b"v")
        assert applier.apply(S.encode(S.SNAPSHOT, 5, [put], store.index)) is None
        assert snapshot_incomplete(store.index)  # a member in this state does not campaign
        assert StateApplier(store.index, 1 << 10).apply(S.encode(S.SNAPSHOT | S.LAST, 9, [], store.index)) == 9
        assert not snapshot_incomplete(store.index)
        assert list(store.index.cf("trace").items()) == []  # the complete snapshot replaced the piece
    finally:
        store.close()


def test_recorder_numbers_replicated_changes_and_bounds_its_backlog(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "p", StoreConfig(), extra_cfs=BROKER_CFS)
    index = store.index
    recorder = StateRecorder(REPLICATED_CFS, {cf: index.handle(cf) for cf in REPLICATED_CFS},
                             lambda: store.writer.written_position, max_backlog_bytes=64)  # fmt: skip
    index.recorder = recorder
    try:
        batch = index.batch()  # the dispatcher's families are not replicated: not recorded
        batch.put(b"k", b"v", index.handle("segq"))
        index.write(batch)
        assert recorder.seq == 0
        seq, _ = recorder.snapshot(index.cf)  # a stream starts: changes are kept from here
        for n in range(3):
            batch = index.batch()
            batch.put(f"key{n}".encode(), b"v" * 8, index.handle("offsets"))
            batch.delete(b"gone", index.handle("txn"))
            batch.put(b"k", b"v", index.handle("segq"))
            index.write(batch)
        changes = recorder.since(seq)
        assert changes is not None and [c.seq for c in changes] == [1, 2, 3]
        assert [op[1] for op in changes[0].ops] == ["offsets", "txn"]
        for n in range(10):  # past the 64-byte backlog: the oldest are dropped
            batch = index.batch()
            batch.put(f"more{n}".encode(), b"v" * 16, index.handle("offsets"))
            index.write(batch)
        assert recorder.since(seq) is None  # that stream must start over from a snapshot
        assert recorder.since(recorder.seq) == []
        recorder.release(None)  # nobody streams: nothing is kept
        batch = index.batch()
        batch.put(b"late", b"v", index.handle("offsets"))
        index.write(batch)
        assert not recorder.changes and recorder.seq == 14
    finally:
        index.recorder = None
        store.close()
