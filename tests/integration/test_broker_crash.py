"""A broker SIGKILLed at random moments while producers send and consumers pop and ack through
`RemoteBroker`; restarted each time on the same data dir and port.

Checked from what the clients observed (a `Ledger`), plus the broker's own final status:
- nothing is lost: every message whose send succeeded is delivered and acknowledged, and both
  consumer groups end with lag 0 and nothing in flight;
- an acknowledged message (ack result ok) never comes back. An ack whose RPC failed is
  "uncertain": the broker may or may not have applied it (the at-least-once window);
- FIFO, per message group: the stored order is the send order (retried sends may leave adjacent
  duplicates); first deliveries follow the stored order; message k+1 is first delivered only after
  an ack of k was issued (and was not rejected), and k is never delivered again after that.

Deterministic choices (timings, queues) come from a seeded RNG; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client.api import BrokerApi, ConsumeFrom, GroupSpec, PopRequest, StoredMessage, TopicSpec
from broker.client.remote import RemoteBroker
from common.errors import SluiceError
from common.model import MessageType, dlq_topic
from tests.helpers.broker_fixtures import SLUICE_ARGV, to_toml
from tests.helpers.procs import LOOPBACK, ChildProcess, ProcessStartError, free_port, start_process
from tests.helpers.records import outgoing

pytestmark = pytest.mark.slow

SEED = 20_240_611
BROKER_NAME = "crash-broker"
SETTINGS = {"name": BROKER_NAME, "pop": {"min_invisible_ms": 200, "redelivery_scan_interval_ms": 20}}
NORMAL, FIFO = "crash-normal", "crash-fifo"
NORMAL_GROUP, FIFO_GROUP = "crash-consumers", "crash-fifo-consumers"
NORMAL_QUEUES, FIFO_QUEUES = 4, 2
MESSAGE_GROUPS = [f"mg{i}" for i in range(6)]
INVISIBLE_MS = 1_000
KILL_ROUNDS = 4
NORMAL_CONSUMERS, FIFO_CONSUMERS = 4, 3
RETRY_PAUSE_S = 0.05
DRAIN_TIMEOUT_S = 30.0
TEST_TIMEOUT_S = 90.0
START_TIMEOUT_S = 15.0

Position = tuple[str, int, int]  # topic, queue id, queue offset


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
        log_path = self.root / f"broker-{self.starts}.log"
        self.child = start_process(argv, port=self.port, log_path=log_path, name=BROKER_NAME, timeout_s=START_TIMEOUT_S)
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


@dataclass
class Delivery:
    seq: int
    message: StoredMessage


@dataclass
class Ack:
    issued_seq: int
    handle: str
    attempt: int
    outcome: str = "pending"  # ok | rejected | uncertain
    done_seq: int = 0


@dataclass
class Ledger:
    """Everything the clients saw, in the order the test's event loop saw it."""

    _seq: itertools.count[int] = field(default_factory=itertools.count)
    sent: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # topic or message group -> ids
    deliveries: dict[Position, list[Delivery]] = field(default_factory=lambda: defaultdict(list))
    acks: dict[Position, list[Ack]] = field(default_factory=lambda: defaultdict(list))
    kills: int = 0
    rpc_errors: int = 0  # calls that failed (the broker was down or died during the call)

    def tick(self) -> int:
        return next(self._seq)

    def delivered(self, m: StoredMessage) -> None:
        self.deliveries[(m.topic, m.queue_id, m.queue_offset)].append(Delivery(self.tick(), m))

    def acked_ids(self) -> set[str]:
        done = set()
        for pos, acks in self.acks.items():
            if any(a.outcome in ("ok", "uncertain") for a in acks):
                done.add(self.deliveries[pos][0].message.message_id)
        return done


async def produce_normal(api: BrokerApi, ledger: Ledger, rng: random.Random, stop: asyncio.Event) -> None:
    while not stop.is_set():
        batch = [outgoing(f"n{rng.getrandbits(32)}".encode(), f"{rng.getrandbits(128):032X}") for _ in range(4)]
        await send_until_ok(api, ledger, NORMAL, rng.randrange(NORMAL_QUEUES), batch)
        ledger.sent[NORMAL] += [m.message_id for m in batch]
        await asyncio.sleep(rng.uniform(0.005, 0.02))


