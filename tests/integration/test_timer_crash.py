"""Timers across crashes: none lost, none delivered twice into its topic, none early.

1. In process, deterministic: the scheduler "dies" right after a delivery batch was appended to its
   topic and before the batch's timer keys were deleted (the one window where a copy could be made
   twice); the broker is then closed and reopened on the same data dir.
2. A broker process SIGKILLed at random (seeded) moments while producers schedule DELAY messages
   due over the next seconds, restarted each time on the same data dir and port.

Checked from the topic's content (pulled from offset 0): every timer whose send succeeded is in its
topic exactly once, a timer whose send failed at most once, and every copy was stored at or after
its delivery time. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client.api import BrokerApi, FilterSpec, StoredMessage, TopicSpec
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig
from broker.local import LocalBroker
from broker.timer.service import TimerService
from common.config import load_config
from common.errors import SluiceError
from common.model import MessageType
from tests.helpers.broker_fixtures import SLUICE_ARGV, to_toml
from tests.helpers.procs import LOOPBACK, ChildProcess, ProcessStartError, free_port, start_process
from tests.helpers.records import outgoing

pytestmark = pytest.mark.slow

SEED = 20_261_122
BROKER_NAME = "timer-crash-broker"
SETTINGS: dict[str, Any] = {"name": BROKER_NAME, "timer": {"precision_ms": 100, "batch_messages": 50}}
TOPIC = "timer-crash"
QUEUES = 2
KILL_ROUNDS = 4
START_TIMEOUT_S = 15.0
DRAIN_TIMEOUT_S = 60.0
TEST_TIMEOUT_S = 120.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delayed(message_id: str, at_ms: int) -> bytes:
    return outgoing(body=message_id.encode(), message_id=message_id, message_type=MessageType.DELAY,
                           delivery_timestamp_ms=at_ms)  # fmt: skip


async def topic_content(api: BrokerApi) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    for qid in range(QUEUES):
        offset = 0
        while True:
            res = await api.pull("timer-reader", TOPIC, qid, offset, 32, FilterSpec())
            out += res.messages
            if res.next_offset >= res.max_offset:
                break
            offset = res.next_offset
    return out


def check_content(content: list[StoredMessage], sent: set[str], uncertain: set[str]) -> None:
    counts: dict[str, int] = {}
    for m in content:
        counts[m.message_id] = counts.get(m.message_id, 0) + 1
        assert m.store_timestamp_ms >= m.delivery_timestamp_ms, f"{m.message_id} delivered early"
    missing = sent - counts.keys()
    assert not missing, f"{len(missing)} acknowledged timers never delivered, e.g. {sorted(missing)[:5]}"
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} timers delivered twice, e.g. {twice[:5]}"
    assert counts.keys() <= sent | uncertain, "a message nobody sent is in the topic"


# -- 1. the append/delete window, in process ------------------------------------------------------


def _config(data_dir: Path) -> BrokerConfig:
    return load_config(BrokerConfig, section="broker", data={"broker": {**SETTINGS, "data_dir": str(data_dir)}})


def test_crash_between_append_and_delete_delivers_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    crashed: list[int] = []
    original = TimerService._drop

    def dying_drop(self: TimerService, batch: object, entries: list[tuple[bytes, int, str]]) -> None:
        if not crashed:  # the first delivery batch: its copies are appended, its keys stay
            crashed.append(len(entries))
            raise RuntimeError("simulated crash after the append")
        original(self, batch, entries)

    async def scenario() -> None:
        broker = LocalBroker(_config(tmp_path / "b"))
        await broker.start()
        await broker.create_topic(TopicSpec(TOPIC, QUEUES, frozenset({MessageType.DELAY})))
        at = now_ms() + 300
        ids = [f"id-{i}" for i in range(120)]
        for i, mid in enumerate(ids):
            await broker.send(TOPIC, i % QUEUES, [delayed(mid, at)])
        monkeypatch.setattr(TimerService, "_drop", dying_drop)
        deadline = time.monotonic() + 20
        while not crashed:
            assert time.monotonic() < deadline, "the scheduler never delivered"
            await asyncio.sleep(0.05)
        await broker.close()  # the process "died": batch appended, keys and in-flight marker kept
        monkeypatch.setattr(TimerService, "_drop", original)

        broker = LocalBroker(_config(tmp_path / "b"))
        await broker.start()
        try:
            deadline = time.monotonic() + 20
            while (await broker.topic_status(TOPIC)).pending_timers:
                assert time.monotonic() < deadline, "pending timers not delivered after the restart"
                await asyncio.sleep(0.05)
            check_content(await topic_content(broker), set(ids), set())
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))
    assert crashed == [SETTINGS["timer"]["batch_messages"]]


# -- 2. SIGKILL of a broker process ---------------------------------------------------------------


class BrokerProcess:
    """`sluice broker` on a fixed port and data dir, so it can be killed and started again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.config_path = root / "broker.toml"
        self.config_path.write_text(to_toml({"broker": SETTINGS}))
        self.child: ChildProcess | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self.starts += 1
        argv = [*SLUICE_ARGV, "broker", "--config", str(self.config_path), "--port", str(self.port),
                "--data-dir", str(self.root / "data"), "--flush", "async"]  # fmt: skip
        self.child = start_process(argv, port=self.port, log_path=self.root / f"broker-{self.starts}.log",
                                   name=BROKER_NAME, timeout_s=START_TIMEOUT_S)  # fmt: skip
        ready = f"broker {BROKER_NAME} listening on {self.address}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while ready not in self.child.output():
            if not self.child.running() or time.monotonic() > deadline:
                self.child.stop()
                raise ProcessStartError(f"broker did not print {ready!r}:\n{self.child.tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.child is not None
        self.child.signal(signal.SIGKILL)
        self.child.popen.wait(timeout=START_TIMEOUT_S)

    def stop(self) -> None:
        if self.child is not None and self.child.running():
            self.child.stop()


async def produce(
    api: BrokerApi, name: str, rng: random.Random, sent: set[str], uncertain: set[str], stop: asyncio.Event
) -> None:
    n = 0
    while not stop.is_set():
        batch = [delayed(f"{name}-{n + i}", now_ms() + rng.randint(-500, 3_000)) for i in range(rng.randint(1, 20))]
        n += len(batch)
        try:
            await api.send(TOPIC, rng.randrange(QUEUES), batch)
            sent.update(m.message_id for m in batch)
        except SluiceError:
            uncertain.update(m.message_id for m in batch)  # never resent: at most once in the topic
            await asyncio.sleep(0.05)
        await asyncio.sleep(rng.uniform(0.0, 0.02))


async def kill_scenario(proc: BrokerProcess) -> tuple[set[str], set[str]]:
    rng = random.Random(SEED)
    sent: set[str] = set()
    uncertain: set[str] = set()
    api = RemoteBroker(BROKER_NAME, proc.address, timeout_s=3.0, reconnect_backoff_max_s=0.2)
    stop = asyncio.Event()
    try:
        await api.create_topic(TopicSpec(TOPIC, QUEUES, frozenset({MessageType.DELAY})))
        producers = [asyncio.create_task(produce(api, f"p{i}", random.Random(rng.random()), sent, uncertain, stop))
                     for i in range(3)]  # fmt: skip
        for _ in range(KILL_ROUNDS):
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            await asyncio.to_thread(proc.kill)
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            await asyncio.to_thread(proc.start)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*producers)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            try:
                if (await api.topic_status(TOPIC)).pending_timers == 0:
                    break
            except SluiceError:
                pass
            assert time.monotonic() < deadline, f"timers still pending after {DRAIN_TIMEOUT_S} s"
            await asyncio.sleep(0.2)
        check_content(await topic_content(api), sent, uncertain)
    finally:
        stop.set()
        await api.close()
    return sent, uncertain


