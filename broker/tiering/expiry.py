"""Tiered retention: delete whole segment objects whose newest message is older than the topic's retention
(and those a topic's deletion dropped, `purge`).

Per topic, only an expired prefix of the segments (in sequence order) goes, so every queue's tiered
range stays contiguous. Order, so that nothing ever lists a missing object: (1) the manifest drops
the entries and records their objects as pending deletes, in one atomic write; (2) the bucket's
manifest.json is rewritten without them; (3) the objects are deleted and the pending marks cleared.
A failure at (2) or (3) leaves pending deletes that the next run finishes.

Blocking (object store I/O); raises the object store's errors (`Unavailable` while it is down).
"""

from __future__ import annotations

import logging

from broker.tiering.config import TieringConfig
from broker.tiering.manifest import Manifest
from broker.tiering.objectstore import ObjectStore
from common.logs import kv

log = logging.getLogger("sluice.tiering.expiry")


def expire(manifest: Manifest, objects: ObjectStore, config: TieringConfig, now_s: float) -> int:
    """Apply tiered retention to every topic once; returns the number of objects deleted."""
    deleted = 0
    for topic in manifest.topics():
        retention_s = config.retention_for(topic)
        if retention_s > 0:
            cutoff_ms = int((now_s - retention_s) * 1000)
            expired = []
            for seg in manifest.segments(topic):
                if seg.max_store_ms >= cutoff_ms:
                    break
                expired.append(seg.seq)
            manifest.expire_segments(topic, expired)
        deleted += purge(manifest, objects, topic)
    return deleted


def purge(manifest: Manifest, objects: ObjectStore, topic: str) -> int:
    """Delete the objects of the topic's segments the manifest dropped (expired, or of a deleted
    topic): the bucket's manifest.json is rewritten without them first. How many were deleted."""
    pending = manifest.pending_deletes(topic)
    if not pending:
        return 0
    manifest.write_mirror(objects, topic)
    for seq, key in pending:
        objects.delete(key)
        manifest.deleted(topic, seq)
    log.info("tiered segments deleted", extra=kv(topic=topic, objects=len(pending)))
    return len(pending)
