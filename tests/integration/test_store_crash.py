"""Crash test: SIGKILL a writer under the `sync` policy at random moments, recover, verify.

Each round starts tests/helpers/store_writer_child.py on the same data directory, lets it append
for a random 0.2-1.5 s and kills it with SIGKILL. The test then opens the store itself (which runs
recovery) and checks that

* every acknowledged record is readable at its queue offset, with its message id and body CRC;
* every queue is contiguous from offset 0 and no offset was ever acknowledged twice;
* every visible record is intact (its decode passed the CRC, its body carries its id and CRC) and
  the visible records tile the CommitLog exactly, from 0 to its end: nothing half-written is left.

Records written but not acknowledged before the kill may be visible; they must be intact too.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.store.store import MessageStore, ReadStatus
from common.record import MessageRecord
from tests.helpers import store_writer_child as child

REPO_ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 12
SEED = 20_240_611
KILL_AFTER_S = (0.2, 1.5)
READY_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0
READ_BATCH = 512


@dataclass(frozen=True)
class Ack:
    message_id: str
    body_crc: str


def parse_acks(path: Path) -> dict[tuple[str, int, int], Ack]:
    """Acknowledged records by (topic, queue id, queue offset); an unfinished last line is ignored."""
    if not path.exists():
        return {}
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    acks: dict[tuple[str, int, int], Ack] = {}
    for line in complete.splitlines():
        topic, queue_id, offset, message_id, crc = line.split("\t")
        key = (topic, int(queue_id), int(offset))
        assert key not in acks, f"offset acknowledged twice: {key}"
        acks[key] = Ack(message_id, crc)
    return acks


def run_child_until_killed(data_dir: Path, work: Path, round_no: int, delay_s: float) -> None:
    ready = work / f"ready-{round_no}"
    log_path = work / f"child-{round_no}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}
    argv = [sys.executable, "-m", "tests.helpers.store_writer_child"]
    argv += [str(data_dir), str(work / f"acks-{round_no}.log"), str(ready), str(round_no)]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            assert proc.poll() is None, f"writer exited early ({proc.returncode}):\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"writer not ready after {READY_TIMEOUT_S} s:\n{log_path.read_text()}"
            time.sleep(0.02)
        time.sleep(delay_s)
        assert proc.poll() is None, f"writer died before the kill ({proc.returncode}):\n{log_path.read_text()}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=EXIT_TIMEOUT_S)


def read_queue(store: MessageStore, topic: str, queue_id: int) -> list[MessageRecord]:
    low, high = store.queue_bounds(topic, queue_id)
    assert low == 0, f"{topic}/{queue_id} starts at {low}: nothing is ever deleted here"
    out: list[MessageRecord] = []
    offset = 0
    while offset < high:
        result = store.read(topic, queue_id, offset, max_messages=READ_BATCH)
        assert result.status is ReadStatus.FOUND, (topic, queue_id, offset, result.status)
        out.extend(result.messages)
        offset = result.next_offset
    return out


def assert_intact(msg: MessageRecord) -> None:
    assert msg.body.startswith(msg.message_id.encode() + b"|"), f"body of {msg.message_id} is not its own"
    assert msg.properties["crc"] == f"{zlib.crc32(msg.body):08x}", f"body of {msg.message_id} changed"


def verify(data_dir: Path, acked: dict[tuple[str, int, int], Ack]) -> tuple[int, int]:
    """Open (= recover) the store and check it; returns (visible records, bytes recovery truncated)."""
    store = MessageStore(data_dir, child.CONFIG)
    try:
        visible: list[MessageRecord] = []
        for topic in child.TOPICS:
            for queue_id in child.QUEUE_IDS:
                msgs = read_queue(store, topic, queue_id)
                assert [m.queue_offset for m in msgs] == list(range(len(msgs))), f"gap in {topic}/{queue_id}"
                for m in msgs:
                    assert (m.topic, m.queue_id) == (topic, queue_id)
                    assert_intact(m)
                visible.extend(msgs)
                for (t, q, offset), ack in acked.items():
                    if (t, q) != (topic, queue_id):
                        continue
                    assert offset < len(msgs), f"acknowledged {t}/{q}@{offset} ({ack.message_id}) is lost"
                    m = msgs[offset]
                    assert (m.message_id, f"{zlib.crc32(m.body):08x}") == (ack.message_id, ack.body_crc)
        ids = [m.message_id for m in visible]
        assert len(ids) == len(set(ids)), "a record is visible twice"
        position = 0
        for m in sorted(visible, key=lambda m: m.physical_offset):
            assert m.physical_offset == position, f"unindexed bytes before {m.message_id} at {m.physical_offset}"
            position += m.size
        assert position == store.segments.max_offset(), "bytes after the last visible record"
        return len(visible), store.recovery.truncated_bytes
    finally:
        store.close()


@pytest.mark.slow
def test_acknowledged_records_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    data_dir = tmp_path / "store"
    acked: dict[tuple[str, int, int], Ack] = {}
    visible = 0
    for round_no in range(ROUNDS):
        run_child_until_killed(data_dir, tmp_path, round_no, rng.uniform(*KILL_AFTER_S))
        new = parse_acks(tmp_path / f"acks-{round_no}.log")
        reused = acked.keys() & new.keys()
        assert not reused, f"round {round_no} acknowledged offsets an earlier round had: {sorted(reused)[:5]}"
        acked.update(new)
        now_visible, _ = verify(data_dir, acked)
        assert now_visible >= visible, "recovery lost records that were visible before"
        visible = now_visible
    assert len(acked) > ROUNDS, "the writer hardly wrote anything: the test proved nothing"
    segments = list((data_dir / "commitlog").glob("*.log"))
    assert len(segments) > 1, "segments never rolled"
