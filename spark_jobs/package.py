"""The `--py-files` archive for spark-submit: the packages a driver and its executors import.

Executors need `spark_jobs`, `common` (errors, logs, config) and, of the broker, only the tiered
format and its S3 access (`broker/tiering/format.py`, `s3settings.py`, `s3store.py`,
`objectstore.py`, which import nothing else of it) and, for streaming reads from the brokers, the broker's client side
(`broker/client/`), the NameServer client (`nameserver/`) and the internal protocol (`proto/`);
plus pyarrow, boto3 and grpcio installed in their Python.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

PACKAGES = ("spark_jobs", "common", "proto", "nameserver", "broker/client")
# The shared tiered-format modules; their packages' __init__ files import nothing.
MODULES = (
    "broker/__init__.py",
    "broker/tiering/__init__.py",
    "broker/tiering/format.py",
    "broker/tiering/objectstore.py",
    "broker/tiering/s3settings.py",
    "broker/tiering/s3store.py",
)
ROOT = Path(__file__).resolve().parent.parent


def build_zip(output: Path, root: Path = ROOT) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                zf.write(path, path.relative_to(root).as_posix())
        for module in MODULES:
            zf.write(root / module, module)
    return output
