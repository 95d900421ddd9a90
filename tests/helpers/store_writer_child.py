"""A store writer to be killed: the child process of tests/integration/test_store_crash.py.

    python -m tests.helpers.store_writer_child DATA_DIR ACK_LOG READY_FILE ROUND

Opens the store under the `sync` flush policy, creates READY_FILE, then appends from several
asyncio tasks (batches of random size to random queues, with short random pauses) until it is
killed or `MAX_RUN_S` passes.
Only after an append has returned does it log each acknowledged record to ACK_LOG, one line per
record, each line a single `write` to an O_APPEND descriptor:

    topic <TAB> queue id <TAB> queue offset <TAB> message id <TAB> crc32 of the body (8 hex digits)

Every body starts with its message id and the record carries the body's CRC in property `crc`, so
the verifier can check records that were written but never acknowledged as well.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
import zlib
from pathlib import Path

from broker.store.config import CommitLogConfig, StoreConfig
from broker.store.store import MessageStore
from common.record import MessageRecord

TOPICS = ("crash-a", "crash-b")
QUEUE_IDS = range(4)
SEGMENT_BYTES = 256 << 10
CONFIG = StoreConfig(commitlog=CommitLogConfig(segment_bytes=SEGMENT_BYTES, flush_policy="sync"))
TASKS = 4
MAX_BATCH = 8
MAX_BODY_BYTES = 3000
# A short random pause after each append keeps the data small (~2,000 records a second) so the
# verifier can read everything back every round; the tasks still overlap in group commits.
MAX_PAUSE_S = 0.02
MAX_RUN_S = 60.0  # never outlive a parent that failed to kill us


def make_record(rng: random.Random, message_id: str) -> MessageRecord:
    body = message_id.encode() + b"|" + rng.randbytes(rng.randint(0, MAX_BODY_BYTES))
    return MessageRecord(
        topic=rng.choice(TOPICS),
        queue_id=rng.choice(QUEUE_IDS),
        body=body,
        message_id=message_id,
        properties={"crc": f"{zlib.crc32(body):08x}"},
    )


async def writer(store: MessageStore, ack_fd: int, round_no: int, task: int, deadline: float) -> None:
    rng = random.Random(f"{round_no}-{task}")
    n = 0
    while time.monotonic() < deadline:
        batch = []
        for _ in range(rng.randint(1, MAX_BATCH)):
            batch.append(make_record(rng, f"r{round_no}-t{task}-{n}"))
            n += 1
        results = await store.append(batch)
        for rec, res in zip(batch, results, strict=True):
            line = f"{rec.topic}\t{rec.queue_id}\t{res.queue_offset}\t{rec.message_id}\t{zlib.crc32(rec.body):08x}\n"
            os.write(ack_fd, line.encode())
        await asyncio.sleep(rng.uniform(0, MAX_PAUSE_S))


async def main(data_dir: Path, ack_log: Path, ready_file: Path, round_no: int) -> None:
    store = MessageStore(data_dir, CONFIG)
    ack_fd = os.open(ack_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.close(os.open(ready_file, os.O_WRONLY | os.O_CREAT, 0o644))
        deadline = time.monotonic() + MAX_RUN_S
        async with asyncio.TaskGroup() as tg:
            for task in range(TASKS):
                tg.create_task(writer(store, ack_fd, round_no, task, deadline))
    finally:
        os.close(ack_fd)
        store.close()


if __name__ == "__main__":
    data_arg, ack_arg, ready_arg, round_arg = sys.argv[1:5]
    asyncio.run(main(Path(data_arg), Path(ack_arg), Path(ready_arg), int(round_arg)))
