"""`topic-stats`: messages, bytes, distinct keys and distinct message groups per topic per hour (or minute).

`bytes` is the sum of the bodies' sizes as stored (a gzip-compressed body counts compressed). Windows
are UTC, named by their start. Distinct counts are exact. Rows are ordered by topic, then window.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

GRANULARITIES = ("hour", "minute")
COLUMNS = ("topic", "window_start", "messages", "bytes", "distinct_keys", "message_groups")


def topic_stats(df: DataFrame, granularity: str = "hour") -> DataFrame:
    """One row per (topic, window) that has messages."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    base = df.select(
        "topic", F.date_trunc(granularity, "store_timestamp").alias("window_start"), "keys", "message_group",
        F.length("body").alias("body_bytes"),
    )  # fmt: skip
    counts = base.groupBy("topic", "window_start").agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum("body_bytes").cast("long").alias("bytes"),
        F.countDistinct("message_group").alias("message_groups"),
    )
    keys = (
        base.select("topic", "window_start", F.explode("keys").alias("key"))
        .groupBy("topic", "window_start")
        .agg(F.countDistinct("key").alias("distinct_keys"))
    )
    joined = counts.join(keys, ["topic", "window_start"], "left").fillna(0, subset=["distinct_keys"])
    return joined.select(*COLUMNS).orderBy("topic", "window_start")
