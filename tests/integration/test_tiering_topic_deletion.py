"""A deleted topic's tiered archive goes with it: a real `LocalBroker` tiering to moto S3, and the
`sluice` Spark source reading that bucket in a real local SparkSession.

- Messages tiered and evicted from local disk (the bucket holds the only copy), then the topic is
  deleted and created again: a new group from the earliest message, a pull from offset 0, lookups
  by id and key, the bucket's manifest.json and a Spark scan of the topic see only what was sent
  after, and the old objects are deleted from the bucket. The new messages tier and read back cold.
- A deletion the tiering did not hear of (applied while no broker ran on the store, as a replica
  applies its primary's deletion before it is promoted) is caught up with when tiering attaches.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.client.api import ConsumeFrom, GroupSpec, TopicSpec
from broker.local import LocalBroker
from broker.tiering.config import TieringConfig
from broker.tiering.runtime import BrokerTiering
from broker.tiering.stores import open_object_store
from tests.helpers.tiering import BROKER, CLUSTER, fill, open_rig
from tests.integration.test_tiering_broker import (
    QUEUES,
    TOPIC,
    broker_config,
    pop_all,
    produce,
    pull_all,
    run,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.helpers.s3 import MotoS3Server

pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]
pytestmark = pytest.mark.slow

OLD, NEW = 200, 30  # messages sent before the deletion and after


@pytest.fixture
def tiering(s3_config: TieringConfig) -> TieringConfig:
    # min_age_s keeps the background uploader idle: the test decides when data is tiered.
    return dataclasses.replace(s3_config, min_age_s=3600.0, segment_target_bytes=16 << 10, row_group_rows=16,
                               row_group_bytes=8 << 10, mirror_interval_s=0.0)  # fmt: skip


def bucket_keys(s3_server: MotoS3Server, config: TieringConfig) -> set[str]:
    listed = s3_server.client().list_objects_v2(Bucket=config.bucket, Prefix=config.prefix)
    return {o["Key"] for o in listed.get("Contents", [])}


def manifest(s3_server: MotoS3Server, config: TieringConfig, topic: str) -> dict[str, Any]:
    key = f"{config.prefix}/tier-test/broker-t/{topic}/manifest.json"
    doc: dict[str, Any] = json.loads(s3_server.client().get_object(Bucket=config.bucket, Key=key)["Body"].read())
    return doc


async def pulled_ids(broker: LocalBroker) -> list[str]:
    """The ids a pull of every queue from offset 0 finds."""
    found = [m.message_id for q in range(QUEUES) for m in await pull_all(broker, q)]
    return sorted(found)


def spark_ids(spark: SparkSession, s3_server: MotoS3Server, config: TieringConfig) -> list[str]:
    from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY

    df = spark.read.format("sluice").options(
        endpoint=s3_server.endpoint_url, bucket=config.bucket, prefix=config.prefix, region=REGION,
        accessKeyId=ACCESS_KEY, secretAccessKey=SECRET_KEY, addressingStyle="path", topics=TOPIC,
    ).load()  # fmt: skip
    return sorted(r["message_id"] for r in df.select("message_id").collect())


def test_a_deleted_topics_archive_is_gone_for_the_broker_the_bucket_and_spark(
    tmp_path: Path, tiering: TieringConfig, s3_server: MotoS3Server, spark: SparkSession
) -> None:
    new_ids = [f"msg-{i:05d}" for i in range(OLD, OLD + NEW)]

    async def body() -> None:
        broker = LocalBroker(broker_config(tmp_path / "b", tiering))
        await broker.start()
        try:
            await broker.create_topic(TopicSpec(TOPIC, QUEUES))
            await produce(broker, 0, OLD)
            await broker.tier_upload_now(TOPIC, 30.0)
            await broker.tier_evict_local(TOPIC)  # the bucket holds the only copy
            old_objects = bucket_keys(s3_server, tiering)
            assert spark_ids(spark, s3_server, tiering) == [f"msg-{i:05d}" for i in range(OLD)]

            await broker.delete_topic(TOPIC)
            await broker.create_topic(TopicSpec(TOPIC, QUEUES))
            await produce(broker, OLD, NEW)

            assert manifest(s3_server, tiering, TOPIC)["segments"] == []
            assert not {k for k in old_objects if k.endswith(".parquet")} & bucket_keys(s3_server, tiering)
            assert spark_ids(spark, s3_server, tiering) == []
            assert await pulled_ids(broker) == new_ids
            assert await broker.get_message(TOPIC, "msg-00007") == []
            assert await broker.find_messages_by_key(TOPIC, "key-7") == []
            await broker.create_group(GroupSpec("replay", consume_from=ConsumeFrom.EARLIEST))
            assert sorted(m.message_id for m in await pop_all(broker, "replay", NEW)) == new_ids

            # The new incarnation tiers and reads back cold, alone.
            await broker.tier_upload_now(TOPIC, 30.0)
            await broker.tier_evict_local(TOPIC)
            assert spark_ids(spark, s3_server, tiering) == new_ids
            await broker.create_group(GroupSpec("cold", consume_from=ConsumeFrom.EARLIEST))
            assert sorted(m.message_id for m in await pop_all(broker, "cold", NEW)) == new_ids
            assert await pulled_ids(broker) == new_ids
        finally:
            await broker.close()

    run(body())


def test_a_deletion_applied_while_tiering_was_not_listening_is_caught_up_on_start(
    tmp_path: Path, tiering: TieringConfig
) -> None:
    """A store tiered by a rig (uploader and manifest, no broker) applies a deletion nobody listens
    to, as a replica's dispatcher applies its primary's; the tiering a broker attaches when it
    starts on that store (a restart, a replica promoted) drops the old segments at once."""

    async def body() -> None:
        objects = open_object_store(tiering)
        rig = open_rig(tmp_path / "s", tiering, objects)
        try:
            fill(rig.store, [TOPIC], QUEUES, 50)
            await rig.uploader.upload_now(TOPIC)
            await rig.uploader.close()
            assert rig.manifest.segments(TOPIC)
            await rig.store.delete_topic(TOPIC)
            assert rig.manifest.segments(TOPIC), "nobody listened"

            attached = BrokerTiering(rig.store, tiering, cluster=CLUSTER, broker=BROKER,
                                     retention_lock=threading.Lock(), objects=objects)  # fmt: skip
            try:
                assert attached.manifest.segments(TOPIC) == []
                for q in range(QUEUES):
                    assert attached.floor(TOPIC, q, rig.store.queue_bounds(TOPIC, q)[0]) == 50
                    assert not attached.covers(TOPIC, q, 0, 50)
                assert await attached.purge(TOPIC) == len(rig.manifest.segments(TOPIC))
                assert attached.manifest.pending_deletes(TOPIC) == []
            finally:
                await attached.close()
        finally:
            rig.close()

    run(body())


def test_a_topic_deleted_before_it_was_tiered_tiers_its_next_incarnation_without_a_gap(
    tmp_path: Path, tiering: TieringConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The old messages were never tiered: the new ones tier from where the queues ended, and the
    deleted ones are not reported as messages retention deleted before they were tiered."""
    caplog.set_level(logging.WARNING)

    async def body() -> None:
        rig = open_rig(tmp_path / "s", tiering, open_object_store(tiering))
        try:
            fill(rig.store, [TOPIC], QUEUES, 30)
            await rig.store.delete_topic(TOPIC)
            fill(rig.store, [TOPIC], QUEUES, 10, seed=2)
            await rig.uploader.upload_now(TOPIC)
            assert {q: rig.manifest.bounds(TOPIC, q) for q in range(QUEUES)} == {q: (30, 40) for q in range(QUEUES)}
            assert [r.queue_offset for r in rig.cold(TOPIC, 0)] == list(range(30, 40))
            await rig.uploader.close()
        finally:
            rig.close()

    run(body())
    assert "gap" not in caplog.text
