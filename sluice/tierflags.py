"""The tiered-storage flags shared by `sluice up` and `sluice broker`.

`--s3-endpoint URL --s3-bucket NAME --s3-prefix P --s3-region R --tier-min-age SECONDS` override the
matching keys of `[broker.tiering]` (see broker/tiering/config.py for every key). Credentials come
from the standard AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, shared files, instance
roles), or from `access_key_id` / `secret_access_key` in the TOML file. Tiering stays off unless a
bucket is given.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tiered storage (off unless --s3-bucket or [broker.tiering] bucket is set)")
    group.add_argument("--s3-endpoint", metavar="URL", help="S3-compatible endpoint (default: AWS for the region)")
    group.add_argument("--s3-bucket", metavar="NAME", help="bucket that receives tiered segments; turns tiering on")
    group.add_argument("--s3-prefix", metavar="P", help="object key prefix (default sluice)")
    group.add_argument("--s3-region", metavar="R", help="region of the bucket (default us-east-1)")
    group.add_argument(
        "--tier-min-age", type=float, metavar="SECONDS", help="tier messages stored at least this long ago (default 60)"
    )


def tier_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted `[broker]` overrides for `load_config` (None: flag not given)."""
    return {
        "tiering.endpoint_url": args.s3_endpoint,
        "tiering.bucket": args.s3_bucket,
        "tiering.prefix": args.s3_prefix,
        "tiering.region": args.s3_region,
        "tiering.min_age_s": args.tier_min_age,
    }
