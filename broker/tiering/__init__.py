"""Tiered storage: cold messages moved to S3-compatible object storage as Parquet segments and read back.

Modules: config (TieringConfig), format (the tiered format: layout, schema, metadata, ranged reads;
pure, shared with spark_jobs), segment (messages to segments and back), objectstore (the seam) with
s3store (S3 access and `S3Settings`, shared with spark_jobs) and localstore, kv + manifest (what is
in the bucket), uploader (background upload and the retention veto), fetch + cache + reader (the
cold read path), expiry (tiered retention). docs/tiered-format.md is the public contract of what
lands in the bucket.
"""
