"""What a new primary continues after a failover, with real `sluice broker` processes on a real etcd
(and a real moto S3 server for tiering): the security document, message traces and tiering's upload
state are replicated like the rest of the consumer state (docs/replication.md, "What is replicated").

Each test changes state on the primary, SIGKILLs it and checks the group's new primary: the same
security document and traces; tiering continues from where the old primary's replicated manifest
ended, so the bucket's manifest lists every queue range exactly once, without gaps, and every
message is readable from the bucket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aetcd
import pytest

from broker.client.api import (
    ConsumeFrom,
    FilterSpec,
    GroupSpec,
    PopRequest,
    TopicSpec,
    TraceKind,
)
from broker.client.remote import RemoteBroker
from broker.tiering.config import TieringConfig
from common.errors import SluiceError
from tests.helpers.broker_fixtures import ServerProcess, start_broker_process
from tests.helpers.etcd import EtcdProcess, start_etcd
from tests.helpers.records import outgoing

if TYPE_CHECKING:
    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3"]

GROUP = "g1"
TOPIC = "orders"
QUEUES = 2
TIMEOUT_S = 120
WAIT_S = 60.0


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path / "etcd")
    yield proc
    proc.stop()


def _settings(etcd: EtcdProcess, **extra: Any) -> dict[str, Any]:
    return {
        "heartbeat_interval_s": 1.0,
        "replication": {"group": GROUP, "etcd": [etcd.url], "min_insync": 2, "lease_ttl_s": 2, "max_lag_ms": 1500},
        **extra,
    }


async def _etcd_json(etcd: EtcdProcess, key: str) -> dict[str, Any] | None:
    async with aetcd.Client(host="127.0.0.1", port=etcd.port, timeout=2) as client:
        got = await client.get(f"/sluice/sluice/groups/{GROUP}/{key}".encode())
    return None if got is None else json.loads(got.value)


async def _eventually(what: str, check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = await check()
        except SluiceError:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


class Group:
    """Three members of GROUP, min_insync 2."""

    def __init__(self, root: Path, settings: dict[str, Any]) -> None:
        self.root, self.settings = root, settings
        self.procs: dict[str, ServerProcess] = {}

    def start(self) -> None:
        for name in ("b1", "b2", "b3"):
            self.procs[name] = start_broker_process(self.root, name=name, settings=self.settings)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()

    async def primary(self, etcd: EtcdProcess) -> dict[str, Any]:
        async def ready() -> dict[str, Any] | None:
            leader, insync = await _etcd_json(etcd, "leader"), await _etcd_json(etcd, "insync")
            if leader and insync and len(insync["members"]) == 3 and insync["epoch"] == leader["epoch"]:
                return leader
            return None

        return await _eventually("a primary with every member in sync", ready)  # type: ignore[no-any-return]

    async def kill_primary(self, etcd: EtcdProcess, leader: dict[str, Any]) -> RemoteBroker:
        """SIGKILL the primary; the new primary, once it answers."""
        victim = self.procs[leader["name"]]
        victim.child.signal(signal.SIGKILL)
        victim.child.popen.wait(10)

        async def successor() -> dict[str, Any] | None:
            got = await _etcd_json(etcd, "leader")
            return got if got is not None and got["name"] != leader["name"] else None

        new = await _eventually("a new primary", successor)
        remote = RemoteBroker(GROUP, new["address"], timeout_s=10)
        await _eventually("the new primary serving", lambda: remote.get_topic(TOPIC))
        return remote


def test_security_document_and_traces_survive_a_failover(etcd: EtcdProcess, tmp_path: Path) -> None:
    group = Group(tmp_path, _settings(etcd))

    async def body() -> None:
        await asyncio.to_thread(group.start)
        leader = await group.primary(etcd)
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=10)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=QUEUES))
        await remote.create_group(GroupSpec("readers", consume_from=ConsumeFrom.EARLIEST))
        ids = [f"m-{i}" for i in range(6)]
        for i, mid in enumerate(ids):
            await remote.send(TOPIC, i % QUEUES, [outgoing(body=mid.encode(), message_id=mid)])
        popped = await remote.pop(PopRequest("readers", TOPIC, max_messages=len(ids), invisible_ms=60_000))
        await remote.ack("readers", TOPIC, [m.receipt_handle for m in popped])
        await remote.put_security(1, b"document version 1")

        async def traced() -> bool:
            kinds = [{e.kind for e in await remote.message_trace(m.message_id)} for m in popped]
            return bool(popped) and all({TraceKind.SENT, TraceKind.DELIVERED, TraceKind.ACKED} <= k for k in kinds)

        await _eventually("the trace written on the primary", traced)
        # Acknowledged only once every in-sync member holds it, and every state change before it:
        # the trace's included.
        await remote.put_security(2, b"document version 2")
        before = {mid: await remote.message_trace(mid) for mid in ids}
        await remote.close()

        remote = await group.kill_primary(etcd, leader)
        assert await remote.get_security() == (2, b"document version 2")
        for mid in ids:
            assert await remote.message_trace(mid) == before[mid], f"trace of {mid}"
        await remote.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        group.stop()


def _mirror(client: Any, bucket: str, prefix: str) -> tuple[dict[str, Any], set[str]]:
    """The topic's manifest.json in the bucket ({} while there is none), and every object key under `prefix`."""
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}
    mirror_key = next((k for k in keys if k.endswith(f"/{TOPIC}/manifest.json")), None)
    if mirror_key is None:
        return {}, keys
    return json.loads(client.get_object(Bucket=bucket, Key=mirror_key)["Body"].read()), keys


