"""Reading one queue range from its broker on an executor: bulk `read_rows` calls, Arrow in, Arrow out.

Each call returns up to `readRows` consecutive messages as Arrow rows of the tiered segment schema
(the broker builds them with the uploader's own conversion, so a row is the one the archive holds
for that (queue, offset)); they are shaped to the source's columns (`schema.shape`, `object_key`
null) and yielded as they come. Messages the broker no longer has (retention) are a data loss: an
`OffsetNotFound` naming the queue and the missing range, or with `failOnDataLoss=false` a warning
and a skip. A queue that holds fewer messages than the batch planned (recreated, or its tail lost)
fails the task: re-reading different messages under the same offsets would break exactly-once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from broker.client.api import BrokerApi
from broker.client.remote import RemoteBroker
from common.errors import OffsetNotFound, PreconditionFailed
from common.logs import kv
from spark_jobs.schema import shape, without_properties
from spark_jobs.stream.offsets import QueueKey
from spark_jobs.stream.options import StreamOptions

log = logging.getLogger("sluice.spark.stream")


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Messages [start, end) of one queue. `fresh`: the queue appeared after the batch's start
    offsets were taken, so it is read from its oldest message and a start below it is no loss."""

    key: QueueKey
    cluster: str
    address: str
    start: int
    end: int
    fresh: bool = False


def read_partition(part: QueuePartition, opts: StreamOptions) -> Iterator[pa.RecordBatch]:
    loop = asyncio.new_event_loop()
    try:
        broker = loop.run_until_complete(_connect(part, opts))
        try:
            yield from read_range(loop, broker, part, opts)
        finally:
            loop.run_until_complete(broker.close())
    finally:
        loop.close()


async def _connect(part: QueuePartition, opts: StreamOptions) -> RemoteBroker:
    return RemoteBroker(part.key.broker, part.address, timeout_s=opts.timeout_s)  # the channel joins this loop


def read_range(
    loop: asyncio.AbstractEventLoop, broker: BrokerApi, part: QueuePartition, opts: StreamOptions
) -> Iterator[pa.RecordBatch]:
    """The partition's rows from `broker` (any `BrokerApi` running on `loop`), one bulk call at a time."""
    key, offset = part.key, part.start
    while offset < part.end:
        got = loop.run_until_complete(
            broker.read_rows(key.topic, key.queue_id, offset, part.end, opts.read_rows, opts.read_bytes)
        )
        if got.count == 0:
            if got.min_offset > offset:
                resume = min(got.min_offset, part.end)
                _lost(key, offset, resume, part.fresh or not opts.fail_on_data_loss)
                offset = resume
                continue
            raise PreconditionFailed(
                f"{key} holds messages up to offset {got.max_offset}, but the batch was planned up to {part.end}: "
                "the topic was deleted and recreated, or messages were lost; start the query from a new checkpoint"
            )
        table = pa.ipc.open_stream(pa.py_buffer(got.rows)).read_all()
        offsets = table["queue_offset"]
        if table.num_rows != got.count or offsets[0].as_py() != offset or offsets[-1].as_py() != offset + got.count - 1:
            raise PreconditionFailed(f"{key}: the broker answered rows other than [{offset}, {offset + got.count})")
        shaped = shape(table, part.cluster, key.broker, key.topic, None)
        yield from (shaped if opts.include_properties else without_properties(shaped)).to_batches()
        fault(opts, offset + got.count - part.start)
        offset = got.next_offset


def _lost(key: QueueKey, start: int, end: int, tolerated: bool) -> None:
    if not tolerated:
        raise OffsetNotFound(
            f"data loss: messages [{start}, {end}) of {key} were removed (retention) before the query read them; "
            "set failOnDataLoss=false to skip them"
        )
    log.warning("messages removed before the query read them: skipped",
                extra=kv(topic=key.topic, broker=key.broker, queue=key.queue_id, start=start, end=end))  # fmt: skip


def fault(opts: StreamOptions, rows: int) -> None:
    """`testFaultFile` (tests only): the first task to create the file fails after `rows` rows, as an
    executor dying mid-partition would; every later one (the query's restart included) reads on."""
    if not opts.fault_file:
        return
    try:
        os.close(os.open(opts.fault_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    raise RuntimeError(f"injected executor failure (testFaultFile {opts.fault_file}) after {rows} rows")
