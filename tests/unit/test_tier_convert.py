"""Tiered-storage messages of the internal protocol: field parity with broker/client/api.py and round trips."""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.client import grpc_convert as convert
from broker.client.api import TierEvictResult, TierQueueStatus, TierStatus, TierTopicStatus
from proto.sluice.internal.v1 import broker_pb2 as pb

TOPIC_STATUS = TierTopicStatus(
    "orders", (TierQueueStatus(0, 10, 20, 0, 15), TierQueueStatus(3, 0, 0, 0, 0)), 5, 12.5, 4096, 3,
    "S3 PUT failed", 2, 1_700_000_000_000,
)  # fmt: skip


def test_every_tier_dataclass_field_has_a_proto_field() -> None:
    pairs: list[tuple[Any, Any]] = [
        (TierQueueStatus, pb.TierQueueStatus),
        (TierTopicStatus, pb.TierTopicStatus),
        (TierStatus, pb.TierStatusResponse),
        (TierEvictResult, pb.TierEvictLocalResponse),
    ]
    for cls, message in pairs:
        assert {f.name for f in dataclasses.fields(cls)} == set(message.DESCRIPTOR.fields_by_name), cls.__name__


def test_round_trips() -> None:
    assert convert.tier_topic_status_from_pb(convert.tier_topic_status_to_pb(TOPIC_STATUS)) == TOPIC_STATUS
    status = TierStatus(True, "s3://b at http://127.0.0.1:1", (TOPIC_STATUS,), 7, 70_000, 9, 90_000)
    assert convert.tier_status_from_pb(convert.tier_status_to_pb(status)) == status
    assert convert.tier_status_from_pb(convert.tier_status_to_pb(TierStatus(False, ""))) == TierStatus(False, "")
    evicted = TierEvictResult("orders", 1200, 3)
    assert convert.tier_evict_from_pb(convert.tier_evict_to_pb(evicted)) == evicted