def test_tiering_continues_after_a_failover_without_gaps_or_duplicates(
    etcd: EtcdProcess, tmp_path: Path, s3_config: TieringConfig, s3_server: MotoS3Server
) -> None:
    cfg = dataclasses.replace(
        s3_config, min_age_s=0.0, segment_max_age_s=0.0, segment_target_bytes=4 << 10, row_group_rows=16,
        row_group_bytes=8 << 10, mirror_interval_s=0.0, scan_interval_s=0.05,
    )  # fmt: skip
    tiering = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "topic_retention_s"}
    group = Group(tmp_path, _settings(etcd, tiering=tiering))
    total, batch = 1500, 50

    async def body() -> None:
        await asyncio.to_thread(group.start)
        leader = await group.primary(etcd)
        remote = RemoteBroker(GROUP, leader["address"], timeout_s=10)
        await remote.create_topic(TopicSpec(TOPIC, queue_count=QUEUES))
        for start in range(0, total, batch):
            msgs = [outgoing(body=f"order {i} ".encode() * 20, message_id=f"msg-{i:05d}")
                    for i in range(start, start + batch)]  # fmt: skip
            await remote.send(TOPIC, (start // batch) % QUEUES, msgs)

        async def uploading() -> bool:
            st = (await remote.tier_status()).topics
            return bool(st) and st[0].objects >= 3 and st[0].lag_messages > 0

        await _eventually("uploads under way", uploading)

        # The bucket's manifest lists only segments the primary recorded; a write acknowledged after
        # that (it waits for the in-sync replicas to hold every state change before it) makes sure
        # the replicas hold those records too.
        async def mirrored() -> dict[str, Any]:
            doc, _ = await asyncio.to_thread(_mirror, s3_server.client(), cfg.bucket, cfg.prefix)
            return doc if doc.get("segments") else {}

        doc = await _eventually("the bucket's manifest", mirrored)
        tiered_before = {seg["seq"]: seg["key"] for seg in doc["segments"]}
        await remote.put_security(1, b"a gated write")
        await remote.close()

        remote = await group.kill_primary(etcd, leader)  # mid-upload
        status = await remote.tier_upload_now(TOPIC, 30.0)
        assert status.lag_messages == 0
        doc, keys = await asyncio.to_thread(_mirror, s3_server.client(), cfg.bucket, cfg.prefix)
        # The new primary kept what the old one had tiered (same objects): nothing uploaded twice.
        assert {seg["seq"]: seg["key"] for seg in doc["segments"] if seg["seq"] in tiered_before} == tiered_before
        assert [seg["seq"] for seg in doc["segments"]] == list(range(len(doc["segments"])))
        ends: dict[int, int] = {}
        for seg in doc["segments"]:
            assert seg["key"] in keys, f"the manifest lists a missing object {seg['key']}"
            for q, (first, last) in seg["queues"].items():
                assert first == ends.get(int(q), 0), f"queue {q}: segment {seg['seq']} starts at {first}, not {ends}"
                ends[int(q)] = last + 1
        assert sum(ends.values()) == total
        # Every message comes back from the bucket once the local copies are gone.
        await remote.tier_evict_local(TOPIC)
        ids: list[str] = []
        for q in range(QUEUES):
            offset = 0
            while True:
                res = await remote.pull("puller", TOPIC, q, offset, 64, FilterSpec())
                ids += [m.message_id for m in res.messages]
                if res.next_offset >= res.max_offset:
                    break
                offset = res.next_offset
        assert sorted(ids) == [f"msg-{i:05d}" for i in range(total)]
        await remote.close()

    try:
        asyncio.run(asyncio.wait_for(body(), TIMEOUT_S))
    finally:
        group.stop()
