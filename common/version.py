"""The installed Sluice's version number, as `sluice --version` and `sluice admin broker list` show it."""

from __future__ import annotations

import importlib.metadata

UNKNOWN = "unknown"


def sluice_version() -> str:
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return UNKNOWN
