"""`SluiceStreamReader`: Spark's streaming reader over the brokers (the driver's half; executors run hot.py).

- `initialOffset`: per queue, the oldest readable offset (`earliest`), the acknowledged end
  (`latest`), the JSON of `startingOffsets`, or with `startingTimestamp` the first message stored
  at or after that time (the broker's time search).
- `latestOffset(start, limit)`: per queue the acknowledged end (never a tail a new primary could
  replace), never below `start`; a queue or broker that appeared is added (and read from its oldest
  message); `maxRecordsPerTrigger` (or Spark's own limit) spreads a budget over the queues by
  backlog; under `Trigger.AvailableNow` never past the ends taken when the query started. With
  `minRecordsPerTrigger`, a backlog below it is left for later (the batch's end is its start, so
  Spark plans no batch) until `maxTriggerDelay` has passed since the last batch (`TriggerDelay`);
  AvailableNow never waits.
- `partitions(start, end)`: one partition per queue with messages in `[start, end)`. A replayed
  batch reads exactly its logged range: the offsets are dense per queue and never reused.
- `commit(end)` and `latestOffset(start)`: with the `group` option, the end of each batch Spark
  committed becomes that consumer group's offsets (`reset_offset`), so `sluice admin group
  describe`, the console and the lag metric show how far behind the query is. Best effort, after
  Spark's own commit (Spark never calls `commit` for an AvailableNow run's last batch, but asks
  `latestOffset` once more from its end): the checkpoint stays the truth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from common.errors import BadRequest, OffsetNotFound, PreconditionFailed, SluiceError, Unavailable
from common.logs import kv
from spark_jobs.stream.cold import ColdPartition, read_cold, split
from spark_jobs.stream.discovery import QueueRange, commit_group, discover, offsets_for_time
from spark_jobs.stream.hot import QueuePartition, read_partition
from spark_jobs.stream.offsets import EARLIEST, LATEST, Positions, QueueKey, from_json, lost_from_json, to_json
from spark_jobs.stream.options import StreamOptions

log = logging.getLogger("sluice.spark.stream")


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: StreamOptions) -> None:
        self.opts = opts
        self._ranges: dict[QueueKey, QueueRange] = {}
        self._target: Positions | None = None  # Trigger.AvailableNow: the ends when the query started
        self._committed: Positions = {}  # what commit() last gave the group
        least = opts.min_records_per_trigger
        self._delay = None if least is None else TriggerDelay(least, opts.max_trigger_delay_s)

    def _discover(self) -> dict[QueueKey, QueueRange]:
        self._ranges = discover(self.opts)
        return self._ranges

    # -- offsets ---------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        ranges = self._discover()
        starting = self.opts.starting
        if isinstance(starting, dict) and (unknown := sorted(set(starting) - set(ranges))):
            raise BadRequest(f"option startingOffsets names {unknown[0]}, which the cluster does not have")
        if self.opts.starting_timestamp_ms is not None:
            return to_json(offsets_for_time(self.opts, list(ranges.values()), self.opts.starting_timestamp_ms))
        positions: Positions = {}
        for key, r in ranges.items():
            wanted = EARLIEST if starting == "earliest" else LATEST if starting == "latest" else EARLIEST
            if isinstance(starting, dict):
                wanted = starting.get(key, EARLIEST)
            positions[key] = r.min_offset if wanted == EARLIEST else r.acked_offset if wanted == LATEST else wanted
        return to_json(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {key: r.acked_offset for key, r in self._discover().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin, lost = from_json(start), lost_from_json(start)
        ranges = self._discover()
        ends: Positions = dict(begin)  # a queue no longer listed (broker down, topic deleted) stays where it is
        lowest: Positions = dict(begin)  # where each queue's readable backlog starts
        for key, r in ranges.items():
            at = begin.get(key, 0)
            if at > r.max_offset:
                raise PreconditionFailed(
                    f"{key} ends at offset {r.max_offset}, before the query's position {at}: the topic was "
                    "deleted and recreated, or its newest messages were lost; start from a new checkpoint"
                )
            if key in begin and at < r.min_offset and self.opts.fail_on_data_loss:
                raise OffsetNotFound(
                    f"data loss: messages [{at}, {r.min_offset}) of {key} were removed (retention) before the "
                    "query read them; set failOnDataLoss=false to skip them"
                )
            lowest[key] = max(at, min(r.min_offset, r.acked_offset))
            end = max(lowest[key], r.acked_offset)
            if self._target is not None:
                end = max(lowest[key], min(end, self._target.get(key, at)))
            ends[key] = end
        if isinstance(limit, ReadMaxRows):
            ends = cap(lowest, ends, limit.max_rows)
        if self.opts.max_bytes_per_trigger is not None:
            sizes = {key: r.message_bytes for key, r in ranges.items()}
            ends = cap(lowest, ends, self.opts.max_bytes_per_trigger, sizes)
        if self._delay is not None and self._target is None:
            backlog = sum(e - lowest.get(key, 0) for key, e in ends.items())
            if not self._delay.ready(backlog, time.monotonic()):
                ends = dict(begin)
        lost = dict(lost)
        for key, at in begin.items():
            if lowest[key] > at and ends[key] > at:  # this batch steps over messages retention removed
                lost[key] = lost.get(key, 0) + lowest[key] - at
                log.warning("messages removed before the query read them: skipped (failOnDataLoss=false)",
                            extra=kv(queue=str(key), start=at, end=lowest[key], lost_total=lost[key]))  # fmt: skip
        self._commit_group(begin)  # the end of the batch Spark committed last (commit() misses the final one)
        return to_json(ends, lost)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json({key: r.acked_offset for key, r in self._ranges.items()}) if self._ranges else None

    # -- batches ---------------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        wanted = {key: (begin.get(key, 0), e) for key, e in stop.items() if e > begin.get(key, 0)}
        if any(key not in self._ranges for key in wanted):  # a restarted query replays its last batch first
            self._discover()
        for key, (lo, hi) in sorted(wanted.items()):
            if key not in self._ranges:
                raise Unavailable(f"{key} is not in the cluster's routes now; its batch [{lo}, {hi}) cannot be read")
        parts: list[InputPartition]
        if self.opts.archive is not None:
            parts = split(wanted, self._ranges, begin, self.opts.archive)
        else:
            parts = [_hot(key, self._ranges[key], lo, hi, key not in begin) for key, (lo, hi) in sorted(wanted.items())]
        cold = sum(p.end - p.start for c in parts if isinstance(c, ColdPartition) for p in c.pieces)
        messages = sum(hi - lo for lo, hi in wanted.values())
        log.info("micro-batch planned", extra=kv(partitions=len(parts), messages=messages, from_archive=cold))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, QueuePartition):
            yield from read_partition(partition, self.opts)
        elif isinstance(partition, ColdPartition):
            yield from read_cold(partition, self.opts)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_group(from_json(end))

    def _commit_group(self, positions: Positions) -> None:
        """With `group`: make positions Spark committed that group's offsets (best effort)."""
        if not self.opts.group:
            return
        changed = {key: at for key, at in positions.items() if self._committed.get(key) != at}
        addresses = {key: r.address for key, r in self._ranges.items()}
        wanted = {k: (addresses[k], at) for k, at in changed.items() if k in addresses}
        try:
            commit_group(self.opts, self.opts.group, wanted)
        except SluiceError as exc:  # lag shown late is better than a failed query
            log.warning("could not commit the query's offsets to its group",
                        extra=kv(group=self.opts.group, error=str(exc)))  # fmt: skip
            return
        self._committed.update({k: at for k, (_, at) in wanted.items()})


