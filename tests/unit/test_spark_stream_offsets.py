"""The streaming source's offset documents, start options and per-trigger budget (no Spark, no broker)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from common.errors import BadRequest
from spark_jobs.schema import ARROW_SCHEMA, without_properties
from spark_jobs.stream.offsets import EARLIEST, LATEST, QueueKey, from_json, to_json
from spark_jobs.stream.options import StreamOptions
from spark_jobs.stream.reader import TriggerDelay, cap

A0, A1, B0 = QueueKey("orders", "broker-a", 0), QueueKey("orders", "broker-a", 10), QueueKey("audit", "broker-b", 2)


def test_offsets_are_canonical_json_and_round_trip() -> None:
    doc = to_json({A1: 7, B0: 3, A0: 5})
    text = json.dumps(doc)
    assert text == json.dumps(doc, sort_keys=True)
    assert text == (
        '{"queues": {"audit": {"broker-b": {"2": 3}}, "orders": {"broker-a": {"0": 5, "10": 7}}}, "version": 1}'
    )
    assert from_json(json.loads(text)) == {A0: 5, A1: 7, B0: 3}
    assert to_json({}) == {"queues": {}, "version": 1}


@pytest.mark.parametrize(
    "doc",
    [
        {"queues": {}},  # no version
        {"queues": {}, "version": 2},  # a newer one
        {"version": 1, "queues": {"t": {"b": {"x": 1}}}},  # queue id not a number
        {"version": 1, "queues": {"t": {"b": {"0": -1}}}},  # special values only in startingOffsets
        {"version": 1, "queues": {"t": {"b": {"0": True}}}},
        {"version": 1, "queues": {"t": ["b"]}},
        {"topic-partition": 5},  # Kafka's
    ],
)
def test_foreign_or_damaged_offsets_are_refused(doc: object) -> None:
    with pytest.raises(BadRequest):
        from_json(doc)


def test_starting_offsets_options() -> None:
    base = {"namesrv": "127.0.0.1:9876", "topics": "orders, audit"}
    opts = StreamOptions.parse(base)
    assert (opts.starting, opts.topics, opts.namesrv, opts.fail_on_data_loss) == (
        "latest", frozenset({"orders", "audit"}), ("127.0.0.1:9876",), True,
    )  # fmt: skip
    assert StreamOptions.parse({**base, "STARTINGOFFSETS": "Earliest"}).starting == "earliest"
    explicit = StreamOptions.parse({**base, "startingOffsets": '{"orders": {"broker-a": {"0": 12, "1": -2, "2": -1}}}'})
    assert explicit.starting == {
        QueueKey("orders", "broker-a", 0): 12, QueueKey("orders", "broker-a", 1): EARLIEST,
        QueueKey("orders", "broker-a", 2): LATEST,
    }  # fmt: skip
    pattern = StreamOptions.parse({"namesrv": "h:1", "topicPattern": "ord.*", "maxRecordsPerTrigger": "100"})
    assert pattern.wants_topic("orders") and not pattern.wants_topic("audit-orders")
    assert pattern.max_records_per_trigger == 100
    timed = StreamOptions.parse({**base, "startingTimestamp": "2024-06-01T12:00:00Z", "minRecordsPerTrigger": "5"})
    assert (timed.starting_timestamp_ms, timed.min_records_per_trigger) == (1717243200000, 5)
    assert timed.max_trigger_delay_s == 900.0  # Kafka's default, 15m
    assert [
        StreamOptions.parse({**base, "minRecordsPerTrigger": "1", "maxTriggerDelay": d}).max_trigger_delay_s
        for d in ("90", "500ms", "30s", "2m", "1h")
    ] == [90.0, 0.5, 30.0, 120.0, 3600.0]


def test_include_properties_false_nulls_only_the_property_maps() -> None:
    assert StreamOptions.parse({"namesrv": "h:1", "topics": "t"}).include_properties
    assert not StreamOptions.parse({"namesrv": "h:1", "topics": "t", "includeProperties": "FALSE"}).include_properties
    row = {f.name: None for f in ARROW_SCHEMA}
    row.update(topic="t", queue_id=1, properties=[("a", "b")], system_properties=[("TAGS", "x")], keys=["k"])
    table = pa.Table.from_pylist([row, row], schema=ARROW_SCHEMA)
    out = without_properties(table)
    assert out.schema == ARROW_SCHEMA
    assert out["properties"].null_count == 2 and out["system_properties"].null_count == 2
    assert out.drop_columns(["properties", "system_properties"]) == table.drop_columns(
        ["properties", "system_properties"]
    )


def test_a_small_backlog_waits_for_min_records_but_not_past_the_delay() -> None:
    delay = TriggerDelay(least=10, delay_s=60.0)
    assert not delay.ready(3, now=1000.0)  # the first call starts the clock
    assert not delay.ready(9, now=1059.0)
    assert delay.ready(10, now=1059.5)  # enough messages: a batch, and the clock restarts
    assert not delay.ready(1, now=1100.0)
    assert delay.ready(1, now=1119.5)  # 60 s since the last batch: whatever waits is read
    assert not delay.ready(0, now=5000.0)  # nothing to read is never a batch


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "t"}, "option namesrv is required"),
        ({"namesrv": "h:1"}, "option topics"),
        ({"namesrv": "h:1,h:2", "topics": "t"}, "option namesrv"),
        ({"namesrv": "h:1", "topicPattern": "("}, "topicPattern"),
        ({"namesrv": "h:1", "topics": "t", "startingOffsets": "{"}, "startingOffsets"),
        ({"namesrv": "h:1", "topics": "t", "startingOffsets": '{"t": {"b": {"0": -3}}}'}, "startingOffsets"),
        ({"namesrv": "h:1", "topics": "t", "maxRecordsPerTrigger": "-5"}, "maxRecordsPerTrigger"),
        ({"namesrv": "h:1", "topics": "t", "failOnDataLoss": "yes"}, "failOnDataLoss"),
        ({"namesrv": "h:1", "topics": "t", "timeoutS": "0"}, "timeoutS"),
        ({"namesrv": "h:1", "topics": "t", "readRows": "x"}, "readRows"),
        ({"namesrv": "h:1", "topics": "t", "startingTimestamp": "yesterday"}, "option startingTimestamp 'yesterday'"),
        ({"namesrv": "h:1", "topics": "t", "startingTimestamp": "0", "startingOffsets": "earliest"}, "exclude"),
        ({"namesrv": "h:1", "topics": "t", "minRecordsPerTrigger": "0"}, "minRecordsPerTrigger must be positive"),
        ({"namesrv": "h:1", "topics": "t", "maxTriggerDelay": "5m"}, "maxTriggerDelay needs minRecordsPerTrigger"),
        ({"namesrv": "h:1", "topics": "t", "minRecordsPerTrigger": "5", "maxTriggerDelay": "soon"}, "duration"),
        ({"namesrv": "h:1", "topics": "t", "minRecordsPerTrigger": "9", "maxRecordsPerTrigger": "5"}, "is above"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        StreamOptions.parse(options)


def test_the_budget_is_spread_by_backlog_and_never_exceeded() -> None:
    begin = {A0: 100, A1: 0, B0: 50}
    ends = {A0: 400, A1: 100, B0: 50, QueueKey("new", "broker-a", 0): 10}  # B0 has no backlog; "new" is new
    capped = cap(begin, ends, 41)
    read = {k: capped[k] - begin.get(k, 0) for k in ends}
    assert sum(read.values()) == 41
    assert read[B0] == 0 and read[A0] > read[A1] > 0
    assert all(0 <= read[k] <= ends[k] - begin.get(k, 0) for k in ends)
    assert cap(begin, ends, 10_000) == ends  # within the budget: unchanged
    assert cap(begin, ends, 41) == capped  # deterministic
    one = cap({A0: 0, A1: 0}, {A0: 5, A1: 5}, 1)
    assert sum(one.values()) == 1