async def produce_fifo(api: BrokerApi, ledger: Ledger, mg: str, rng: random.Random, stop: asyncio.Event) -> None:
    queue_id = MESSAGE_GROUPS.index(mg) % FIFO_QUEUES
    for k in itertools.count():
        if stop.is_set():
            return
        message_id = f"{mg}-{k:06d}"
        msg = outgoing(message_id.encode(), message_id, message_type=MessageType.FIFO, message_group=mg)
        await send_until_ok(api, ledger, FIFO, queue_id, [msg])  # sequential per message group: stored in send order
        ledger.sent[mg].append(message_id)
        await asyncio.sleep(rng.uniform(0.01, 0.04))


async def send_until_ok(api: BrokerApi, ledger: Ledger, topic: str, queue_id: int, batch: list[bytes]) -> None:
    """Retry with the same message ids; a failed attempt may still have been stored (a duplicate)."""
    while True:
        try:
            await api.send(topic, queue_id, batch)
            return
        except SluiceError:
            ledger.rpc_errors += 1
            await asyncio.sleep(RETRY_PAUSE_S)


async def consume(
    api: BrokerApi, ledger: Ledger, group: str, topic: str, rng: random.Random, stop: asyncio.Event
) -> None:
    """Pop, record, ack the whole batch, record the outcome; only then pop again."""
    request = PopRequest(group, topic, max_messages=16, invisible_ms=INVISIBLE_MS, long_poll_ms=300)
    while not stop.is_set():
        try:
            messages = await api.pop(request)
        except SluiceError:
            ledger.rpc_errors += 1
            await asyncio.sleep(RETRY_PAUSE_S)
            continue
        for m in messages:
            ledger.delivered(m)
        if not messages:
            continue
        await asyncio.sleep(rng.uniform(0, 0.01))  # "processing"
        pending = [Ack(ledger.tick(), m.receipt_handle, m.delivery_attempt) for m in messages]
        for m, ack in zip(messages, pending, strict=True):
            ledger.acks[(m.topic, m.queue_id, m.queue_offset)].append(ack)
        try:
            results = await api.ack(group, topic, [a.handle for a in pending])
        except SluiceError:
            ledger.rpc_errors += 1
            results = None
        done = ledger.tick()
        for i, ack in enumerate(pending):
            ack.done_seq = done
            ack.outcome = "uncertain" if results is None else "ok" if results[i].ok else "rejected"


async def kill_and_restart(proc: BrokerProcess, ledger: Ledger, rng: random.Random) -> None:
    for _ in range(KILL_ROUNDS):
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        await asyncio.to_thread(proc.kill)
        ledger.kills += 1
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        await asyncio.to_thread(proc.start)


async def settled(api: BrokerApi, ledger: Ledger) -> bool:
    """Every successfully sent message acked (or uncertain), and the broker agrees: lag 0, none in flight."""
    wanted = {i for ids in ledger.sent.values() for i in ids}
    if not wanted <= ledger.acked_ids():
        return False
    try:
        for group, topic in ((NORMAL_GROUP, NORMAL), (FIFO_GROUP, FIFO)):
            ends = {q.queue_id: q.max_offset for q in (await api.topic_status(topic)).queues}
            status = {q.queue_id: q for q in (await api.group_status(group)).queues if q.topic == topic}
            for qid, end in ends.items():
                if end and (qid not in status or status[qid].consumed_offset != end or status[qid].in_flight):
                    return False
    except SluiceError:
        return False
    return True


async def setup(api: BrokerApi) -> None:
    await api.create_topic(TopicSpec(NORMAL, NORMAL_QUEUES))
    await api.create_topic(TopicSpec(FIFO, FIFO_QUEUES, frozenset({MessageType.FIFO})))
    for name, fifo in ((NORMAL_GROUP, False), (FIFO_GROUP, True)):
        await api.create_group(
            GroupSpec(name, fifo=fifo, max_delivery_attempts=1000, consume_from=ConsumeFrom.EARLIEST)
        )


