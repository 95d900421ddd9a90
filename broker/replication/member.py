"""A broker process as a member of its group: a replica until elected, the primary until deposed.

```
 join (lease, member key) ─► loop:  leader key?
     someone else ─► REPLICA: a bare MessageStore following it (Replica), until the leader changes
     nobody       ─► campaign with our log end (only in-sync members can win) ─► PRIMARY
     us           ─► PRIMARY: LocalBroker serving, AckGate on its store, ReplicationServer,
                     registered with the NameServers under the group's name, until deposed
                     (term deadline passed, lease lost, leader key not ours, or handed over to
                     another member by a planned switchover: switchover.py) ─► FENCED ─► loop
```

The gRPC service answers through `RoleSwitch`: the `LocalBroker` while primary, a refusal
(`Unavailable`, naming the role) otherwise. Routes carry the group's name, so a failover moves the
group's address in the NameServers and every queue keeps its id. Event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from broker.config import BrokerConfig
from broker.local import BROKER_CFS, LocalBroker
from broker.replication.coordinator import Coordinator, Leader, MemberInfo
from broker.replication.epochs import LocalEpoch
from broker.replication.gate import AckGate
from broker.replication.primary import ReplicationServer
from broker.replication.replica import LogMustChange, Replica, cut_log
from broker.replication.state import snapshot_incomplete
from broker.replication.switchover import hand_over
from broker.store.index import StoreLocked
from broker.store.store import MessageStore
from common import frozen, metrics
from common.errors import NotPrimary, Unavailable
from common.logs import kv

log = logging.getLogger("sluice.replication.member")

STATUS_INTERVAL_S = 1.0
# How long a member retries opening its store while the lock is still held by its last term's calls.
STORE_RELOCK_S = 30.0
# How often a primary past its term deadline looks whether its lease was refreshed after all.
TERM_CHECK_S = 0.05
# How long a term's end waits for the calls it cancelled to finish before the broker closes.
END_TERM_WAIT_S = 5.0

# A registrar's `run(stop)` and `report_now()` (nameserver.client.BrokerRegistrar) for a primary's
# broker, registering only while the term (the second argument) is valid.
RegistrarFactory = Callable[[LocalBroker, Callable[[], bool]], Any]


class RoleSwitch:
    """What the broker's gRPC service calls: the LocalBroker while primary, a refusal otherwise.

    While primary, every call checks the term before it starts and again before it answers: a
    primary paused past its term deadline (SIGSTOP, a stall) must not answer a receive that was
    waiting when it stopped, nor anything else, once a successor may have been elected. When the
    term ends (`end_term`) the calls still running are cancelled and answered with the refusal, and
    waited for, so the broker's store is closed under none of them."""

    def __init__(self, member_name: str, group: str) -> None:
        self.current: LocalBroker | None = None
        self.role = "joining"
        self._member, self._group = member_name, group
        self._term_valid: Callable[[], bool] = lambda: False
        self._calls: set[asyncio.Task[Any]] = set()  # the calls the current broker is serving
        self._ended: set[asyncio.Task[Any]] = set()  # of those, the ones `end_term` cancelled

    def serve(self, broker: LocalBroker, term_valid: Callable[[], bool]) -> None:
        """Answer through `broker` while `term_valid()` holds (and until `end_term`)."""
        self.current, self._term_valid, self.role = broker, term_valid, "primary"

    async def end_term(self, role: str, timeout_s: float = END_TERM_WAIT_S) -> None:
        """Refuse from now on (as `role`), end the calls still running (they answer with the
        refusal) and wait for them, at most `timeout_s`."""
        self.current, self.role = None, role
        for task in self._calls:
            if not task.done():
                self._ended.add(task)
                task.cancel()
        if self._calls:
            await asyncio.wait(list(self._calls), timeout=timeout_s)
        if self._calls:
            log.warning("calls of the ended term still running", extra=kv(calls=len(self._calls)))

    def _refusal(self) -> NotPrimary:
        return NotPrimary(f"broker {self._member} is a {self.role} of group {self._group}, not its primary")

    def __getattr__(self, name: str) -> Any:
        current = self.current
        if current is None:
            if name == "name":
                return self._group

            async def refuse(*_args: object, **_kwargs: object) -> Any:
                raise self._refusal()

            return refuse
        method = getattr(current, name)
        if not inspect.iscoroutinefunction(method):
            return method

        async def call(*args: object, **kwargs: object) -> Any:
            if not self._term_valid():
                raise self._fenced()
            task = asyncio.current_task()
            assert task is not None
            self._calls.add(task)
            try:
                result = await method(*args, **kwargs)
            except asyncio.CancelledError:
                if task not in self._ended:
                    raise  # the caller went away
                result = None
            finally:
                self._calls.discard(task)
            if task in self._ended:  # the term ended under it: its answer is not this term's to give
                self._ended.discard(task)
                task.uncancel()
                raise self._fenced()
            if not self._term_valid() or self.current is not current:
                raise self._fenced()
            return result

        return call

    def _fenced(self) -> NotPrimary:
        return NotPrimary(f"broker {self._member} is a fenced primary of group {self._group}, not its primary")


