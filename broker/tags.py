"""Tag hashing shared by the ConsumeQueue (which stores the hash) and tag filters (which match it).

A tag filter is first applied on the 32-bit hash kept in each ConsumeQueue entry, so messages
whose tag cannot match are skipped without reading the CommitLog; a hash match is then confirmed
against the real tag. Hash 0 means "no tag".
"""

from __future__ import annotations

import functools
import zlib

NO_TAG_HASH = 0


@functools.lru_cache(maxsize=4096)  # topics use few distinct tags; this sits on the append path
def tag_hash(tag: str | None) -> int:
    if not tag:
        return NO_TAG_HASH
    h = zlib.crc32(tag.encode("utf-8"))
    return h or 1  # keep 0 reserved for "no tag"
