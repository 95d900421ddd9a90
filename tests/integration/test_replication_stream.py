"""CommitLog replication between two real stores over loopback TCP, coordinated by a real etcd.

A replica ends up with the primary's CommitLog byte for byte (segment rolls included) and serves
the same messages at the same queue offsets from its own indexes; with min_insync 2 a write is
acknowledged only after the replica holds it, and refused (retriable) once the replica has left the
in-sync set; a member with a divergent tail from an older epoch truncates it and then matches.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvloop

from broker.metadata import CF_TOPICS, METADATA_CFS
from broker.replication import protocol
from broker.replication.config import ReplicationConfig
from broker.replication.coordinator import Coordinator, Leader, MemberInfo
from broker.replication.epochs import LocalEpoch
from broker.replication.gate import AckGate
from broker.replication.primary import ReplicationServer
from broker.replication.replica import LogMustChange, Replica, cut_log
from broker.store.config import CommitLogConfig, StoreConfig
from broker.store.durability import LocalDurability
from broker.store.store import MessageStore, ReadStatus
from common.errors import Unavailable
from common.record import MessageRecord
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.procs import free_port

TIMEOUT_S = 60
STORE = StoreConfig(commitlog=CommitLogConfig(segment_bytes=64 * 1024))
TOPIC = "orders"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield proc
    proc.stop()


def _records(n: int, tag: str, size: int = 700) -> list[MessageRecord]:
    return [
        MessageRecord(TOPIC, i % 3, f"{tag}-{i}".encode() * (size // 8), message_id=f"{tag}-{i:06d}", keys=(f"k{i}",))
        for i in range(n)
    ]


def _log_bytes(store: MessageStore) -> bytes:
    return b"".join(seg.path.read_bytes() for seg in store.segments.all())


class _AckedByGate(LocalDurability):
    """The test primary's store durability: appends as standalone (`Primary.send` awaits the gate
    itself); `acked_end` from the gate once elected (the store opens first: its log end campaigns)."""

    gate: AckGate | None = None

    def acked_position(self) -> int | None:
        return None if self.gate is None else self.gate.acked_end()


@dataclass
class Primary:
    store: MessageStore
    coord: Coordinator
    gate: AckGate
    server: ReplicationServer
    leader: Leader

    async def send(self, records: list[MessageRecord]) -> None:
        results = await self.store.append(records)
        last = results[-1]
        await asyncio.wait_for(self.gate.wait(last.physical_offset + last.size), 10)


@contextlib.asynccontextmanager
async def _primary(etcd: EtcdProcess, group: str, data_dir: Path, cfg: ReplicationConfig) -> AsyncIterator[Primary]:
    durability = _AckedByGate()
    store = MessageStore(data_dir, STORE, extra_cfs=METADATA_CFS, durability=durability)
    port = free_port()
    member = MemberInfo("p", "-", f"127.0.0.1:{port}")
    coord = Coordinator(etcd.url, "test", group, member, lease_ttl_s=2, fence_margin_s=0.3)
    await coord.start()
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(coord.keep_alive(stop))
        leader = await coord.campaign(store.writer.written_position)
        assert leader is not None
        insync, _ = await coord.insync()
        assert insync is not None
        gate = durability.gate = AckGate(cfg, coord, leader, insync.members, lambda: store.writer.written_position)
        server = ReplicationServer(store, gate, coord.epochs, group=group, max_frame_bytes=cfg.max_frame_bytes)
        await server.start("127.0.0.1", port)
        tasks.create_task(gate.maintain(stop))
        try:
            yield Primary(store, coord, gate, server, leader)
        finally:
            stop.set()
            await server.close()
    await coord.close()
    store.close()


async def _follow(
    store: MessageStore, data_dir: Path, leader: Leader, group: str, name: str
) -> tuple[MessageStore, Replica, asyncio.Task[None], asyncio.Event]:
    """Connect a replica, cutting its log first if the primary says so; returns it following."""
    stop = asyncio.Event()
    for _ in range(3):
        replica = Replica(
            store, LocalEpoch(data_dir / "replication"), group=group, name=name, max_frame_bytes=16 * 1024
        )
        task = asyncio.create_task(replica.follow(leader, stop))
        await asyncio.sleep(0.3)
        if not task.done():
            return store, replica, task, stop
        with contextlib.suppress(LogMustChange):
            task.result()
            raise AssertionError("follow ended without a reason")
        exc = task.exception()
        assert isinstance(exc, LogMustChange)
        store.close()
        cut_log(data_dir, exc.to_offset, exc.min_offset)
        store = MessageStore(data_dir, STORE, extra_cfs=METADATA_CFS)
    raise AssertionError("the replica never started following")


async def _caught_up(primary: Primary, replica: MessageStore) -> None:
    for _ in range(200):
        if replica.writer.written_position == primary.store.writer.written_position:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replica did not catch up")


def test_replica_copies_the_log_and_acks_wait_for_it(etcd: EtcdProcess, tmp_path: Path) -> None:
    cfg = ReplicationConfig(group="g-copy", etcd=[etcd.url], min_insync=2, max_lag_ms=1_000)

    async def body() -> None:
        async with _primary(etcd, "g-copy", tmp_path / "p", cfg) as primary:
            # Alone, the primary has fewer than min_insync members in sync: refused, retriable.
            with pytest.raises(Unavailable, match="fewer than min_insync"):
                await primary.send(_records(1, "early"))
            replica_store = MessageStore(tmp_path / "r", STORE, extra_cfs=METADATA_CFS)
            replica_store, _replica, task, stop = await _follow(
                replica_store, tmp_path / "r", primary.leader, "g-copy", "r"
            )
            for _ in range(100):
                if "r" in primary.gate.insync:
                    break
                await asyncio.sleep(0.05)
            assert primary.gate.insync == {"r"}
            for i in range(30):  # ~30 * 20 * 760 bytes: several 64 KiB segments
                await primary.send(_records(20, f"b{i}"))
            await _caught_up(primary, replica_store)
            assert _log_bytes(replica_store) == _log_bytes(primary.store)
            # Everything the replica holds is acknowledged: every queue's acked end is its end.
            assert primary.gate.acked_end() == primary.store.writer.written_position
            primary.store.wait_dispatched()
            ends = [primary.store.queue_bounds(TOPIC, qid)[1] for qid in range(3)]
            assert [primary.store.acked_end(TOPIC, qid) for qid in range(3)] == ends and min(ends) > 0
            assert len(replica_store.segments.all()) == len(primary.store.segments.all()) > 3
            replica_store.wait_dispatched()
            for qid in range(3):
                got = replica_store.read(TOPIC, qid, 0, max_messages=1000)
                want = primary.store.read(TOPIC, qid, 0, max_messages=1000)
                assert got.status is ReadStatus.FOUND
                assert [(m.message_id, m.queue_offset, m.body) for m in got.messages] == [
                    (m.message_id, m.queue_offset, m.body) for m in want.messages
                ]
            assert replica_store.find_by_key(TOPIC, "k5")
            # Topic metadata (RocksDB, not the log) follows within a metadata check interval.
            primary.store.index.cf(CF_TOPICS).put(b"orders", b'{"name": "orders"}')
            for _ in range(100):
                if replica_store.index.cf(CF_TOPICS).get(b"orders") is not None:
                    break
                await asyncio.sleep(0.05)
            assert replica_store.index.cf(CF_TOPICS).get(b"orders") == b'{"name": "orders"}'
            # The replica goes away: after max_lag_ms it leaves the in-sync set (in etcd too) and
            # the primary refuses instead of acknowledging with one copy.
            stop.set()
            await task
            await primary.store.append(_records(1, "late"))
            for _ in range(100):
                if not primary.gate.insync:
                    break
                await asyncio.sleep(0.05)
            insync, _ = await primary.coord.insync()
            assert insync is not None and insync.members == ("p",)
            with pytest.raises(Unavailable, match="fewer than min_insync"):
                await primary.send(_records(1, "refused"))
            replica_store.close()

    asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))


def test_a_divergent_tail_is_truncated(etcd: EtcdProcess, tmp_path: Path) -> None:
    cfg = ReplicationConfig(group="g-trunc", etcd=[etcd.url], min_insync=1)

    async def body() -> None:
        # An old member holds data of epoch 1 the next primary never had: make it by hand.
        old = MessageStore(tmp_path / "old", STORE, extra_cfs=METADATA_CFS)
        await old.append(_records(10, "shared"))
        old.close()
        shutil.copytree(tmp_path / "old", tmp_path / "p")
        old = MessageStore(tmp_path / "old", STORE, extra_cfs=METADATA_CFS)
        await old.append(_records(10, "divergent"))  # written by the old primary after its term
        LocalEpoch(tmp_path / "old" / "replication").set(1)
        async with _primary(etcd, "g-trunc", tmp_path / "p", cfg) as primary:
            # In etcd this primary's term is epoch 1 (a fresh group): record it as epoch 2 by
            # campaigning again after giving up the first term.
            await primary.coord.resign(primary.leader)
            second = await primary.coord.campaign(primary.store.writer.written_position)
            assert second is not None and second.epoch == 2
            primary.gate.leader = second
            await primary.send(_records(5, "new"))
            old, _, task, stop = await _follow(old, tmp_path / "old", second, "g-trunc", "old")
            await _caught_up(primary, old)
            assert _log_bytes(old) == _log_bytes(primary.store)
            old.wait_dispatched()
            ids = {m.message_id for q in range(3) for m in old.read(TOPIC, q, 0, max_messages=100).messages}
            assert not any(i.startswith("divergent") for i in ids) and any(i.startswith("new") for i in ids)
            assert LocalEpoch(tmp_path / "old" / "replication").value == 2
            stop.set()
            await task
            old.close()

    asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def follow_fake_primary(tmp_path: Path, primary: Handler, error: str) -> None:
    """A replica follows a stand-in primary (`primary` serves its connection); the attempt must end
    with Unavailable matching `error`, the replica's store as it was."""

    async def body() -> None:
        server = await asyncio.start_server(primary, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        store = MessageStore(tmp_path / "r", STORE, extra_cfs=METADATA_CFS)
        try:
            replica = Replica(store, LocalEpoch(tmp_path / "r" / "replication"), group="g", name="r",
                              max_frame_bytes=16 * 1024)  # fmt: skip
            leader = Leader("p", 1, 0, "-", f"127.0.0.1:{port}")
            with pytest.raises(Unavailable, match=error):
                await replica.follow(leader, asyncio.Event())
            assert store.writer.written_position == 0
        finally:
            store.close()
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))