async def scenario(proc: BrokerProcess) -> Ledger:
    rng = random.Random(SEED)
    ledger = Ledger()
    api = RemoteBroker(BROKER_NAME, proc.address, timeout_s=3.0, reconnect_backoff_max_s=0.2)
    stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
    try:
        await setup(api)
        async with asyncio.TaskGroup() as tasks:
            producers = [tasks.create_task(produce_normal(api, ledger, random.Random(rng.random()), stop_producing))]
            producers += [
                tasks.create_task(produce_fifo(api, ledger, mg, random.Random(rng.random()), stop_producing))
                for mg in MESSAGE_GROUPS
            ]
            for group, topic, n in ((NORMAL_GROUP, NORMAL, NORMAL_CONSUMERS), (FIFO_GROUP, FIFO, FIFO_CONSUMERS)):
                for _ in range(n):
                    tasks.create_task(consume(api, ledger, group, topic, random.Random(rng.random()), stop_consuming))
            await kill_and_restart(proc, ledger, rng)
            await asyncio.sleep(0.5)  # a little traffic after the last restart
            stop_producing.set()
            await asyncio.gather(*producers)
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while not await settled(api, ledger):
                assert time.monotonic() < deadline, f"not everything consumed within {DRAIN_TIMEOUT_S} s"
                await asyncio.sleep(0.2)
            stop_consuming.set()
        topics = {t.name for t in await api.list_topics()}
        assert not topics & {dlq_topic(NORMAL_GROUP), dlq_topic(FIFO_GROUP)}, "nothing should be dead-lettered"
    finally:
        stop_producing.set()
        stop_consuming.set()
        await api.close()
    return ledger


def check_acked_never_return(ledger: Ledger) -> None:
    for pos, acks in ledger.acks.items():
        for ack in (a for a in acks if a.outcome == "ok"):
            later = [
                d for d in ledger.deliveries[pos] if d.seq > ack.done_seq and d.message.receipt_handle != ack.handle
            ]
            again = [d for d in ledger.deliveries[pos] if d.message.delivery_attempt > ack.attempt]
            assert not later and not again, f"{pos} acknowledged (attempt {ack.attempt}) but delivered again"


def check_nothing_lost(ledger: Ledger) -> None:
    wanted = {i for ids in ledger.sent.values() for i in ids}
    delivered = {ds[0].message.message_id for ds in ledger.deliveries.values()}
    assert wanted <= delivered, f"never delivered: {sorted(wanted - delivered)[:10]}"
    assert wanted <= ledger.acked_ids()


def check_fifo(ledger: Ledger) -> None:
    lanes: dict[str, list[Position]] = defaultdict(list)
    for pos, ds in ledger.deliveries.items():
        if pos[0] == FIFO:
            lanes[ds[0].message.message_group or ""].append(pos)
    assert set(lanes) == set(MESSAGE_GROUPS)
    for mg, positions in lanes.items():
        positions.sort()
        assert len({p[1] for p in positions}) == 1, f"{mg} spread over queues"
        ids = [ledger.deliveries[p][0].message.message_id for p in positions]
        assert [k for k, _ in itertools.groupby(ids)] == ledger.sent[mg], f"{mg}: stored order is not the send order"
        firsts = [ledger.deliveries[p][0].seq for p in positions]
        assert firsts == sorted(firsts), f"{mg}: first deliveries out of stored order"
        for prev, nxt in itertools.pairwise(positions):
            released_at = ledger.deliveries[nxt][0].seq
            acked_before = [a for a in ledger.acks[prev] if a.issued_seq < released_at and a.outcome != "rejected"]
            assert acked_before, f"{mg}: {nxt} delivered while {prev} was not acknowledged"
            assert all(d.seq < released_at for d in ledger.deliveries[prev]), f"{mg}: {prev} redelivered after {nxt}"


def test_sigkill_loses_nothing_and_acked_stays_acked(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path)
    proc.start()
    try:
        ledger = asyncio.run(asyncio.wait_for(scenario(proc), TEST_TIMEOUT_S))
    finally:
        proc.stop()
    assert ledger.kills == KILL_ROUNDS and proc.starts == KILL_ROUNDS + 1
    sent = sum(len(ids) for ids in ledger.sent.values())
    redelivered = sum(len(ds) > 1 for ds in ledger.deliveries.values())
    uncertain = sum(any(a.outcome == "uncertain" for a in acks) for acks in ledger.acks.values())
    print(f"sent {sent}, stored {len(ledger.deliveries)}, redelivered {redelivered}, uncertain acks {uncertain}, "
          f"failed calls {ledger.rpc_errors}")  # fmt: skip
    assert sent > 500 and ledger.rpc_errors > 0, "the kills should have hit traffic"
    check_nothing_lost(ledger)
    check_acked_never_return(ledger)
    check_fifo(ledger)
