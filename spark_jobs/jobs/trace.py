"""`trace`: every stored message with one of the given keys or message ids, across topics and time.

The keys and ids travel to the executors as source options (`key`, `messageId`), so rows are matched
in Arrow before they reach Spark; segments cannot be pruned by key (the manifest does not index
keys), so narrow a trace with a topic or a time range when the archive is large. Rows are ordered by
store time, then topic, broker, queue and offset, and say where each message sits.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

TIER = "archive"  # everything this source reads sits in the tiered archive (the bucket)
COLUMNS = (
    "store_timestamp", "topic", "cluster", "broker", "queue_id", "queue_offset", "message_id", "keys", "tag",
    "message_group", "tier", "object_key",
)  # fmt: skip


def trace(df: DataFrame) -> DataFrame:
    """`df` already carries the key / message id options; this shapes and orders the rows."""
    shaped = df.withColumn("tier", F.lit(TIER))
    return shaped.select(*COLUMNS).orderBy("store_timestamp", "topic", "broker", "queue_id", "queue_offset")
