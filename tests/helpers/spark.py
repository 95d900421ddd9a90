"""Fixtures of the Spark tests: one local SparkSession and one known archive per test session.

Use with `pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]`; import names and the
`Archive` type from tests/helpers/spark_data.py (importing this module from a test module would
import it before pytest registers it as a plugin).

- `spark` (session): `local[2]`, UTC, the `sluice` source registered (Spark starts in ~8 s, once).
- `archive` (session): `spark_data.build_archive` in a bucket of the session's moto server.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator

import pytest

from tests.helpers.s3 import MotoS3Server
from tests.helpers.spark_data import Archive, build_archive


@pytest.fixture(scope="session")
def archive(s3_server: MotoS3Server, tmp_path_factory: pytest.TempPathFactory) -> Archive:
    return build_archive(s3_server, "sluice-spark-archive", tmp_path_factory.mktemp("archive-broker"))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spark_jobs.config import SparkJobsConfig
    from spark_jobs.session import open_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    config = dataclasses.replace(SparkJobsConfig(), master="local[2]", shuffle_partitions=2, app_name="sluice-tests")
    session = open_session(config)
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
