"""Planned switchover with zero loss: `sluice admin broker switchover GROUP --to NAME`.

```
 admin  ── put `switchover` {to} ──►  etcd  ◄── polled by the primary (every poll interval)
 primary: target in the in-sync set?  no ─► answer {to, error}
          DRAINING: the gate refuses every new write (retriable Unavailable)
          wait until the target holds the log end and the latest state change (at most max_lag_ms)
              └─ not in time ─► stop draining, answer {to, error}
          one etcd transaction (leader still ours, request unchanged):
              insync := {target}, delete `leader`, delete `switchover`
          ─► deposed: stops serving, rejoins as a replica
 target: sees no leader, is the only eligible member, campaigns and wins (a new epoch)
 admin  ── waits until `leader` names the target ──► done
```

Nothing acknowledged is lost: the old primary acknowledges nothing once draining, and the target
held every acknowledged write and state change before the leader key went away; only the target
can be elected. What the old primary wrote while draining (a refused send, a background timer
delivery) was never acknowledged: the old primary truncates it when it rejoins, as after a failover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aetcd

from broker.replication.coordinator import Coordinator, EtcdErrors, Leader, dump_record, load_record, parse_endpoint
from broker.replication.gate import AckGate
from common.errors import BadRequest, NotFound, Unavailable
from common.logs import kv

log = logging.getLogger("sluice.replication.switchover")

CATCH_UP_POLL_S = 0.01
ADMIN_POLL_S = 0.2


async def hand_over(
    gate: AckGate, coord: Coordinator, leader: Leader, request: dict[str, Any], timeout_s: float
) -> bool:
    """Carry out `request` as primary `leader`; True when the group was handed over (this member is
    no longer its primary), False when it was refused (the primary serves on)."""
    target = str(request.get("to", ""))
    if target not in gate.insync:
        await coord.refuse_switchover(request, f"{target} is not an in-sync replica of group {coord.group}")
        return False
    gate.draining = f"group {coord.group} is switching over to {target}"
    log.info("switchover: draining", extra=kv(group=coord.group, to=target, epoch=leader.epoch))
    deadline = time.monotonic() + timeout_s
    try:
        while not gate.caught_up(target):
            if time.monotonic() >= deadline or target not in gate.insync:
                await coord.refuse_switchover(request, f"{target} did not catch up within {timeout_s} s")
                return False
            await asyncio.sleep(CATCH_UP_POLL_S)
        try:
            handed = await coord.hand_over(leader, request)
        except Unavailable:
            # The transaction may have happened: serving on could acknowledge beside the target's
            # term. Step down instead; the member resigns the leader key if it is still ours.
            gate.deposed = True
            raise
        if not handed:
            await coord.refuse_switchover(request, "the request changed or this member lost the leader key")
            return False
        gate.deposed = True  # acknowledges nothing more, whatever is still waiting at the gate
    finally:
        if not gate.deposed:
            gate.draining = ""
    log.info("switchover: handed over", extra=kv(group=coord.group, to=target, epoch=leader.epoch))
    return True


async def switch_over(endpoint: str, cluster: str, group: str, target: str, timeout_s: float) -> dict[str, Any]:
    """Ask the primary of `group` to hand over to `target` and wait until `target` leads the group:
    {group, from, to, epoch}. BadRequest when the primary refuses, Unavailable on timeout (the
    request is withdrawn)."""
    host, port = parse_endpoint(endpoint)
    prefix = f"/sluice/{cluster}/groups/{group}/"
    leader_key, request_key = f"{prefix}leader".encode(), f"{prefix}switchover".encode()
    async with EtcdErrors("request a switchover"), aetcd.Client(host=host, port=port, timeout=3) as client:
        current = await client.get(leader_key)
        if current is None:
            raise NotFound(f"group {group} has no primary now (in etcd at {endpoint}, cluster {cluster})")
        # Whether `target` may take over (a live, in-sync member) is the primary's to decide: it
        # answers with an error otherwise.
        before = load_record(current.value)
        if before["name"] == target:
            return {"group": group, "from": target, "to": target, "epoch": before["epoch"]}
        request = dump_record({"to": target})
        tx = client.transactions
        stale = await client.get(request_key)
        if stale is not None and "error" in load_record(stale.value):  # answered, its requester gone
            await client.transaction(compare=[tx.value(request_key) == stale.value],
                                     success=[tx.delete(request_key)], failure=[])  # fmt: skip
        placed, _ = await client.transaction(
            compare=[tx.create(request_key) == 0], success=[tx.put(request_key, request)], failure=[]
        )
        if not placed:
            raise BadRequest(f"group {group} already has a switchover under way")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(ADMIN_POLL_S)
            leader = await client.get(leader_key)
            now = None if leader is None else load_record(leader.value)
            if now is not None and now["name"] == target and now["epoch"] > before["epoch"]:
                return {"group": group, "from": before["name"], "to": target, "epoch": now["epoch"]}
            answer = await client.get(request_key)
            if answer is not None and "error" in load_record(answer.value):
                await client.delete(request_key)
                raise BadRequest(f"switchover of group {group} refused: {load_record(answer.value)['error']}")
        await client.transaction(compare=[tx.value(request_key) == request], success=[tx.delete(request_key)],
                                 failure=[])  # fmt: skip
    raise Unavailable(f"group {group} did not switch over to {target} within {timeout_s} s (the request is withdrawn)")
