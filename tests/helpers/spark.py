"""Fixtures of the Spark tests: one local SparkSession and one known archive per test session.

Use with `pytest_plugins = ["tests.helpers.s3", "tests.helpers.spark"]`; import names and the
`Archive` type from tests/helpers/spark_data.py (importing this module from a test module would
import it before pytest registers it as a plugin).

- `spark` (session): `local[2]`, UTC, the `sluice` source registered, a short-run JVM (C1 JIT, serial
  GC); shared by every Spark test module of the run, so Spark starts once.
- `archive` (session): `spark_data.build_archive` in a bucket of the session's moto server.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator

import pytest

from tests.helpers.s3 import MotoS3Server
from tests.helpers.spark_data import SHORT_JVM_OPTIONS, Archive, build_archive

SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"


@pytest.fixture(scope="session")
def archive(s3_server: MotoS3Server, tmp_path_factory: pytest.TempPathFactory) -> Archive:
    return build_archive(s3_server, "sluice-spark-archive", tmp_path_factory.mktemp("archive-broker"))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spark_jobs.config import SparkJobsConfig
    from spark_jobs.session import open_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    config = dataclasses.replace(SparkJobsConfig(), master="local[2]", shuffle_partitions=2, app_name="sluice-tests")
    # PySpark starts its JVM with spark-submit and these arguments; only for this launch.
    saved = os.environ.get(SUBMIT_ARGS)
    os.environ[SUBMIT_ARGS] = f"--driver-java-options '{SHORT_JVM_OPTIONS}' pyspark-shell"
    try:
        session = open_session(config)
    finally:
        if saved is None:
            os.environ.pop(SUBMIT_ARGS, None)
        else:
            os.environ[SUBMIT_ARGS] = saved
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
