"""The primary's acknowledgement gate and in-sync set (docs/replication.md).

`wait(end)` returns once every member of the in-sync set holds the log up to `end` and the set
(the primary included) has at least `min_insync` members; it raises `Unavailable` (retriable) at
once when the set is too small, when this member's term is over (fenced), or when the set shrinks
below the minimum while waiting. `wait_state()` does the same for the replicated consumer state:
it returns once every in-sync member applied every state change made so far (an ack, an offset
commit, a timer or half message indexed by a send). A replica is caught up (for joining the set,
and for its time lag) only when it holds both the log end and the latest state change.

The in-sync set changes only in `maintain()`: a replica too far behind (bytes) or not caught up for
too long leaves it **in etcd first, then here** (acknowledgements never stop waiting for a member
that is still eligible for election); a replica that reached the log end joins it **here first,
then in etcd** (it is never eligible before acknowledgements wait for it). A replica that keeps a
write waiting for `stall_ms` while the rest of the set (at least `min_insync` with the primary)
holds it (killed, cut off, paused) leaves the same way, at once instead of after `max_lag_ms`.

Event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.replication.config import ReplicationConfig
from broker.replication.coordinator import Coordinator, Leader
from broker.replication.state import REPLICATED_CFS
from broker.store.index import Index
from broker.store.statelog import StateRecorder
from common.errors import NotPrimary, TooFewInSync, Unavailable
from common.logs import kv

log = logging.getLogger("sluice.replication.gate")

MAINTAIN_INTERVAL_S = 0.1


@dataclass
class ReplicaState:
    name: str
    acked: int = 0  # the replica's log end under its flush policy
    state_acked: int = 0  # the last state change the replica applied
    state_synced: bool = False  # it acknowledged this term's state (a snapshot, then changes) at least once
    caught_up_at: float = 0.0  # monotonic time it was last seen at the primary's log end
    connected: bool = False


class AckGate:
    def __init__(
        self,
        config: ReplicationConfig,
        coordinator: Coordinator,
        leader: Leader,
        insync: tuple[str, ...],
        log_end: Callable[[], int] = lambda: 0,
        *,
        state_seq: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`log_end`, `state_seq`: the primary's log end and latest state change; the store sets
        both when it opens with this gate as its durability (`attach`)."""
        self._cfg = config
        self._coord = coordinator
        self.leader = leader
        self._log_end = log_end
        self._state_seq = state_seq
        self._clock = clock
        now = clock()
        # Members etcd lists as in sync are eligible for election: acknowledgements wait for them
        # until they are removed (in etcd first), connected or not.
        self.insync: set[str] = {m for m in insync if m != leader.name}
        self.replicas: dict[str, ReplicaState] = {m: ReplicaState(m, caught_up_at=now) for m in self.insync}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._state_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._since: dict[int, float] = {}  # waiter seq -> when it began waiting
        self._seq = itertools.count()
        self.deposed = False
        self.fenced_writes = 0
        self.draining = ""  # why new writes are refused (a planned switchover), or empty
        self._state_held = -1  # `acked_state`

    # -- the store's durability (broker/store/durability.py) ---------------------------------------

    replicated = True

    def attach(self, index: Index, written_position: Callable[[], int]) -> StateRecorder:
        """Called by the store as it opens: from now on its replicated column families' changes are
        numbered (statelog.py) and the gate measures the replicas against its log end."""
        handles = {cf: index.handle(cf) for cf in REPLICATED_CFS}
        recorder = StateRecorder(REPLICATED_CFS, handles, written_position, self._cfg.max_lag_bytes)
        self._log_end, self._state_seq = written_position, lambda: recorder.seq
        return recorder

    def acked_position(self) -> int:
        return self.acked_end()

    def acked_state(self) -> int:
        """The latest state change every in-sync member holds, counted only while the set has
        `min_insync` members (what `wait_state` acknowledges); it never goes back. -1 until every
        in-sync member has acknowledged this term's state once (its snapshot): until then not even
        the state the term began with is known to be held (an ack its predecessor applied may have
        reached this member only)."""
        if 1 + len(self.insync) >= self._cfg.min_insync:
            replicas = self.replicas
            if all(replicas[m].state_synced for m in self.insync):
                held = min((replicas[m].state_acked for m in self.insync), default=self._state_seq())
                if held > self._state_held:
                    self._state_held = held
        return self._state_held

    # -- acknowledgements --------------------------------------------------------------------------

    async def wait(self, end: int) -> None:
        """Return once the write ending at `end` may be acknowledged (see the module doc)."""
        self._check()
        if not self._held(end):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            await self._park(self._waiters, end, fut)
        self._check()  # the term may have ended while waiting (a pause, a lost lease)

    async def wait_state(self) -> None:
        """Return once every in-sync member holds every state change made so far."""
        self._check()
        seq = self._state_seq()
        if not all(self.replicas[m].state_acked >= seq for m in self.insync):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            await self._park(self._state_waiters, seq, fut)
        self._check()

    async def _park(
        self, heap: list[tuple[int, int, asyncio.Future[None]]], at: int, fut: asyncio.Future[None]
    ) -> None:
        n = next(self._seq)
        heapq.heappush(heap, (at, n, fut))
        self._since[n] = self._clock()
        try:
            await fut
        finally:
            del self._since[n]

    def _stalling(self, now: float) -> set[str]:
        """In-sync replicas that have kept a write (or a state change) waiting for `stall_ms`."""
        limit = now - self._cfg.stall_ms / 1000
        replicas, since = self.replicas, self._since
        out: set[str] = set()
        for heap, acked in ((self._waiters, "acked"), (self._state_waiters, "state_acked")):
            for at, n, fut in heap:
                if not fut.done() and since.get(n, now) <= limit:
                    out |= {m for m in self.insync if getattr(replicas[m], acked) < at}
        return out

    def admit(self) -> None:
        """Refuse (Unavailable) a write that `wait` would refuse, before it is written."""
        self._check()

    def _check(self) -> None:
        if self.draining:
            raise NotPrimary(self.draining)
        if self.deposed or not self._coord.term_valid():
            self.fenced_writes += 1
            raise NotPrimary(
                f"broker {self.leader.name} is no longer the primary of group {self._coord.group} "
                f"(epoch {self.leader.epoch} ended)"
            )
        have = 1 + len(self.insync)
        if have < self._cfg.min_insync:
            raise TooFewInSync(
                f"group {self._coord.group} has {have} member(s) in sync, fewer than min_insync "
                f"{self._cfg.min_insync}; the write was not stored durably enough"
            )

    def _held(self, end: int) -> bool:
        replicas = self.replicas
        return all(replicas[m].acked >= end for m in self.insync)

    def _release(self) -> None:
        replicas, insync = self.replicas, self.insync
        _release_upto(self._waiters, min((replicas[m].acked for m in insync), default=None))
        _release_upto(self._state_waiters, min((replicas[m].state_acked for m in insync), default=None))

    def _fail_all(self, error: Unavailable) -> None:
        waiters = self._waiters + self._state_waiters
        self._waiters, self._state_waiters = [], []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(type(error)(error.message))  # one instance per waiter

    # -- replicas ----------------------------------------------------------------------------------

    def connected(self, name: str) -> ReplicaState:
        state = self.replicas.setdefault(name, ReplicaState(name, caught_up_at=self._clock()))
        state.connected = True
        return state

    def disconnected(self, name: str) -> None:
        state = self.replicas.get(name)
        if state is not None:
            state.connected = False

    def on_ack(self, name: str, position: int) -> None:
        state = self.replicas[name]
        state.acked = max(state.acked, position)
        self._acked(name, state)

    def on_state_ack(self, name: str, seq: int) -> None:
        state = self.replicas[name]
        state.state_acked = max(state.state_acked, seq)
        state.state_synced = True
        self._acked(name, state)

    def _acked(self, name: str, state: ReplicaState) -> None:
        if self._caught_up(state, self._log_end()):
            state.caught_up_at = self._clock()
        if name in self.insync:
            self._release()

    def caught_up(self, name: str) -> bool:
        """Whether replica `name` holds the log end and the latest state change."""
        state = self.replicas.get(name)
        return state is not None and self._caught_up(state, self._log_end())

    def _caught_up(self, state: ReplicaState, end: int) -> bool:
        return state.acked >= end and state.state_acked >= self._state_seq()

    def acked_end(self) -> int:
        """The log position every in-sync member holds (capped by this member's own log end): a
        write below it survives any failover this gate allows."""
        replicas = self.replicas
        return min([self._log_end(), *(replicas[m].acked for m in self.insync)])

    @property
    def log_end(self) -> int:
        return self._log_end()

    def lag_bytes(self, name: str) -> int:
        state = self.replicas.get(name)
        return max(0, self._log_end() - (state.acked if state else 0))

    # -- the in-sync set ---------------------------------------------------------------------------

    async def maintain(self, stop: asyncio.Event) -> None:
        """Keep the in-sync set (and etcd's copy) true to the replicas' lag until `stop`."""
        # Lag is measured from when the term starts serving: the gate exists from the moment the
        # store opens (it is the store's durability), and the broker's start (recovery, loading
        # its state) is no replica's delay.
        now = self._clock()
        for state in self.replicas.values():
            state.caught_up_at = max(state.caught_up_at, now)
        while not stop.is_set() and not self.deposed:
            try:
                await self.maintain_once()
            except Unavailable as exc:  # etcd unreachable: keep waiting for everyone; the term runs out
                log.warning("could not update the in-sync set", extra=kv(error=exc.message))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), MAINTAIN_INTERVAL_S)
        if self.deposed:
            self._fail_all(
                NotPrimary(f"broker {self.leader.name} is no longer the primary of group {self._coord.group}")
            )

    async def maintain_once(self) -> None:
        now, end = self._clock(), self._log_end()
        max_lag_s = self._cfg.max_lag_ms / 1000
        for state in self.replicas.values():
            if self._caught_up(state, end):
                state.caught_up_at = now
        behind = {
            m
            for m in self.insync
            if end - self.replicas[m].acked > self._cfg.max_lag_bytes or now - self.replicas[m].caught_up_at > max_lag_s
        }
        stalling = self._stalling(now) - behind
        if stalling and 1 + len(self.insync - behind - stalling) >= self._cfg.min_insync:
            behind |= stalling  # the others hold what waits: let it through now, not after max_lag_ms
        if behind:
            await self._publish(self.insync - behind)  # etcd first: they stop being eligible
            self.insync -= behind
            log.warning(
                "replicas left the in-sync set", extra=kv(group=self._coord.group, members=",".join(sorted(behind)))
            )
            if 1 + len(self.insync) < self._cfg.min_insync:
                self._fail_all(TooFewInSync(f"group {self._coord.group} fell below min_insync {self._cfg.min_insync}"))
            else:
                self._release()
        caught_up = {
            m for m, s in self.replicas.items() if m not in self.insync and s.connected and self._caught_up(s, end)
        }
        if caught_up:
            self.insync |= caught_up  # here first: acknowledgements wait for them before they are eligible
            await self._publish(self.insync)
            log.info(
                "replicas joined the in-sync set",
                extra=kv(group=self._coord.group, members=",".join(sorted(caught_up))),
            )

    async def _publish(self, members: set[str]) -> None:
        if not await self._coord.set_insync(self.leader, sorted(members)):
            self.deposed = True
            raise Unavailable(f"broker {self.leader.name} lost the leader key of group {self._coord.group}")


def _release_upto(waiters: list[tuple[int, int, asyncio.Future[None]]], floor: int | None) -> None:
    """Resolve the waiters (a heap) up to `floor`; every one when None (no replica to wait for)."""
    while waiters and (floor is None or waiters[0][0] <= floor):
        fut = heapq.heappop(waiters)[2]
        if not fut.done():
            fut.set_result(None)


def _names(members: set[str]) -> str:
    return ",".join(sorted(members))
