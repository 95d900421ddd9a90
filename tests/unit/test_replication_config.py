"""`[broker.replication]`'s `dial` (a member's own path to another member's replication port) and
its flag `--repl-dial MEMBER=HOST:PORT`."""

from __future__ import annotations

import pytest

from broker.replication.config import ReplicationConfig
from common.config import ConfigError, build
from sluice.commands.broker import _dial


def test_dial_maps_members_to_host_port() -> None:
    cfg = build(ReplicationConfig, {"dial": {"b1": "10.0.0.1:7000", "b2": "relay:7001"}}, where="broker.replication")
    assert cfg.dial == {"b1": "10.0.0.1:7000", "b2": "relay:7001"}
    assert ReplicationConfig().dial == {}


@pytest.mark.parametrize("address", ["10.0.0.1", ":7000", "host:", "host:port"])
def test_dial_refuses_what_is_not_host_port(address: str) -> None:
    with pytest.raises(ConfigError, match=r"replication.dial.b1 must be host:port"):
        build(ReplicationConfig, {"dial": {"b1": address}}, where="broker.replication")


def test_repl_dial_flags() -> None:
    assert _dial(["b1=127.0.0.1:1", "b2=h:2"]) == {"b1": "127.0.0.1:1", "b2": "h:2"}
    for bad in ("b1", "=h:1"):
        with pytest.raises(ConfigError, match="MEMBER=HOST:PORT"):
            _dial([bad])
