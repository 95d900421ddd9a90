"""A replica: follows its group's primary, copying the CommitLog byte for byte at the same offsets.

`Replica.follow(leader)` connects, says where its log ends and which epoch it last held, and gets
START: if the primary wants its log to end elsewhere (a divergent tail to drop, or a gap retention
left on the primary), `follow` raises `LogMustChange` and the caller closes the store, runs
`cut_log`, reopens it and follows again (recovery then trims the indexes to the shortened log).
Otherwise it records the primary's epoch as its own and copies DATA through
`MessageStore.append_copy` (whole records only; a record split across frames waits for its rest),
acknowledging its new log end as pieces are written (several in flight: `COPY_PIPELINE_DEPTH`;
a STATE frame waits until those are written). META frames (after any META_PART pieces of the
same payload) replace its topic and group metadata;
STATE frames (a snapshot, then each change in order) update its consumer state (state.py), each
acknowledged with STATE_ACK once written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from broker.replication import protocol as P
from broker.replication.coordinator import Leader
from broker.replication.epochs import LocalEpoch
from broker.replication.primary import apply_metadata
from broker.replication.state import StateApplier
from broker.store.segments import SegmentSet
from broker.store.store import MessageStore
from common.errors import BadRequest, Unavailable
from common.logs import kv
from common.record import HEADER_SIZE, peek_size

log = logging.getLogger("sluice.replication.replica")

CONNECT_TIMEOUT_S = 3.0
# Copied pieces (DATA frames, at most max_frame_bytes each) in flight to the store's writer at once.
COPY_PIPELINE_DEPTH = 4


class LogMustChange(Exception):
    """The log must end at `to_offset` before following (`cut_log`); `min_offset` is the oldest
    offset the primary still stores."""

    def __init__(self, to_offset: int, min_offset: int) -> None:
        super().__init__(f"the log must end at {to_offset} (primary keeps from {min_offset})")
        self.to_offset, self.min_offset = to_offset, min_offset


class Replica:
    def __init__(
        self,
        store: MessageStore,
        epoch: LocalEpoch,
        *,
        group: str,
        name: str,
        max_frame_bytes: int,
        token: str = "",
    ) -> None:
        self._store = store
        self._epoch = epoch
        self._group = group
        self._name = name
        self._max_frame = max_frame_bytes
        self._token = token
        self._state = StateApplier(store.index, max_frame_bytes)

    async def follow(self, leader: Leader, stop: asyncio.Event) -> None:
        """Copy from `leader` until `stop` or the connection ends (raises Unavailable then)."""
        host, _, port = leader.repl_address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot reach primary {leader.name} at {leader.repl_address}: {exc}") from None
        try:
            await self._session(leader, reader, writer, stop)
        except (asyncio.IncompleteReadError, OSError) as exc:  # OSError: a lost connection, or no START in time
            raise Unavailable(f"the stream from primary {leader.name} ended ({type(exc).__name__})") from None
        except BadRequest as exc:
            # A frame this replica cannot take (versions of two releases, a bug): nothing of it was
            # applied. The connection ends and the member tries again, rather than the process.
            log.error("malformed replication stream; reconnecting", extra=kv(primary=leader.name, error=exc.message))
            raise Unavailable(
                f"primary {leader.name} sent a frame this replica cannot apply ({exc.message}); check that both "
                "run the same Sluice release"
            ) from None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _session(
        self, leader: Leader, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stop: asyncio.Event
    ) -> None:
        store = self._store
        self._state = StateApplier(store.index, self._max_frame)  # a new connection starts with a new snapshot
        end = store.writer.written_position
        hello = {"group": self._group, "name": self._name, "epoch": self._epoch.value, "log_end": end}
        if self._token:
            hello["token"] = self._token
        await _send(writer, P.control(P.FrameType.HELLO, hello))
        kind, payload = await asyncio.wait_for(P.read_frame(reader, self._max_frame), CONNECT_TIMEOUT_S)
        if kind is P.FrameType.ERROR:
            raise Unavailable(f"primary {leader.name} refused: {payload.decode(errors='replace')}")
        if kind is not P.FrameType.START:
            raise BadRequest(f"primary {leader.name} answered {kind.name}, not START")
        start = P.parse_control(payload, "epoch", "from_offset", "min_offset")
        if int(start["from_offset"]) != end:
            raise LogMustChange(int(start["from_offset"]), int(start["min_offset"]))
        if int(start["epoch"]) > self._epoch.value:
            self._epoch.set(int(start["epoch"]))  # the log now agrees with that epoch's history
        log.info("following primary", extra=kv(primary=leader.name, epoch=start["epoch"], from_position=end))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await self._copy(reader, writer, stopped)
        finally:
            stopped.cancel()

    async def _copy(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stopped: asyncio.Future[Any]
    ) -> None:
        store = self._store
        carry = bytearray()  # the start of a record whose rest is in the next frame
        carry_at = (0, 0)  # (segment base, position) where `carry` begins
        meta_parts = bytearray()  # the leading pieces of a META payload larger than a frame
        # Copies handed to the store's writer and not yet acknowledged, oldest first: the next
        # frame is read and verified while earlier ones are written (the writer joins queued
        # copies into one write and one dispatch).
        copies = _Copies()
        acker = asyncio.ensure_future(self._ack_copies(copies, writer))
        try:
            while True:
                frame = asyncio.ensure_future(P.read_frame(reader, self._max_frame))
                pending: list[asyncio.Future[Any]] = [frame, stopped, acker]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if acker.done():
                    frame.cancel()
                    acker.result()  # raises what ended it
                if not frame.done():
                    frame.cancel()
                    return
                kind, payload = frame.result()
                if kind is P.FrameType.META_PART:
                    meta_parts += payload
                    continue
                if kind is P.FrameType.META:
                    document = bytes(meta_parts + payload) if meta_parts else payload
                    meta_parts.clear()
                    await _send(writer, P.meta_ack(apply_metadata(store, document)))
                    continue
                if kind is P.FrameType.STATE:
                    await copies.drained(acker)  # a change never lands before the data it refers to
                    applied = self._state.apply(payload)
                    if applied is not None:
                        await _send(writer, P.state_ack(applied))
                    continue
                if kind is P.FrameType.ERROR:
                    raise Unavailable(f"primary ended the stream: {payload.decode(errors='replace')}")
                if kind is not P.FrameType.DATA:
                    raise BadRequest(f"unexpected {kind.name} frame from the primary")
                base, position, chunk = P.parse_data(payload)
                if carry:
                    if (base, position) != (carry_at[0], carry_at[1] + len(carry)):
                        raise BadRequest("the primary's data does not continue where the last frame ended")
                    carry += chunk
                    data: bytes | bytearray | memoryview = carry
                    base, position = carry_at
                else:
                    data = chunk
                whole = _whole_records(data)
                if whole:
                    piece = data[:whole] if isinstance(data, memoryview) else bytes(data[:whole])
                    await copies.room(acker)
                    copies.add(store.append_copy(base, position, piece))
                carry = bytearray(data[whole:])
                carry_at = (base, position + whole)
        finally:
            acker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await acker
            # Copies already handed over are written all the same: the next session must start
            # from the log end they leave (its HELLO names it), not from before them.
            await copies.settled()

    async def _ack_copies(self, copies: _Copies, writer: asyncio.StreamWriter) -> None:
        """Acknowledge copies as they are written: one ACK (the log end) for all that are done."""
        while True:
            await copies.written()
            await _send(writer, P.ack(self._store.writer.written_position))


class _Copies:
    """A replica's copies in flight, oldest first (event loop only). Who waits for a change
    registers a future before yielding (`_next_change`), so no change between its check and its
    wait can be missed."""

    def __init__(self) -> None:
        self._futures: collections.deque[asyncio.Future[object]] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []

    def _changed(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _next_change(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def add(self, fut: asyncio.Future[object]) -> None:
        self._futures.append(fut)
        self._changed()

    async def written(self) -> None:
        """Wait for the oldest copy, then drop every finished one (raises a failed copy's error)."""
        while not self._futures:
            await self._next_change()
        await asyncio.shield(self._futures[0])  # cancelling the acknowledging leaves the copy alone
        while self._futures and self._futures[0].done():
            self._futures.popleft().result()
        self._changed()

    async def settled(self) -> None:
        """Wait until the writer is done with every copy handed over (written or failed)."""
        if self._futures:
            await asyncio.wait(list(self._futures))

    async def room(self, acker: asyncio.Future[None]) -> None:
        """Wait until fewer than COPY_PIPELINE_DEPTH copies are in flight."""
        await self._until(lambda: len(self._futures) < COPY_PIPELINE_DEPTH, acker)

    async def drained(self, acker: asyncio.Future[None]) -> None:
        """Wait until every copy handed over is written."""
        await self._until(lambda: not self._futures, acker)

    async def _until(self, ready: Callable[[], bool], acker: asyncio.Future[None]) -> None:
        while not ready():
            changed = self._next_change()
            waiting: list[asyncio.Future[Any]] = [changed, acker]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if acker.done():
                acker.result()  # raises what ended the acknowledging
                raise ConnectionResetError("the replica stopped acknowledging")


async def _send(writer: asyncio.StreamWriter, frames: Iterable[bytes | bytearray | memoryview]) -> None:
    """Write frames to the primary. A connection that closed meanwhile (the primary went away while
    a copy was being stored) is a ConnectionResetError, which ends the session like any lost
    connection; uvloop's transport would raise RuntimeError for the write."""
    if writer.is_closing():
        raise ConnectionResetError("the connection to the primary is closed")
    writer.writelines(frames)
    await writer.drain()


def _whole_records(data: bytes | bytearray | memoryview) -> int:
    """How many leading bytes of `data` are whole records."""
    at, end = 0, len(data)
    while end - at >= HEADER_SIZE:
        size = peek_size(data, at)[0]
        if size < HEADER_SIZE or size > end - at:
            break
        at += size
    return at


def cut_log(data_dir: Path, to_offset: int, min_offset: int) -> None:
    """Make the (closed) store's CommitLog end at `to_offset`: drop what lies beyond, or, when the
    log and the primary's no longer overlap, start over empty at `to_offset` (a segment base on the
    primary). The next open trims the indexes to match (recovery: the index is ahead of the log)."""
    segments = SegmentSet(data_dir / "commitlog")
    try:
        end, first = segments.max_offset(), segments.min_offset()
        restart = to_offset > end or to_offset < first
        if not restart and to_offset < end:
            seg = segments.find(to_offset)
            segments.remove_after(seg)
            segments.truncate(seg, to_offset - seg.base)
    finally:
        segments.close()
    if restart:
        log.warning("replica log starts over", extra=kv(data_dir=str(data_dir), at=to_offset))
        shutil.rmtree(data_dir / "commitlog", ignore_errors=True)
        shutil.rmtree(data_dir / "index", ignore_errors=True)
        fresh = SegmentSet(data_dir / "commitlog")
        fresh.create(to_offset)
        fresh.close()
    else:
        log.warning(
            "replica log truncated", extra=kv(data_dir=str(data_dir), to_position=to_offset, dropped=end - to_offset)
        )