def test_a_primary_that_never_answers_hello_is_unavailable(tmp_path: Path) -> None:
    """A connection that opens but stays silent (a partition past a relay, a hung primary) ends the
    attempt with Unavailable, which the member retries; it used to escape as TimeoutError and end
    the broker process."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes HELLO, answers nothing until the replica hangs up
        writer.close()

    follow_fake_primary(tmp_path, silent, "TimeoutError")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"\x00" * 64, "not a replication frame"),  # another protocol, or a release with another frame version
        (b"".join(protocol.frame(protocol.FrameType.START, b"{not json")), "not JSON"),
    ],
    ids=["not-a-frame", "start-not-json"],
)
def test_a_malformed_stream_ends_the_attempt_not_the_process(tmp_path: Path, answer: bytes, reason: str) -> None:
    """A frame the replica cannot take ends the connection with Unavailable, which the member
    retries (it reconnects from its own log end); it used to escape as BadRequest and end the broker
    process. The store is left as it was."""

    async def garbled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)  # HELLO has come
        writer.write(answer)
        await writer.drain()
        await reader.read()
        writer.close()

    follow_fake_primary(tmp_path, garbled, f"cannot apply .*{reason}.*same Sluice release")


def test_metadata_larger_than_a_frame_reaches_the_replica(etcd: EtcdProcess, tmp_path: Path) -> None:
    """Topic and group metadata is one versioned document; larger than a frame, it travels as
    META_PART pieces and a last META (a replica used to refuse the oversized frame and exit)."""
    frame_bytes = 16 * 1024  # what `_follow`'s replicas accept
    cfg = ReplicationConfig(group="g-meta", etcd=[etcd.url], min_insync=1, max_frame_bytes=frame_bytes)
    topics = {f"topic-{i:04d}".encode(): b'{"queues": 8, "padding": "' + b"x" * 100 + b'"}' for i in range(400)}

    async def body() -> None:
        async with _primary(etcd, "g-meta", tmp_path / "p", cfg) as primary:
            for key, value in topics.items():
                primary.store.index.cf(CF_TOPICS).put(key, value)
            replica_store = MessageStore(tmp_path / "r", STORE, extra_cfs=METADATA_CFS)
            replica_store, _replica, task, stop = await _follow(
                replica_store, tmp_path / "r", primary.leader, "g-meta", "r"
            )
            for _ in range(200):
                if dict(replica_store.index.cf(CF_TOPICS).items()) == topics or task.done():
                    break
                await asyncio.sleep(0.05)
            assert not task.done(), f"the replica stopped following: {task.exception()!r}"
            assert dict(replica_store.index.cf(CF_TOPICS).items()) == topics
            stop.set()
            await task
            replica_store.close()

    asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))


def test_a_replica_lost_mid_piece_and_a_closing_server_leave_nothing_behind(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A replica that resets its connection while the primary reads the next piece for it (uvloop
    then raises RuntimeError for the write to the closed transport) just ends that connection: no
    "Unhandled exception in client_connected_cb". A server closed while a connection waits for new
    data leaves no waiter task pending ("Task was destroyed but it is pending!" at exit)."""
    cfg = ReplicationConfig(group="g-lost", etcd=[etcd.url], min_insync=1)
    hello = {"group": "g-lost", "name": "x", "epoch": 0, "log_end": 0}

    async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.writelines(protocol.control(protocol.FrameType.HELLO, hello))
        kind, _ = await protocol.read_frame(reader, 0)
        assert kind is protocol.FrameType.START
        return reader, writer

    async def body() -> None:
        errors: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        async with _primary(etcd, "g-lost", tmp_path / "p", cfg) as primary:
            await primary.store.append(_records(20, "a"))
            reading, read = threading.Event(), primary.store.segments.read

            def slow_read(position: int, size: int) -> bytes:
                reading.set()
                time.sleep(0.3)  # the replica resets meanwhile
                return read(position, size)

            primary.store.segments.read = slow_read  # type: ignore[method-assign,assignment]
            port = int(primary.leader.repl_address.rsplit(":", 1)[1])
            _, writer = await connect(port)
            assert await asyncio.to_thread(reading.wait, 10)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
            writer.transport.abort()
            for _ in range(100):
                if not primary.server._connections:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)
            assert not errors, errors
            # A connection caught up and waiting for data when the server closes.
            primary.store.segments.read = read  # type: ignore[method-assign]
            _, writer = await connect(port)
            await asyncio.sleep(0.3)
            await primary.server.close()
            await asyncio.sleep(0.05)  # a cancelled task is done once it ran again
            waiting = [t for t in asyncio.all_tasks() if _waits_on(t, primary.server._data)]
            assert not waiting, waiting
            writer.close()
        assert not errors, errors

    uvloop.run(asyncio.wait_for(body(), TIMEOUT_S))


def _waits_on(task: asyncio.Task[object], event: asyncio.Event) -> bool:
    frame = getattr(task.get_coro(), "cr_frame", None)
    return frame is not None and frame.f_locals.get("self") is event
