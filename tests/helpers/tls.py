"""A self-signed certificate for tests of TLS (made with the openssl CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) in `directory`: RSA 2048, one day, CN localhost, valid for 127.0.0.1."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key
