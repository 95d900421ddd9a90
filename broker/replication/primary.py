"""The primary's replication server: streams the CommitLog to replicas and feeds their acks to the gate.

Per connection: HELLO (the replica's group, name, last epoch, log end) → the primary answers START
with where the replica's log must end before streaming (the epoch truncation rule, epochs.py;
raised to the oldest offset this primary still stores) → DATA from there, as the log grows, while
ACKs flow back to the `AckGate`. A newer connection of the same replica replaces the older one.
Topic and consumer group metadata (RocksDB, not the CommitLog) travels as versioned META frames:
the whole of it on connect and again whenever it changed, which `sync_metadata()` checks at once
(the member calls it on every topic change, and waits for the in-sync replicas' META_ACKs) and a
timer every `METADATA_CHECK_S` (group changes).
Consumer state (RocksDB column families, state.py) travels as STATE frames when the store has a
`StateRecorder`: a snapshot on connect (after START, before any DATA), then every change, each sent
only once the DATA up to the position it was made at is sent; STATE_ACKs flow back to the gate.
Sends read the page cache through `SegmentSet.read` in the default executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from broker.metadata import CF_GROUPS, CF_TOPICS
from broker.replication import protocol as P
from broker.replication import state as S
from broker.replication.epochs import Epoch, truncation_point
from broker.replication.gate import AckGate
from broker.store.dispatcher import Touched, call_soon_from_any_thread
from broker.store.statelog import Op, StateRecorder, snapshot_ops
from broker.store.store import MessageStore
from common.errors import BadRequest, SluiceError, Unavailable
from common.logs import kv

log = logging.getLogger("sluice.replication.primary")

HELLO_TIMEOUT_S = 5.0
METADATA_CHECK_S = 0.5
METADATA_CFS = (CF_TOPICS, CF_GROUPS)


def metadata_snapshot(store: MessageStore) -> dict[str, dict[str, str]]:
    """The topic and group column families (they are small)."""
    return {cf: {k.decode(): v.decode() for k, v in store.index.cf(cf).items()} for cf in METADATA_CFS}


def apply_metadata(store: MessageStore, payload: bytes) -> int:
    """Make a replica's topic and group column families equal to a primary's snapshot; returns
    its version."""
    doc = P.parse_control(payload, "version", *METADATA_CFS)
    for cf_name in METADATA_CFS:
        cf, wanted = store.index.cf(cf_name), doc[cf_name]
        if not isinstance(wanted, dict):
            raise BadRequest(f"replicated metadata {cf_name} is not a table")
        for key in [k for k, _ in cf.items() if k.decode() not in wanted]:
            cf.delete(key)
        for key, value in wanted.items():
            cf.put(str(key).encode(), str(value).encode())
    return int(doc["version"])


class ReplicationServer:
    def __init__(
        self,
        store: MessageStore,
        gate: AckGate,
        history: Callable[[], Awaitable[list[Epoch]]],
        *,
        group: str,
        max_frame_bytes: int,
        token: str = "",
    ) -> None:
        self._store = store
        self._gate = gate
        self._history = history
        self._group = group
        self._max_frame = max_frame_bytes
        self._token = token
        self._server: asyncio.Server | None = None
        self._data = asyncio.Event()
        self._connections: dict[str, asyncio.Task[None]] = {}
        self._loop = asyncio.get_running_loop()
        store.add_dispatch_listener(self._on_dispatch)
        self._metadata = metadata_snapshot(store)
        self._meta_version = 1
        self._meta_acked: dict[str, int] = {}
        self._metadata_task: asyncio.Task[None] | None = None
        self._recorder: StateRecorder | None = store.index.recorder
        self._state_sent: dict[str, int] = {}  # replica -> the last state change sent to it
        self.snapshot_frames = 0  # STATE frames of snapshots sent so far
        # Snapshots read RocksDB here, one at a time; close() waits for a read in progress, since
        # the store closes right after (a task cancelled while awaiting it leaves the thread running).
        self._snapshot_reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="repl-snapshot")
        if self._recorder is not None:
            self._recorder.on_change = self._wake

    def _on_dispatch(self, _queues: Touched) -> None:  # the writer's thread or the loop
        self._wake()

    def _wake(self) -> None:  # any thread
        call_soon_from_any_thread(self._loop, self._data.set)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port."""
        self._server = await asyncio.start_server(self._serve, host, port)
        self._metadata_task = asyncio.create_task(self._watch_metadata(), name="replication-metadata")
        bound: int = self._server.sockets[0].getsockname()[1]
        log.info("replication server listening", extra=kv(group=self._group, port=bound))
        return bound

    async def _watch_metadata(self) -> None:
        while True:
            await asyncio.sleep(METADATA_CHECK_S)
            self._refresh_metadata()

    def _refresh_metadata(self) -> int:
        snapshot = metadata_snapshot(self._store)
        if snapshot != self._metadata:
            self._metadata = snapshot
            self._meta_version += 1
            self._data.set()  # senders compare with the version they sent last
        return self._meta_version

    async def sync_metadata(self, timeout_s: float) -> None:
        """Send changed metadata now and wait until every in-sync replica holds it; Unavailable
        when that takes longer than `timeout_s` (the change stays, and replicas get it later)."""
        version = self._refresh_metadata()
        deadline = self._loop.time() + timeout_s
        while any(self._meta_acked.get(m, 0) < version for m in self._gate.insync):
            if self._loop.time() >= deadline:
                raise Unavailable("a metadata change did not reach every in-sync replica in time")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._recorder is not None:
            self._recorder.on_change = None
            self._recorder.release(None)
        if self._metadata_task is not None:
            self._metadata_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metadata_task
        if self._server is not None:
            self._server.close()
        for task in list(self._connections.values()):
            task.cancel()
        for task in list(self._connections.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.get_running_loop().run_in_executor(None, self._snapshot_reader.shutdown)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = ""
        try:
            kind, payload = await asyncio.wait_for(P.read_frame(reader, 0), HELLO_TIMEOUT_S)
            if kind is not P.FrameType.HELLO:
                raise BadRequest("a replica must open with HELLO")
            hello = P.parse_control(payload, "group", "name", "epoch", "log_end")
            if hello["group"] != self._group:
                raise BadRequest(f"this primary serves group {self._group}, not {hello['group']}")
            if self._token and not hmac.compare_digest(str(hello.get("token", "")), self._token):
                raise BadRequest("the replica's cluster token is missing or wrong")
            name = str(hello["name"])
            previous = self._connections.get(name)
            if previous is not None:
                previous.cancel()
            current = asyncio.current_task()
            assert current is not None
            self._connections[name] = current
            await self._stream(name, int(hello["epoch"]), int(hello["log_end"]), reader, writer)
        except (SluiceError, ValueError) as exc:
            message = exc.message if isinstance(exc, SluiceError) else str(exc)
            log.warning("replica refused", extra=kv(replica=name, error=message))
            if not writer.is_closing():  # uvloop raises on a write to a closed transport
                writer.writelines(P.error(message))
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        except RuntimeError:
            # uvloop raises RuntimeError for a write to a transport the peer closed (a replica killed
            # while a piece was being read): the connection is simply gone, like a ConnectionError.
            if not writer.is_closing():
                raise
        except asyncio.CancelledError:
            pass  # replaced by a newer connection, or the server closes: this connection just ends
        finally:
            if name and self._connections.get(name) is asyncio.current_task():
                del self._connections[name]
                self._gate.disconnected(name)
                if self._state_sent.pop(name, None) is not None:
                    self._release_state()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _stream(
        self, name: str, epoch: int, log_end: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        store = self._store
        history = await self._history()
        start = truncation_point(history, epoch, log_end, store.writer.written_position)
        oldest = store.segments.min_offset()
        start = max(start, oldest)  # older data is gone here: the replica restarts its log at `oldest`
        body = {"epoch": self._gate.leader.epoch, "from_offset": start, "min_offset": oldest}
        writer.writelines(P.control(P.FrameType.START, body))
        await writer.drain()
        if start != log_end:
            return  # the replica truncates (or restarts its log) and reconnects
        state = self._gate.connected(name)
        self._gate.on_ack(name, log_end)
        log.info("replica streaming", extra=kv(replica=name, from_position=start, epoch=body["epoch"]))
        acks = asyncio.ensure_future(self._read_acks(name, reader))
        try:
            state_seq = await self._send_snapshot(name, writer) if self._recorder is not None else 0
            await self._send(name, start, state_seq, writer, acks)
        finally:
            acks.cancel()
            state.connected = False

    async def _send_snapshot(self, name: str, writer: asyncio.StreamWriter) -> int:
        """Send the whole replicated state as of now (STATE frames flagged SNAPSHOT); its seq.

        Streamed: the reader thread encodes one piece (at most half a frame of keys and values)
        while the last one is sent, so memory stays bounded whatever the state's size."""
        recorder = self._recorder
        assert recorder is not None
        seq, iterators = recorder.snapshot(self._store.index.cf)
        self._state_sent[name] = seq  # changes after `seq` are kept for this stream from now on
        loop = asyncio.get_running_loop()
        pieces = self._snapshot_pieces(seq, iterators)
        while (piece := await loop.run_in_executor(self._snapshot_reader, next, pieces, None)) is not None:
            writer.writelines(P.frame(P.FrameType.STATE, piece))
            await writer.drain()
            self.snapshot_frames += 1
        return seq

    def _snapshot_pieces(self, seq: int, iterators: list[tuple[str, object]]) -> Iterator[bytes]:
        """The snapshot's STATE payloads, each within the frame limit (advanced in the reader thread)."""
        ops: list[Op] = []
        size, budget = 0, self._max_frame // 2  # room for the topic names keys may carry
        for op in snapshot_ops(iterators):
            ops.append(op)
            size += len(op[2]) + len(op[3]) + len(op[1])
            if size >= budget:
                yield S.encode(S.SNAPSHOT, seq, ops, self._store.index)
                ops, size = [], 0
        yield S.encode(S.SNAPSHOT | S.LAST, seq, ops, self._store.index)

    def _release_state(self) -> None:
        if self._recorder is not None:
            self._recorder.release(min(self._state_sent.values()) if self._state_sent else None)

    async def _send_state(self, name: str, seq: int, position: int, writer: asyncio.StreamWriter) -> int:
        """Send the state changes after `seq` made at or before CommitLog `position` (the replica
        holds what they refer to); returns the last one sent."""
        recorder = self._recorder
        assert recorder is not None
        changes = recorder.since(seq)
        if changes is None:
            raise Unavailable(f"replica {name} fell too far behind on state changes: it starts over from a snapshot")
        sent = seq
        for change in changes:
            if change.position > position:
                break
            payload = S.encode(0, change.seq, change.ops, self._store.index)
            if len(payload) > self._max_frame:
                raise Unavailable(f"a state change of {len(payload)} bytes exceeds a frame: replica {name} resyncs")
            writer.writelines(P.frame(P.FrameType.STATE, payload))
            sent = change.seq
        if sent != seq:
            await writer.drain()
            self._state_sent[name] = sent
            self._release_state()
        return sent

    async def _send(
        self, name: str, position: int, state_seq: int, writer: asyncio.StreamWriter, acks: asyncio.Future[None]
    ) -> None:
        store, loop = self._store, asyncio.get_running_loop()
        sent_version = 0
        while not acks.done():
            if sent_version != self._meta_version:
                sent_version = self._meta_version
                body = {"version": sent_version, **self._metadata}
                writer.writelines(P.meta(json.dumps(body, separators=(",", ":")).encode(), self._max_frame))
                await writer.drain()
            self._data.clear()
            end = store.writer.written_position
            if self._recorder is not None:
                state_seq = await self._send_state(name, state_seq, position, writer)
            if position >= end:
                waiter = asyncio.ensure_future(self._data.wait())
                pending: list[asyncio.Future[Any]] = [waiter, acks]
                try:  # cancelled here when the server closes: the waiter must not outlive this connection
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                continue
            seg = store.segments.find(position)
            size = min(self._max_frame, seg.end - position, end - position)
            chunk = await loop.run_in_executor(None, store.segments.read, position, size)
            writer.writelines(P.data(seg.base, position - seg.base, chunk))
            await writer.drain()
            position += size
        acks.result()  # the replica went away: end this connection (raises what the reader saw)

    async def _read_acks(self, name: str, reader: asyncio.StreamReader) -> None:
        while True:
            kind, payload = await P.read_frame(reader, 0)
            if kind is P.FrameType.ACK:
                self._gate.on_ack(name, P.parse_ack(payload))
            elif kind is P.FrameType.META_ACK:
                self._meta_acked[name] = P.parse_ack(payload)
            elif kind is P.FrameType.STATE_ACK:
                self._gate.on_state_ack(name, P.parse_ack(payload))
            elif kind is P.FrameType.ERROR:
                raise BadRequest(f"replica {name} reported: {payload.decode(errors='replace')}")
            else:
                raise BadRequest(f"unexpected {kind.name} frame from replica {name}")
