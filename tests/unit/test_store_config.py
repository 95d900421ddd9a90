"""Store settings (`[broker.store.*]`) out of range are refused at load, naming the key and its range."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from common.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("table", "text", "message"),
    [
        ("commitlog", "segment_bytes = 0", r"^\[broker.store.commitlog\] segment_bytes is 0; it must be at least 4096"),
        ("commitlog", "inline_append_max_bytes = -1", r"inline_append_max_bytes is -1; it must be at least 0$"),
        ("commitlog", "flush_interval_ms = 0", r"flush_interval_ms is 0"),
        ("commitlog", "queue_offset_cache_size = 0", r"queue_offset_cache_size is 0"),
        ("retention", "max_disk_used_ratio = 1.5", r"\[broker\.store\.retention\] max_disk_used_ratio is 1\.5"),
        ("retention", "check_interval_s = 0", r"check_interval_s is 0"),
        ("recovery", "scan_chunk_bytes = 10", r"scan_chunk_bytes is 10; it must be at least 4096"),
        ("read", "max_scan_entries = 0", r"\[broker\.store\.read\] max_scan_entries is 0"),
    ],
)
def test_out_of_range_store_settings_are_refused(tmp_path: Path, table: str, text: str, message: str) -> None:
    path = tmp_path / "b.toml"
    path.write_text(f"[broker.store.{table}]\n{text}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(BrokerConfig, section="broker", path=path)


def test_the_defaults_and_the_edges_load(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text(
        "[broker.store.commitlog]\nsegment_bytes = 4096\ninline_append_max_bytes = 0\n"
        "[broker.store.retention]\nmax_age_s = 0\nmax_disk_used_ratio = 1.0\n"
        "[broker.store.read]\ncoalesce_gap_bytes = 0\n"
    )
    cfg = load_config(BrokerConfig, section="broker", path=path)
    assert cfg.store.commitlog.segment_bytes == 4096 and cfg.store.commitlog.inline_append_max_bytes == 0
    assert BrokerConfig().store.commitlog.segment_bytes == 1 << 30


def test_a_record_must_hold_the_largest_body_and_the_rest(tmp_path: Path) -> None:
    """`max_record_bytes` leaves RECORD_HEADROOM_BYTES over `[broker.limits] max_body_bytes`: a body
    the broker accepts is never refused later by the CommitLog (the message would be lost)."""
    path = tmp_path / "b.toml"
    path.write_text(
        "[broker.limits]\nmax_body_bytes = 16777216\n[broker.store.commitlog]\nmax_record_bytes = 16777216\n"
    )
    with pytest.raises(ConfigError, match=r"max_record_bytes \(16777216\) must leave 1048576 bytes over"):
        load_config(BrokerConfig, section="broker", path=path)
    path.write_text("[broker.limits]\nmax_body_bytes = 1048576\n[broker.store.commitlog]\nmax_record_bytes = 2097152\n")
    assert load_config(BrokerConfig, section="broker", path=path).store.commitlog.max_record_bytes == 2097152
