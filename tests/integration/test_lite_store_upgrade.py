"""A data directory written by the first lite layout opens and keeps its data.

That layout (broker/lite/keys.py, `CF_LITE_ID_V1`) had a `lite_id` column family (topic id +
queue id -> lite name) and expiry keys naming the queue id; RocksDB refuses to open a database
without naming every column family it holds. The test writes such a store with rocksdict itself,
then starts a `LocalBroker` on it: the old column family goes, the lite topics' messages and
subscriptions stay, and the migrated expiry index still expires them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import rocksdict

from broker.client.api import GroupSpec, LiteAction, LiteSync, PopRequest, TopicSpec
from broker.config import BrokerConfig
from broker.lite import keys as LK
from broker.local import LocalBroker
from common.config import load_config
from common.model import MessageType
from common.record import SYSPROP_LITE_TOPIC
from tests.contract.test_broker_contract import eventually
from tests.helpers.records import outgoing

LITE = frozenset({MessageType.LITE})
TOPIC, NORMAL, GROUP, CLIENT = "chats", "plain", "g", "c1"
NAMES = ("chat-1", "abcd", "room@x:7")  # "abcd": a 4-byte name, as long as the old key's queue id


def config(data_dir: Path) -> BrokerConfig:
    table = {"name": "upgrade-broker", "data_dir": str(data_dir), "lite": {"sweep_interval_ms": 50}}
    return load_config(BrokerConfig, section="broker", data={"broker": table})


def lite(name: str, i: int) -> bytes:
    return outgoing(f"{name}/{i}".encode(), f"{name}-{i}", MessageType.LITE,
                           system_properties={SYSPROP_LITE_TOPIC: name})  # fmt: skip


async def write_current_layout(data_dir: Path) -> None:
    broker = LocalBroker(config(data_dir))
    await broker.start()
    try:
        await broker.create_topic(TopicSpec(TOPIC, 1, LITE, lite_expiration_s=2))
        await broker.create_topic(TopicSpec(NORMAL, 1))
        await broker.create_group(GroupSpec(GROUP))
        await broker.sync_lite_subscription(LiteSync(GROUP, TOPIC, CLIENT, LiteAction.COMPLETE_ADD, NAMES))
        await broker.send(TOPIC, 0, [lite(name, i) for name in NAMES for i in range(2)])
        await broker.send(NORMAL, 0, [outgoing(b"kept", "plain-1")])
    finally:
        await broker.close()


def rewrite_as_v1(index_dir: Path) -> int:
    """Turn the store's lite state into the first layout with rocksdict alone: expiry keys naming
    queue ids, and the `lite_id` column family. Returns the bind topic's id."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_missing_column_families(True)
    cfs = [*rocksdict.Rdict.list_cf(str(index_dir), opts), LK.CF_LITE_ID_V1]
    db = rocksdict.Rdict(str(index_dir), opts, column_families={n: rocksdict.Options(raw_mode=True) for n in cfs})
    try:
        names, exp, ids = (db.get_column_family(n) for n in (LK.CF_LITE_NAME, LK.CF_LITE_EXP, LK.CF_LITE_ID_V1))
        tid = 0
        for key, _ in list(exp.items()):
            expires, tid, name = LK.parse_exp_key(key)
            qid = LK.RECORD.unpack(names[LK.name_key(tid, name)])[0]
            del exp[key]
            exp[LK.EXP_V1.pack(expires, tid, qid)] = b""
            ids[LK.ID_V1.pack(tid, qid)] = name.encode()
        assert tid, "the lite topics have expiry keys"
        del names, exp, ids
    finally:
        db.close()
    return tid


def test_a_store_of_the_first_lite_layout_opens_and_keeps_its_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    asyncio.run(write_current_layout(data_dir))
    tid = rewrite_as_v1(data_dir / "index")
    assert LK.CF_LITE_ID_V1 in rocksdict.Rdict.list_cf(str(data_dir / "index"), rocksdict.Options(raw_mode=True))

    async def reopen() -> None:
        broker = LocalBroker(config(data_dir))
        await broker.start()
        try:
            state = broker.lite.state
            assert sorted(name for _, _, name in state.due(1 << 62, 100)) == sorted(NAMES)
            got = await broker.pop(PopRequest(GROUP, TOPIC, None, 32, 30_000, lite_client=CLIENT))
            assert sorted(m.body.decode() for m in got) == sorted(f"{name}/0" for name in NAMES)
            plain = await broker.pop(PopRequest(GROUP, NORMAL, None, 32, 30_000))
            assert [m.body for m in plain] == [b"kept"]

            # The migrated expiry keys expire the lite topics (2 s without a write).
            async def expired() -> bool:
                return broker.lite.count(TOPIC) == 0

            await eventually(expired, "the migrated lite topics expire")
            assert state.due(1 << 62, 100) == []
            assert sorted(r.lite_topic for r in broker.lite.claim_removals([CLIENT])) == sorted(NAMES)
        finally:
            await broker.close()

    asyncio.run(reopen())
    cfs = rocksdict.Rdict.list_cf(str(data_dir / "index"), rocksdict.Options(raw_mode=True))
    assert LK.CF_LITE_ID_V1 not in cfs
    assert tid
