"""The `sluice` Spark data source (Spark 4's Python data source API): batch reads of the tiered
archive, streaming reads from the brokers (`spark.readStream.format("sluice")`, stream/) and
writes to them (`df.write` / `df.writeStream.format("sluice")`, stream/sink.py).

    from spark_jobs.source import register
    register(spark)
    df = (spark.read.format("sluice").option("endpoint", URL).option("bucket", B)
          .option("topic", "orders").option("from", "2024-06-01T12:00:00Z").option("to", "...").load())

`register` registers the source in a session and turns on `spark.sql.python.filterPushdown.enabled`
(Spark refuses a Python reader that implements `pushFilters` without it). Options: options.py;
rows: schema.py; planning and pruning: planner.py; executor reads: scan.py.

Filter pushdown: equality and `IN` on `cluster`, `broker`, `topic`, `queue_id`, `message_id` and
comparisons on `queue_offset` and `store_timestamp` narrow the scan (fewer manifests, segments and
row groups are fetched). Every filter is also handed back to Spark, which evaluates it again on the
rows: pushdown only prunes, so its result never depends on how Spark represents a literal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from spark_jobs.options import ScanOptions
from spark_jobs.planner import ScanTask, plan_scan
from spark_jobs.scan import read_task, shared_store
from spark_jobs.schema import SPARK_DDL
from spark_jobs.stream.options import StreamOptions
from spark_jobs.stream.reader import SluiceStreamReader
from spark_jobs.stream.sink import SinkOptions, SluiceBatchWriter, SluiceStreamWriter

NAME = "sluice"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("sluice")` available in this session."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(SluiceDataSource)


class SluiceDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return SluiceReader(ScanOptions.parse(dict(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(StreamOptions.parse(dict(self.options)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return SluiceBatchWriter(SinkOptions.parse(dict(self.options), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return SluiceStreamWriter(SinkOptions.parse(dict(self.options), schema))


class _TaskPartition(InputPartition):
    def __init__(self, tasks: list[ScanTask]) -> None:
        super().__init__(tasks[0].segment.key)
        self.tasks = tasks


def _ms_floor(value: Any) -> int | None:
    # Spark hands TIMESTAMP literals over as aware datetimes. A naive one (TIMESTAMP_NTZ) names no
    # instant, and guessing its zone could prune rows that match: it does not narrow the scan.
    if isinstance(value, datetime) and value.tzinfo is not None:
        return int(value.timestamp() * 1000)
    return None


def _values(f: Filter) -> frozenset[Any] | None:
    if isinstance(f, EqualTo):
        return frozenset([f.value])
    if isinstance(f, In):
        return frozenset(f.value)
    return None


def _narrow(current: frozenset[Any] | None, values: frozenset[Any]) -> frozenset[Any]:
    return values if current is None else current & values


def narrow_options(opts: ScanOptions, filters: Iterable[Filter]) -> ScanOptions:
    """The options with what the filters say added (never widened: a scan can only get smaller)."""
    changes: dict[str, Any] = {}

    def cur(name: str) -> Any:
        return changes.get(name, getattr(opts, name))

    for f in filters:
        column: tuple[str, ...] = getattr(f, "attribute", ())
        if len(column) != 1:
            continue
        name, values = column[0], _values(f)
        if values is not None and all(isinstance(v, str) for v in values):
            field = {"cluster": "clusters", "broker": "brokers", "topic": "only_topics", "message_id": "message_ids"}
            if name in field:
                changes[field[name]] = _narrow(cur(field[name]), values)
        if name == "queue_id" and values is not None and all(isinstance(v, int) for v in values):
            changes["queues"] = _narrow(cur("queues"), values)
        value = getattr(f, "value", None)
        if name == "queue_offset" and isinstance(value, int) and not isinstance(value, bool):
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                changes["from_offset"] = max(cur("from_offset"), value)
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                changes["to_offset"] = min(cur("to_offset"), value + 1)
        ms = _ms_floor(value)
        if name == "store_timestamp" and ms is not None:
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                changes["from_ms"] = max(cur("from_ms"), ms)
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                changes["to_ms"] = min(cur("to_ms"), ms + 1)
    if changes.get("from_ms", opts.from_ms) > changes.get("to_ms", opts.to_ms):
        changes["to_ms"] = changes.get("from_ms", opts.from_ms)  # contradictory filters: nothing matches
    if changes.get("from_offset", opts.from_offset) > changes.get("to_offset", opts.to_offset):
        changes["to_offset"] = changes.get("from_offset", opts.from_offset)
    return dataclasses.replace(opts, **changes) if changes else opts


class SluiceReader(DataSourceReader):
    def __init__(self, opts: ScanOptions) -> None:
        self.opts = opts

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.opts = narrow_options(self.opts, filters)
        return filters  # Spark evaluates them again: pushdown prunes, it does not decide rows

    def partitions(self) -> Sequence[InputPartition]:
        # No task (nothing in range): Spark then reads one default partition, which yields no rows.
        return [_TaskPartition(p) for p in plan_scan(self.opts).partitions]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _TaskPartition):
            store = shared_store(self.opts.s3)
            for task in partition.tasks:
                yield from read_task(task, self.opts, store)