def _hot(key: QueueKey, r: QueueRange, lo: int, hi: int, fresh: bool) -> QueuePartition:
    return QueuePartition(key, r.cluster, r.address, lo, hi, fresh=fresh)


class TriggerDelay:
    """`minRecordsPerTrigger` with `maxTriggerDelay`: a batch starts once `least` messages wait or
    `delay_s` has passed since the previous batch started (or since the query did)."""

    def __init__(self, least: int, delay_s: float) -> None:
        self.least, self.delay_s = least, delay_s
        self._last: float | None = None

    def ready(self, backlog: int, now: float) -> bool:
        if self._last is None:
            self._last = now
        if backlog <= 0 or (backlog < self.least and now - self._last < self.delay_s):
            return False
        self._last = now
        return True


def cap(begin: Positions, ends: Positions, budget: int, sizes: Mapping[QueueKey, int] | None = None) -> Positions:
    """`ends` moved back so that at most `budget` messages (with `sizes`: bytes, each message of a
    queue counted at its size) are read in all: each queue gets a share proportional to its backlog
    (rounded down), the rest goes one by one to the largest backlogs; a byte budget smaller than
    any message still reads one, so the query moves."""
    backlog = {key: e - begin.get(key, 0) for key, e in ends.items() if e > begin.get(key, 0)}
    weight = {key: n * (sizes.get(key, 1) if sizes is not None else 1) for key, n in backlog.items()}
    total = sum(weight.values())
    if total <= budget:
        return ends
    share = {key: backlog[key] * budget // total for key in backlog}
    left = budget - sum(share.values()) if sizes is None else (0 if any(share.values()) else 1)
    for key in sorted(backlog, key=lambda k: (-(backlog[k] - share[k]), k)):
        if left <= 0:
            break
        if share[key] < backlog[key]:
            share[key] += 1
            left -= 1
    capped = dict(ends)
    for key, n in share.items():
        capped[key] = begin.get(key, 0) + n
    return capped