def test_timers_survive_sigkill(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path)
    proc.start()
    try:
        sent, _ = asyncio.run(asyncio.wait_for(kill_scenario(proc), TEST_TIMEOUT_S))
    finally:
        proc.stop()
    assert proc.starts == KILL_ROUNDS + 1
    assert len(sent) > 100, "too little traffic to mean anything"


# -- 3. retention keeps what pending timers need ----------------------------------------------------


def test_retention_keeps_the_segments_of_pending_timers(tmp_path: Path) -> None:
    settings = {"store": {"commitlog": {"segment_bytes": 64 * 1024}, "retention": {"max_age_s": 1.0}}}

    async def scenario() -> None:
        cfg = load_config(BrokerConfig, section="broker",
                          data={"broker": {**SETTINGS, **settings, "data_dir": str(tmp_path / "r")}})  # fmt: skip
        broker = LocalBroker(cfg)
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, 1, frozenset({MessageType.DELAY, MessageType.NORMAL})))
            [res] = await broker.send(TOPIC, 0, [delayed("far", now_ms() + 3_600_000)])
            filler = [outgoing(body=b"f" * 1024, message_id=f"f{i}") for i in range(400)]
            for i in range(0, len(filler), 50):
                await broker.send(TOPIC, 0, filler[i : i + 50])
            store = broker.store
            assert len(store.segments.all()) > 3
            later_s = time.time() + 3600
            assert store.run_retention(now_s=later_s) == 0, "a segment a pending timer needs was deleted"
            assert await broker.recall(TOPIC, res.recall_handle) == "far"  # its record is still readable
            assert store.run_retention(now_s=later_s) > 0, "nothing pinned any more: old segments go"
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))
