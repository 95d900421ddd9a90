"""Tiering configuration of a broker: `[broker.tiering]` in TOML, the `--s3-*` / `--tier-min-age` flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from common.config import ConfigError, load_config
from sluice.commands import broker as broker_cmd
from sluice.commands import up as up_cmd
from sluice.tierflags import tier_overrides


def test_tiering_is_off_by_default() -> None:
    assert BrokerConfig().tiering.enabled is False


def test_toml_table_with_per_topic_retention(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text(
        '[broker.tiering]\nbucket = "cold"\nendpoint_url = "http://127.0.0.1:9000"\naddressing_style = "path"\n'
        "min_age_s = 30\n[broker.tiering.topic_retention_s]\naudit = 0\norders = 86400\n"
    )
    cfg = load_config(BrokerConfig, section="broker", path=path)
    assert cfg.tiering.enabled and cfg.tiering.addressing_style == "path" and cfg.tiering.min_age_s == 30.0
    assert cfg.tiering.retention_for("audit") == 0.0 and cfg.tiering.retention_for("orders") == 86400.0
    assert cfg.tiering.retention_for("other") == cfg.tiering.retention_s


def test_bad_values_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[broker.tiering]\nbucket = "cold"\naddressing_style = "sideways"\n')
    with pytest.raises(ConfigError, match=r"tiering\.addressing_style"):
        load_config(BrokerConfig, section="broker", path=path)
    path.write_text('[broker.tiering]\nbucket = "cold"\naccess_key_id = "only-half"\n')
    with pytest.raises(ConfigError, match=r"access_key_id and tiering\.secret_access_key"):
        load_config(BrokerConfig, section="broker", path=path)


FLAGS = ["--s3-endpoint", "http://127.0.0.1:9000", "--s3-bucket", "cold", "--s3-prefix", "p1", "--tier-min-age", "5"]


def _parse(add_arguments: object, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # type: ignore[operator]
    return parser.parse_args(argv)


def test_up_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "up.toml"
    path.write_text('[broker.tiering]\nbucket = "from-file"\nprefix = "file"\nregion = "eu-west-1"\n')
    args = _parse(up_cmd.add_arguments, ["--config", str(path), *FLAGS])
    _, broker, _ = up_cmd.configs(args)
    t = broker.tiering
    assert (t.endpoint_url, t.bucket, t.prefix, t.region, t.min_age_s) == (
        "http://127.0.0.1:9000", "cold", "p1", "eu-west-1", 5.0,
    )  # fmt: skip


def test_broker_flags_map_to_tiering_keys() -> None:
    args = _parse(broker_cmd.add_arguments, [*FLAGS, "--s3-region", "eu-central-1"])
    cfg = load_config(BrokerConfig, section="broker", overrides=tier_overrides(args))
    assert (cfg.tiering.bucket, cfg.tiering.region, cfg.tiering.prefix) == ("cold", "eu-central-1", "p1")
    none = _parse(broker_cmd.add_arguments, [])
    assert load_config(BrokerConfig, section="broker", overrides=tier_overrides(none)).tiering.enabled is False
