"""The rows the `sluice` data source returns: one per stored message, in Arrow and in Spark terms.

| column | Spark type | meaning |
|---|---|---|
| cluster, broker, topic | string | where the message was stored (from the manifest) |
| queue_id | int | message queue id |
| queue_offset | bigint | offset in the queue |
| message_id | string | message id ("" if the producer set none) |
| keys | array<string> | message keys, in order |
| tag | string | null when none |
| message_group | string | FIFO message group; null when none |
| properties | map<string,string> | user properties |
| system_properties | map<string,string> | system properties |
| body | binary | the body exactly as stored (gzip-compressed when body_gzip) |
| body_gzip | boolean | the producer sent the body gzip-compressed |
| message_type | smallint | NORMAL 1, FIFO 2, DELAY 3, TRANSACTION 4 |
| born_timestamp, store_timestamp | timestamp | when the producer created it / the broker stored it |
| delivery_timestamp | timestamp | a timer message's delivery time; null = at once |
| delivery_attempt | bigint | delivery attempts already made when it was stored |
| born_host, store_host | string | producer and broker addresses |
| commitlog_position | bigint | where the record sat in the broker's CommitLog |
| object_key | string | the tiered segment object holding it; null when read from a broker |

Segment columns this version does not know are ignored (docs/tiered-format.md, Compatibility).
"""

from __future__ import annotations

import pyarrow as pa

_TS = pa.timestamp("us", tz="UTC")  # Spark's TimestampType is microseconds
_MAP = pa.map_(pa.string(), pa.string())

# Columns copied from the segment, with the type they have in the output.
SEGMENT_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("message_id", pa.string()),
    ("keys", pa.list_(pa.string())),
    ("tag", pa.string()),
    ("message_group", pa.string()),
    ("properties", _MAP),
    ("system_properties", _MAP),
    ("body", pa.binary()),
    ("body_gzip", pa.bool_()),
    ("message_type", pa.int16()),
    ("born_timestamp", _TS),
    ("store_timestamp", _TS),
    ("delivery_timestamp", _TS),
    ("delivery_attempt", pa.int64()),
    ("born_host", pa.string()),
    ("store_host", pa.string()),
    ("commitlog_position", pa.int64()),
)
LOCATION_COLUMNS = ("cluster", "broker", "topic")
READ_COLUMNS = [name for name, _ in SEGMENT_COLUMNS]

ARROW_SCHEMA = pa.schema(
    [pa.field(n, pa.string()) for n in LOCATION_COLUMNS]
    + [pa.field(n, t) for n, t in SEGMENT_COLUMNS]
    + [pa.field("object_key", pa.string())]
)

_DDL_TYPES = {
    pa.string(): "STRING", pa.int32(): "INT", pa.int64(): "BIGINT", pa.int16(): "SMALLINT", pa.binary(): "BINARY",
    pa.bool_(): "BOOLEAN", _TS: "TIMESTAMP", _MAP: "MAP<STRING, STRING>", pa.list_(pa.string()): "ARRAY<STRING>",
}  # fmt: skip


def shape(table: pa.Table, cluster: str, broker: str, topic: str, object_key: str | None) -> pa.Table:
    """Rows of a segment (or of a broker's `read_rows`, which has the same columns) in ARROW_SCHEMA:
    the location columns added, the columns this version does not know dropped. `object_key` is
    None for a message read from a broker rather than from a tiered object."""
    n = table.num_rows
    columns: list[pa.Array | pa.ChunkedArray] = [
        pa.array([cluster] * n, pa.string()), pa.array([broker] * n, pa.string()), pa.array([topic] * n, pa.string()),
    ]  # fmt: skip
    for name, kind in SEGMENT_COLUMNS:
        columns.append(table[name].cast(kind))
    columns.append(pa.array([object_key] * n, pa.string()))
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


PROPERTY_COLUMNS = ("properties", "system_properties")


def without_properties(table: pa.Table) -> pa.Table:
    """`table` (in ARROW_SCHEMA) with its property maps null: the streaming source's
    `includeProperties=false`, for sinks that do not want them stored."""
    for name in PROPERTY_COLUMNS:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), pa.nulls(table.num_rows, table.schema.field(i).type))
    return table


SPARK_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in ARROW_SCHEMA)
