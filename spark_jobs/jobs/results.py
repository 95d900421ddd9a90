"""Small job results (collected on the driver) written as one Parquet file, locally or to S3."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from broker.tiering.s3settings import S3Settings
from spark_jobs.jobs.export import Destination


def write_rows(rows: Sequence[Mapping[str, Any]], output: str, s3: S3Settings, name: str) -> str:
    """Write `rows` as `<output>/<name>`; returns where. An empty result writes a file with no rows."""
    dest = Destination.parse(output, s3)
    fs = dest.filesystem()
    fs.create_dir(dest.path, recursive=True)
    path = f"{dest.path}/{name}"
    pq.write_table(pa.Table.from_pylist(list(rows)), path, filesystem=fs, compression="zstd")
    return path