class GroupMember:
    def __init__(
        self,
        config: BrokerConfig,
        switch: RoleSwitch,
        advertised: str,
        make_registrar: RegistrarFactory | None,
        *,
        token: str = "",
    ) -> None:
        self._cfg = config
        self._repl = config.replication
        self._switch = switch
        self._make_registrar = make_registrar
        self._token = token
        self._repl_port = _pick_port(config.host, self._repl.port)
        self._epoch = LocalEpoch(config.data_dir / "replication")
        # Replicas reach the replication port at the host others reach this broker at, unless told otherwise.
        repl_address = self._repl.advertise or f"{advertised.rpartition(':')[0]}:{self._repl_port}"
        member = MemberInfo(config.name, advertised, repl_address)
        self.coord = Coordinator(
            self._repl.etcd[0],
            config.cluster,
            self._repl.group,
            member,
            lease_ttl_s=self._repl.lease_ttl_s,
            fence_margin_s=self._repl.fence_margin_s,
        )
        self.gate: AckGate | None = None
        self.replica: Replica | None = None
        self.failovers = 0
        self.fenced_writes = 0  # of terms that ended (the current gate counts its own)

    @property
    def _poll_s(self) -> float:
        return self._repl.poll_interval_ms / 1000

    async def run(self, stop: asyncio.Event) -> None:
        """Be a member until `stop`; leaves the group (revoking the lease) on the way out."""
        await self._retry(self.coord.start, stop)
        lease_stop = asyncio.Event()
        unregister = metrics.register_source(self.samples)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.coord.keep_alive(lease_stop), name="etcd-lease")
                try:
                    await self._loop(stop)
                finally:
                    lease_stop.set()
        finally:
            unregister()
            await self.coord.close()

    def samples(self) -> list[metrics.Sample]:
        """Scrape-time metrics of this member (docs/metrics.md)."""
        me, group = (self._cfg.name, self._repl.group), self._repl.group
        gate = self.gate
        fenced = self.fenced_writes + (gate.fenced_writes if gate is not None else 0)
        out: list[metrics.Sample] = [
            (metrics.REPLICATION_PRIMARY, me, 1.0 if self._switch.role == "primary" else 0.0),
            (metrics.REPLICATION_EPOCH, me, float(self._epoch.value)),
            (metrics.REPLICATION_FAILOVERS, me, float(self.failovers)),
            (metrics.REPLICATION_FENCED, me, float(fenced)),
        ]
        if gate is not None and self._switch.role == "primary":
            out.append((metrics.REPLICATION_INSYNC, (group,), float(1 + len(gate.insync))))
            out.extend((metrics.REPLICATION_LAG_BYTES, (group, n), float(gate.lag_bytes(n))) for n in gate.replicas)
        return out

    async def _loop(self, stop: asyncio.Event) -> None:
        store: MessageStore | None = None
        try:
            while not stop.is_set():
                if self.coord.lease_lost:  # our lease expired (a long pause): join again with a new one
                    await self.coord.close()
                    await self._retry(self.coord.start, stop)
                try:
                    leader = await self.coord.leader()
                except Unavailable as exc:
                    log.warning("etcd unreachable", extra=kv(error=exc.message))
                    await _sleep(stop, self._poll_s)
                    continue
                if leader is not None and leader.name != self._cfg.name:
                    store = store or await self._open_store()
                    store = await self._follow(store, leader, stop)
                    continue
                if leader is not None:  # our own key from a previous run: it expires with that lease
                    await _sleep(stop, self._poll_s)
                    continue
                store = store or await self._open_store()
                won = await self._campaign(store)
                if won is None:
                    await _sleep(stop, self._poll_s)
                    continue
                await _in_executor(store.close)
                store = None
                await self._lead(won, stop)
        finally:
            if store is not None:
                await _in_executor(store.close)

    async def _campaign(self, store: MessageStore) -> Leader | None:
        if snapshot_incomplete(store.index):
            log.warning("not campaigning: this member's replicated state is a partly applied snapshot")
            return None
        try:
            return await self.coord.campaign(store.writer.written_position)
        except Unavailable as exc:
            log.warning("campaign failed", extra=kv(error=exc.message))
            return None

    # -- replica -----------------------------------------------------------------------------------

    async def _open_store(self) -> MessageStore:
        """Open the data directory's store. The store this process closed last (a term's, or the
        replica's) is garbage in reference cycles that may have been frozen out of the collector
        at startup (common/frozen.py): collected first, or its handles would keep RocksDB's lock.
        A call of the last term still running past `END_TERM_WAIT_S` may hold the lock a little
        longer: retried for `STORE_RELOCK_S`; a lock held longer (another process) is an error."""
        cfg = self._cfg
        await _in_executor(frozen.collect_frozen)
        deadline = time.monotonic() + STORE_RELOCK_S
        while True:
            try:
                return await _in_executor(lambda: MessageStore(cfg.data_dir, cfg.store, extra_cfs=BROKER_CFS))
            except StoreLocked:
                if time.monotonic() >= deadline:
                    raise
                log.info("store still locked by calls of the last term; retrying", extra=kv(data_dir=str(cfg.data_dir)))
                await _in_executor(frozen.collect_frozen)  # an ended call's reference cycles go now
                await asyncio.sleep(0.2)

    async def _follow(self, store: MessageStore, leader: Leader, stop: asyncio.Event) -> MessageStore:
        """Copy from `leader` until it is no longer the leader (or `stop`); returns the open store."""
        self._switch.role = "replica"
        replica = self.replica = Replica(
            store, self._epoch, group=self._repl.group, name=self._cfg.name,
            max_frame_bytes=self._repl.max_frame_bytes, token=self._token,
        )  # fmt: skip
        changed = asyncio.Event()
        watcher = asyncio.create_task(self._watch_leader(leader, stop, changed))
        dial = self._repl.dial.get(leader.name)  # this member's own path to that primary, if set
        target = dataclasses.replace(leader, repl_address=dial) if dial else leader
        try:
            while not changed.is_set():
                try:
                    await replica.follow(target, changed)
                except LogMustChange as exc:
                    await _in_executor(store.close)
                    await _in_executor(functools.partial(cut_log, self._cfg.data_dir, exc.to_offset, exc.min_offset))
                    store = await self._open_store()
                    replica = self.replica = Replica(
                        store, self._epoch, group=self._repl.group, name=self._cfg.name,
                        max_frame_bytes=self._repl.max_frame_bytes, token=self._token,
                    )  # fmt: skip
                    continue
                except Unavailable as exc:
                    log.info("not following the primary", extra=kv(primary=leader.name, reason=exc.message))
                await _sleep(changed, self._poll_s)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        return store

    async def _watch_leader(self, leader: Leader, stop: asyncio.Event, changed: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Unavailable):
                if self.coord.lease_lost:
                    # Stalled past the TTL (a starved process, a long pause): the member key went
                    # with the lease. Join again and go on following; the stream needs no lease.
                    log.warning("lease lost while following: joining again", extra=kv(primary=leader.name))
                    await self.coord.start()
                if await self.coord.leader() != leader:
                    break
            await _sleep(stop, self._poll_s)
        changed.set()

    # -- primary -----------------------------------------------------------------------------------

    async def _lead(self, leader: Leader, stop: asyncio.Event) -> None:
        """Serve as primary of `leader`'s epoch until deposed or `stop`."""
        self._epoch.set(leader.epoch)
        self.failovers += 1 if leader.epoch > 1 else 0
        insync, _ = await self.coord.insync()
        gate = self.gate = AckGate(self._repl, self.coord, leader, insync.members if insync else (leader.name,))
        term_over = asyncio.Event()
        server: ReplicationServer | None = None
        registrar: Any = None
        reporting = False  # while serving: before, the registrar's first heartbeat has every topic

        async def topics_changed() -> None:
            if not reporting or server is None:
                return  # not serving yet, or fenced: the successor reports the group's topics
            # Replicas first: a route must not lead to a topic a successor would not know.
            await server.sync_metadata(self._repl.max_lag_ms / 1000)
            if registrar is not None:
                await registrar.report_now()

        # The gate is the store's durability: what started before the first replica connects is
        # in its snapshot (the store records replicated state from the moment it opens). Pop
        # entries get versions of this term: a handle of an earlier primary for an offset this one
        # reused (its message never got here) matches no entry (popstate.first_version).
        broker = LocalBroker(dataclasses.replace(self._cfg, name=self._repl.group), term=leader.epoch,
                             term_valid=self.coord.term_valid, durability=gate,
                             on_topics_changed=topics_changed)  # fmt: skip
        await _in_executor(frozen.collect_frozen)  # the store `_loop` just closed (`_open_store`)
        await broker.start()
        store = broker.store
        server = ReplicationServer(
            store, gate, self.coord.epochs, group=self._repl.group,
            max_frame_bytes=self._repl.max_frame_bytes, token=self._token,
        )  # fmt: skip
        try:
            await server.start(self._cfg.host, self._repl_port)
            reporting = True
            self._switch.serve(broker, self.coord.term_valid)
            # Registered only while the term is valid: a primary woken from a pause past its term
            # must not route the group back to itself over its successor (BrokerRegistrar).
            registrar = self._make_registrar(broker, self.coord.term_valid) if self._make_registrar else None
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(gate.maintain(term_over), name="in-sync-set")
                tasks.create_task(self._publish_status(gate, term_over), name="group-status")
                if registrar is not None:
                    tasks.create_task(registrar.run(term_over), name="broker-registrar")
                await self._hold_term(gate, leader, stop)
                # Fenced: refuse at once, then stop serving and leave the NameServers.
                await self._switch.end_term("fenced primary")
                reporting = False
                term_over.set()
        finally:
            await self._switch.end_term(self._switch.role)  # no call of the term runs when the store closes
            term_over.set()
            await server.close()
            await broker.close()
            self.fenced_writes += gate.fenced_writes
            self.gate = None
            if not stop.is_set():
                with contextlib.suppress(Unavailable):
                    await self.coord.resign(leader)

    async def _publish_status(self, gate: AckGate, stop: asyncio.Event) -> None:
        """The primary's view of its replicas, in etcd every second (read by `sluice admin broker list`)."""
        while not stop.is_set():
            now, end = time.monotonic(), gate.log_end
            replicas = {
                name: {
                    "in_sync": name in gate.insync,
                    "lag_bytes": gate.lag_bytes(name),
                    "lag_s": 0.0 if gate.lag_bytes(name) == 0 else round(now - state.caught_up_at, 3),
                }
                for name, state in gate.replicas.items()
            }
            status = {"primary": gate.leader.name, "epoch": gate.leader.epoch, "log_end": end, "replicas": replicas}
            with contextlib.suppress(Unavailable):
                await self.coord.put_status(status)
            await _sleep(stop, STATUS_INTERVAL_S)

    async def _hold_term(self, gate: AckGate, leader: Leader, stop: asyncio.Event) -> None:
        """Serve until the term ends. Past the term deadline without word from etcd (a paused or
        unreachable coordinator) the primary refuses everything (the gate and `RoleSwitch` check
        the deadline) but keeps its term while it may still be its: a refresh etcd answers with
        the lease alive proves the leader key is still ours (nobody could have been elected), and
        the term goes on. It ends when etcd says the lease expired, or one refresh interval after
        the earliest time etcd may expire the lease (the deadline + the fence margin): a pause of
        the coordinator shorter than the lease costs the primary nothing but those refusals."""
        while not stop.is_set():
            if gate.deposed or self.coord.lease_lost:
                log.warning("term over: fenced", extra=kv(member=leader.name, epoch=leader.epoch))
                return
            if not self.coord.term_valid():
                hold_s = self._repl.fence_margin_s + self._repl.lease_ttl_s / 3  # etcd's expiry + a refresh
                if time.monotonic() >= self.coord.term_deadline + hold_s:
                    log.warning("term over: fenced", extra=kv(member=leader.name, epoch=leader.epoch))
                    return
                await _sleep(stop, TERM_CHECK_S)  # refusing meanwhile: the lease may yet be refreshed
                continue
            try:
                current = await self.coord.leader()
                request = await self.coord.switchover_request()
            except Unavailable:
                current, request = leader, None  # etcd unreachable: serve until the term deadline says otherwise
            if current != leader:
                log.warning("leader key is no longer ours: fenced", extra=kv(member=leader.name, epoch=leader.epoch))
                return
            if request is not None and "error" not in request and request.get("to") != leader.name:
                with contextlib.suppress(Unavailable):
                    if await hand_over(gate, self.coord, leader, request, self._repl.max_lag_ms / 1000):
                        return
                if gate.deposed:
                    return
            await _sleep(stop, self._poll_s)
        if stop.is_set():  # a clean shutdown hands the group over at once instead of after the TTL
            with contextlib.suppress(Unavailable):
                await self.coord.resign(leader)

    async def _retry(self, call: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
        while True:
            try:
                await call()
                return
            except Unavailable as exc:
                if stop.is_set():
                    raise
                log.warning("etcd unreachable; retrying", extra=kv(error=exc.message))
                await _sleep(stop, 1.0)


def _pick_port(host: str, port: int) -> int:
    """`port`, or a free one when 0 (kept for the process's life: published in etcd once)."""
    if port:
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _in_executor(fn: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn)
