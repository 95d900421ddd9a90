"""A broker group's coordination, kept in etcd: membership, leases, election, epochs, in-sync set.

Keys under `/sluice/<cluster>/groups/<group>/` (docs/replication.md):

| key | value | lifetime |
|---|---|---|
| `members/<name>` | JSON `MemberInfo` | this member's lease |
| `leader` | JSON `Leader` | the primary's lease |
| `epochs/<number, 20 digits>` | JSON {name, start_offset} | permanent |
| `insync` | JSON {epoch, members} | permanent; written by that epoch's primary only |
| `status` | JSON {primary, epoch, log_end, replicas: {name: {in_sync, lag_bytes, lag_s}}} | the primary's lease |
| `switchover` | JSON {to, error?}: a planned switchover asked for (switchover.py) | until done or refused |

Invariants: exactly one `leader` at a time (created only if absent, in one transaction with the
next epoch); a leader is only ever created by a member of the latest `insync` set (or, in a group
with none yet, by anyone); `insync` changes only through a transaction that checks the writer is
the current leader of that epoch.

Fencing: `term_valid()` is true while the time the last lease refresh was *sent*, plus the TTL
minus `fence_margin_s`, lies ahead (monotonic clock). etcd expires the lease no earlier than a TTL
after it *received* that refresh, so a successor cannot exist while `term_valid()` holds.

All calls run on the event loop; etcd failures raise `Unavailable` (retriable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import aetcd
import aetcd.exceptions

from broker.replication.epochs import Epoch
from common.errors import Unavailable
from common.logs import kv

log = logging.getLogger("sluice.replication.coordinator")

# How soon a failed lease refresh is tried again.
REFRESH_RETRY_S = 0.1


@dataclass(frozen=True)
class MemberInfo:
    name: str
    address: str  # the broker's internal gRPC address
    repl_address: str  # where replicas fetch from it when it is primary


@dataclass(frozen=True)
class Leader:
    name: str
    epoch: int
    start_offset: int
    address: str
    repl_address: str


@dataclass(frozen=True)
class InSync:
    epoch: int
    members: tuple[str, ...]


def parse_endpoint(url: str) -> tuple[str, int]:
    """`http://host:port` (or `host:port`) -> (host, port); ValueError for anything else."""
    rest = url.split("://", 1)[1] if "://" in url else url
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {url!r} is not http://host:port")
    return host, int(port)


class Coordinator:
    """One member's view of its group in etcd. `start()` joins, `close()` leaves (revokes the lease)."""

    def __init__(
        self,
        endpoint: str,
        cluster: str,
        group: str,
        member: MemberInfo,
        *,
        lease_ttl_s: int,
        fence_margin_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        host, port = parse_endpoint(endpoint)
        # Every call gets a deadline well inside the lease, so a dead etcd shows up before the term ends.
        self._client = aetcd.Client(host=host, port=port, timeout=max(1, lease_ttl_s // 3))
        self._prefix = f"/sluice/{cluster}/groups/{group}/".encode()
        self.member = member
        self.group = group
        self._ttl_s = lease_ttl_s
        self._margin_s = fence_margin_s
        self._clock = clock
        self._lease: Any = None
        self._deadline = 0.0  # monotonic time until which this member's lease is surely alive
        self.lease_lost = False

    # -- keys --------------------------------------------------------------------------------------

    def _key(self, *parts: str) -> bytes:
        return self._prefix + "/".join(parts).encode()

    @property
    def _leader_key(self) -> bytes:
        return self._key("leader")

    @property
    def _insync_key(self) -> bytes:
        return self._key("insync")

    # -- lifecycle and lease -----------------------------------------------------------------------

    async def start(self) -> None:
        """Take a lease and publish this member (raises Unavailable when etcd cannot be reached)."""
        key = self._key("members", self.member.name)
        tx = self._client.transactions
        async with self._etcd("join the group"):
            # A member's name is its identity in the group: taken only while no live lease holds
            # it (a restarted member waits out its previous lease, at most one TTL). Nothing
            # refreshes the new lease before this returns, so each attempt refreshes it first: a
            # member that waited out most of a TTL must not join on a lease about to expire.
            for _ in range(self._ttl_s * 4 + 4):
                await self._fresh_lease()
                put = tx.put(key, dump_record(asdict(self.member)), lease=self._lease)
                joined, _ = await self._client.transaction(compare=[tx.create(key) == 0], success=[put], failure=[])
                if joined:
                    break
                await asyncio.sleep(0.5)
            else:
                raise Unavailable(f"another live member of group {self.group} is named {self.member.name}")
            self.lease_lost = False  # a new lease: keep_alive refreshes it, and this member may lead again
        log.info("joined broker group", extra=kv(group=self.group, member=self.member.name, lease_ttl_s=self._ttl_s))

    async def _fresh_lease(self) -> None:
        """Refresh the lease being joined with (a new one when there is none or it expired), so a
        whole TTL lies ahead."""
        sent = self._clock()
        if self._lease is not None:
            reply = await self._client.refresh_lease(self._lease.id)
            if reply is not None and reply.TTL > 0:
                self._deadline = sent + reply.TTL - self._margin_s
                return
        self._lease = await self._client.lease(self._ttl_s)
        self._deadline = sent + self._ttl_s - self._margin_s

    async def close(self) -> None:
        """Revoke the lease (the member key and a leader key held by it vanish at once), then disconnect."""
        if self._lease is not None:
            try:
                await self._client.revoke_lease(self._lease.id)
            except aetcd.exceptions.ClientError as exc:
                log.warning("could not revoke the lease; it expires by itself", extra=kv(error=str(exc)))
            self._lease = None
        self._deadline = 0.0
        await self._client.close()

    async def refresh(self) -> bool:
        """Refresh the lease once; False (and `lease_lost`) when etcd says it expired. Raises
        Unavailable when etcd cannot be reached (the term deadline then simply runs out)."""
        assert self._lease is not None, "start() first"
        sent = self._clock()
        async with self._etcd("refresh the lease"):
            reply = await self._client.refresh_lease(self._lease.id)
        if reply is None or reply.TTL <= 0:
            self.lease_lost = True
            self._deadline = 0.0
            log.warning("lease expired in etcd", extra=kv(group=self.group, member=self.member.name))
            return False
        self._deadline = max(self._deadline, sent + reply.TTL - self._margin_s)
        return True

    async def keep_alive(self, stop: asyncio.Event) -> None:
        """Refresh the lease every TTL/3 until `stop`, and every `REFRESH_RETRY_S` after a failure
        (a paused or unreachable etcd): the first refresh etcd answers after a pause extends the
        term, rather than one a whole interval later, after the term deadline passed. A lease etcd
        says expired is left alone until the member joins again with a new one (`start()`)."""
        interval, failing = self._ttl_s / 3, False
        while not stop.is_set():
            try:
                if self._lease is not None and not self.lease_lost:
                    await self.refresh()
                if failing:
                    log.info("lease refreshed again", extra=kv(group=self.group, member=self.member.name))
                failing = False
            except Unavailable as exc:
                if not failing:
                    log.warning("lease refresh failed; retrying", extra=kv(error=exc.message))
                failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REFRESH_RETRY_S if failing else interval)

    def term_valid(self) -> bool:
        """Whether this member's lease is surely still alive in etcd (the fence: see the module doc)."""
        return not self.lease_lost and self._clock() < self._deadline

    @property
    def term_deadline(self) -> float:
        return self._deadline

    # -- reads -------------------------------------------------------------------------------------

    async def leader(self) -> Leader | None:
        async with self._etcd("read the leader"):
            got = await self._client.get(self._leader_key)
        return None if got is None else Leader(**load_record(got.value))

    async def insync(self) -> tuple[InSync | None, int]:
        """The latest in-sync set and its mod revision (0 when the group has none yet)."""
        async with self._etcd("read the in-sync set"):
            got = await self._client.get(self._insync_key)
        if got is None:
            return None, 0
        raw = load_record(got.value)
        return InSync(int(raw["epoch"]), tuple(raw["members"])), got.mod_revision

    async def epochs(self) -> list[Epoch]:
        """The group's epoch history, oldest first."""
        async with self._etcd("read the epochs"):
            found = await self._client.get_prefix(self._key("epochs", ""))
        history = [Epoch(int(kv_.key.rsplit(b"/", 1)[1]), int(load_record(kv_.value)["start_offset"])) for kv_ in found]
        return sorted(history)

    async def members(self) -> dict[str, MemberInfo]:
        async with self._etcd("read the members"):
            found = await self._client.get_prefix(self._key("members", ""))
        return {m.name: m for m in (MemberInfo(**load_record(kv_.value)) for kv_ in found)}

    # -- writes ------------------------------------------------------------------------------------

    async def campaign(self, log_end: int) -> Leader | None:
        """Try to become primary with a log ending at `log_end`; the new Leader, or None when this
        member is not eligible (not in the latest in-sync set) or another won (etcd decides)."""
        if not self.term_valid():
            return None
        insync, insync_rev = await self.insync()
        if insync is not None and self.member.name not in insync.members:
            return None
        history = await self.epochs()
        previous = history[-1] if history else None
        epoch = (previous.number if previous else 0) + 1
        leader = Leader(self.member.name, epoch, log_end, self.member.address, self.member.repl_address)
        old_primary = await self._epoch_owner(previous)
        members = [m for m in (insync.members if insync else ()) if m != old_primary and m != self.member.name]
        new_insync = {"epoch": epoch, "members": [self.member.name, *members]}
        tx = self._client.transactions
        compare = [tx.create(self._leader_key) == 0, tx.mod(self._insync_key) == insync_rev]
        success = [
            tx.put(self._leader_key, dump_record(asdict(leader)), lease=self._lease),
            tx.put(
                self._key("epochs", f"{epoch:020d}"),
                dump_record({"name": self.member.name, "start_offset": log_end}),
            ),
            tx.put(self._insync_key, dump_record(new_insync)),
        ]
        async with self._etcd("campaign"):
            won, _ = await self._client.transaction(compare=compare, success=success, failure=[])
        if won:
            log.info("elected primary", extra=kv(group=self.group, member=self.member.name, epoch=epoch, start=log_end))
            return leader
        return None

    async def _epoch_owner(self, epoch: Epoch | None) -> str | None:
        if epoch is None:
            return None
        async with self._etcd("read an epoch"):
            got = await self._client.get(self._key("epochs", f"{epoch.number:020d}"))
        return None if got is None else str(load_record(got.value)["name"])

    async def set_insync(self, leader: Leader, members: list[str]) -> bool:
        """Publish the in-sync set as `leader` (this member); False when it is no longer the leader."""
        if leader.name != self.member.name:
            return False  # names are unique among live members (start())
        value = {"epoch": leader.epoch, "members": [leader.name, *sorted(m for m in members if m != leader.name)]}
        tx = self._client.transactions
        compare = [tx.value(self._leader_key) == dump_record(asdict(leader))]
        async with self._etcd("publish the in-sync set"):
            ok, _ = await self._client.transaction(
                compare=compare, success=[tx.put(self._insync_key, dump_record(value))], failure=[]
            )
        return bool(ok)

    async def switchover_request(self) -> dict[str, Any] | None:
        """The pending planned switchover ({to, error?}), if any."""
        async with self._etcd("read the switchover request"):
            got = await self._client.get(self._key("switchover"))
        return None if got is None else load_record(got.value)

    async def refuse_switchover(self, request: dict[str, Any], reason: str) -> None:
        """Answer a switchover request with an error (the admin tool reports it and removes the key)."""
        tx = self._client.transactions
        key = self._key("switchover")
        async with self._etcd("refuse the switchover"):
            answer = dump_record({**request, "error": reason})
            await self._client.transaction(
                compare=[tx.value(key) == dump_record(request)], success=[tx.put(key, answer)], failure=[]
            )

    async def hand_over(self, leader: Leader, request: dict[str, Any]) -> bool:
        """Make `request["to"]` the only member eligible for election and give up the leader key, in one
        transaction that holds only while `leader` is still ours and the request still stands."""
        tx = self._client.transactions
        key = self._key("switchover")
        insync = {"epoch": leader.epoch, "members": [str(request["to"])]}
        async with self._etcd("hand over"):
            done, _ = await self._client.transaction(
                compare=[
                    tx.value(self._leader_key) == dump_record(asdict(leader)),
                    tx.value(key) == dump_record(request),
                ],
                success=[tx.put(self._insync_key, dump_record(insync)), tx.delete(self._leader_key), tx.delete(key)],
                failure=[],
            )
        return bool(done)

    async def put_status(self, status: dict[str, Any]) -> None:
        """Publish the primary's view of its replicas (for `sluice admin broker list`), on its lease."""
        async with self._etcd("publish the group status"):
            await self._client.put(self._key("status"), dump_record(status), lease=self._lease)

    async def resign(self, leader: Leader) -> None:
        """Give up the leader key if it is still `leader` (a planned switchover or shutdown)."""
        tx = self._client.transactions
        async with self._etcd("resign"):
            await self._client.transaction(
                compare=[tx.value(self._leader_key) == dump_record(asdict(leader))],
                success=[tx.delete(self._leader_key)],
                failure=[],
            )

    # -- errors ------------------------------------------------------------------------------------

    def _etcd(self, what: str) -> EtcdErrors:
        return EtcdErrors(what)


class EtcdErrors:
    """Turns etcd client failures into `Unavailable` naming what was being done."""

    def __init__(self, what: str) -> None:
        self._what = what

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc_info: object) -> bool:
        exc = exc_info[1]
        if isinstance(exc, aetcd.exceptions.ClientError | TimeoutError):
            raise Unavailable(f"etcd: could not {self._what} ({type(exc).__name__}: {exc})") from exc
        return False


async def read_groups(endpoint: str, cluster: str) -> dict[str, dict[str, Any]]:
    """Every broker group of `cluster` as etcd holds it: {group: {"members": {name: MemberInfo
    dict}, "leader": dict | None, "insync": dict | None, "status": dict | None}} (for admin tools)."""
    host, port = parse_endpoint(endpoint)
    prefix = f"/sluice/{cluster}/groups/"
    groups: dict[str, dict[str, Any]] = {}
    async with EtcdErrors("read the broker groups"), aetcd.Client(host=host, port=port, timeout=3) as client:
        found = await client.get_prefix(prefix.encode())
    for item in found:
        group, _, rest = item.key.decode()[len(prefix) :].partition("/")
        view = groups.setdefault(group, {"members": {}, "leader": None, "insync": None, "status": None})
        if rest.startswith("members/"):
            view["members"][rest[len("members/") :]] = load_record(item.value)
        elif rest in ("leader", "insync", "status"):
            view[rest] = load_record(item.value)
    return groups


def dump_record(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def load_record(raw: bytes) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise Unavailable(f"etcd holds a malformed group record: {raw[:80]!r}")
    return value
