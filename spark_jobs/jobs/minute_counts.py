"""`stream`: a per-minute count of messages per topic and tag, kept up to date from the brokers.

A checkpointed streaming query (`readStream.format("sluice")`) whose every micro-batch counts its
messages per (topic, tag, UTC minute of the store time) and writes those counts as Parquet to
`<output>/batch_id=<id>/`, replacing what a previous attempt of the same batch wrote. A batch
replayed after a crash therefore rewrites its own part instead of adding to it, and the checkpoint
says which batches ran: the table is exactly-once and the job restartable. The count of a minute is
the sum of its rows over the batches (`minute_totals`), because a minute's messages can arrive in
several batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

COLUMNS = ("topic", "tag", "minute", "messages")


def batch_counts(df: DataFrame) -> DataFrame:
    """The messages of one batch (or any frame of the source's rows) per topic, tag and UTC minute."""
    minute = F.date_trunc("minute", "store_timestamp").alias("minute")
    counts = df.groupBy("topic", "tag", minute).agg(F.count(F.lit(1)).cast("long").alias("messages"))
    return counts.select(*COLUMNS)


def start(
    spark: SparkSession,
    options: Mapping[str, str],
    output: str,
    checkpoint: str,
    *,
    trigger_interval_s: float = 0.0,
) -> StreamingQuery:
    """Start the counting query: `trigger_interval_s` 0 = AvailableNow (read what is there, stop)."""
    source = spark.readStream.format("sluice").options(**options).load()

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        # Overwrite: a replayed batch (same id, same offsets) replaces its earlier, possibly partial, part.
        batch_counts(batch).coalesce(1).write.mode("overwrite").parquet(f"{output.rstrip('/')}/batch_id={batch_id}")

    writer = source.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
    writer = (
        writer.trigger(availableNow=True)
        if trigger_interval_s <= 0
        else writer.trigger(processingTime=f"{trigger_interval_s} seconds")
    )
    return writer.queryName("sluice-minute-counts").start()


def minute_totals(spark: SparkSession, output: str) -> list[dict[str, Any]]:
    """The table's counts summed over batches, ordered by topic, minute and tag; [] before any batch."""
    if "://" not in output and not any(Path(output).glob("batch_id=*")):
        return []
    table = spark.read.parquet(output)
    totals = table.groupBy("topic", "tag", "minute").agg(F.sum("messages").cast("long").alias("messages"))
    ordered = totals.select(*COLUMNS).orderBy("topic", "minute", F.col("tag").asc_nulls_first())
    return [r.asDict() for r in ordered.collect()]
