"""A moto S3 server as a child process on loopback, and the broker flags that tier into it.

The e2e modules that tier (test_tiering.py, test_topic_deletion.py) share it through the `moto`
fixture of tests/e2e/conftest.py (module-scoped: one server per module that asks for it). AWS
credentials go to the environment the brokers inherit (the standard credential chain); each
cluster tiers into a bucket of its own (`tiering_flags`), path-style, with small CommitLog
segments so that a few hundred messages fill several.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
SEGMENT_BYTES = 16 << 10
# The `--config` of a tiering cluster: small segments, and S3 calls that fail fast (one attempt,
# 2-s timeouts) so that a hung S3 shows as retriable errors, not as hangs.
CONFIG = f"""
[broker.store.commitlog]
segment_bytes = {SEGMENT_BYTES}

[broker.tiering]
region = "{REGION}"
addressing_style = "path"
connect_timeout_s = 2.0
read_timeout_s = 2.0
max_attempts = 1
segment_target_bytes = 8192
row_group_rows = 16
"""


@dataclass
class Moto:
    endpoint: str
    child: ChildProcess

    @contextmanager
    def hung(self) -> Iterator[None]:
        """S3 stops answering (SIGSTOP): connections open, requests never return until resumed."""
        self.child.signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.child.signal(signal.SIGCONT)


@contextmanager
def running_moto(root: Path) -> Iterator[Moto]:
    """A moto S3 server child process (its log in `root`), with the AWS credentials in this process's
    environment (which the clusters started meanwhile inherit) until it stops."""
    port = free_port()
    child: ChildProcess = start_process(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
        port=port, log_path=root / "moto.log", name="moto-s3",
    )  # fmt: skip
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            env.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            yield Moto(f"http://{LOOPBACK}:{port}", child)
    finally:
        child.stop()


def tiering_flags(moto: Moto, root: Path, bucket: str, prefix: str) -> list[str]:
    """The flags of brokers that tier into a new bucket `bucket` of `moto` under `prefix` (the
    `--config` file written into `root`); nothing is old enough to tier on its own (`sluice admin
    tier upload-now` does it)."""
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                      aws_secret_access_key=SECRET_KEY)  # fmt: skip
    s3.create_bucket(Bucket=bucket)
    config = root / "sluice.toml"
    config.write_text(CONFIG)
    return ["--config", str(config), "--s3-endpoint", moto.endpoint, "--s3-bucket", bucket,
            "--s3-prefix", prefix, "--tier-min-age", "3600"]  # fmt: skip
