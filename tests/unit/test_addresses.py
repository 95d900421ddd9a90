"""Where a process listens and what it advertises (common/addresses.py, issue 43 items 1 and 2):
a wildcard listening host never becomes `0.0.0.0` or `127.0.0.1` in what others are handed, in
every server command; an ambiguous machine refuses to start, naming the flag."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from common import addresses
from common.addresses import advertised, check_advertise, machine_addresses, parse_advertise
from common.config import ConfigError
from processes.shardpool import ShardPool, shard_configs
from proxy.config import ProxyConfig
from sluice.commands import etcd, node, up
from sluice.main import build_parser

MACHINE = "10.43.0.7"


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Pretends this machine's non-loopback addresses are the ones given."""

    def have(*found: str) -> None:
        monkeypatch.setattr(addresses, "machine_addresses", lambda: tuple(found))
        advertised.cache_clear()

    have(MACHINE)
    yield have
    advertised.cache_clear()


def test_an_explicit_address_is_advertised_as_given_or_with_the_own_port() -> None:
    assert advertised("0.0.0.0", 8081, "10.1.1.1:9000") == "10.1.1.1:9000"
    assert advertised("0.0.0.0", 8081, "10.1.1.1") == "10.1.1.1:8081"
    assert advertised("0.0.0.0", 8081, "node-1") == "node-1:8081"
    assert advertised("::", 8081, "::1") == "[::1]:8081"
    assert parse_advertise("[fd00::1]:7") == ("fd00::1", 7)


@pytest.mark.parametrize("bad", ["0.0.0.0:8081", "0.0.0.0", "[::]:8081", "::", "a:b", ":80"])
def test_an_address_nobody_can_dial_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="advertise"):
        check_advertise(bad)
    with pytest.raises(ValueError, match="advertise"):
        BrokerConfig(advertise=bad)
    with pytest.raises(ValueError, match=r"networks\.public"):
        ProxyConfig(networks={"public": bad})


def test_a_specific_host_is_its_own_address(machine: Callable[..., None]) -> None:
    assert BrokerConfig(host="10.9.9.9", port=1).advertised_address == "10.9.9.9:1"
    assert ProxyConfig(host="127.0.0.1").advertised_address == "127.0.0.1:8081"


def test_a_wildcard_host_advertises_the_machine_s_address(machine: Callable[..., None]) -> None:
    assert BrokerConfig(host="0.0.0.0").advertised_address == f"{MACHINE}:10911"
    assert ProxyConfig(host="::").advertised_address == f"{MACHINE}:8081"
    machine()  # only loopback: nothing else can reach the process anyway
    assert BrokerConfig(host="0.0.0.0").advertised_address == "127.0.0.1:10911"


def test_a_wildcard_host_on_a_machine_of_several_addresses_refuses_naming_the_flag(
    machine: Callable[..., None],
) -> None:
    machine("10.0.0.1", "10.1.0.1")
    with pytest.raises(ConfigError, match=r"several addresses \(10.0.0.1, 10.1.0.1\).*--advertise"):
        BrokerConfig(host="0.0.0.0").checked_address("broker")
    assert BrokerConfig(host="0.0.0.0", advertise="10.1.0.1").advertised_address == "10.1.0.1:10911"


def test_machine_addresses_leave_loopback_out() -> None:
    assert all(not a.startswith("127.") for a in machine_addresses())


def test_up_s_shards_on_a_wildcard_advertise_the_machine_s_address(
    machine: Callable[..., None], tmp_path: Path
) -> None:
    """Issue 43 item 1: `sluice up --host 0.0.0.0` handed out 127.0.0.1 (routes) and 0.0.0.0 (brokers)."""
    brokers = shard_configs(BrokerConfig(host="0.0.0.0", port=20000), 2, tmp_path / "data")
    assert [b.advertised_address for b in brokers] == [f"{MACHINE}:{b.port}" for b in brokers]
    pool = ShardPool(ProxyConfig(host="0.0.0.0", port=20001), 2, [], brokers=brokers, client_ports=[20001, 20002])
    pool._write_configs(tmp_path)
    texts = [(tmp_path / f"shard-{i}.toml").read_text() for i in range(2)]
    assert f'advertise = "{MACHINE}:20001"' in texts[0] and f'advertise = "{MACHINE}:20002"' in texts[1]
    assert all("127.0.0.1:2000" not in text and "0.0.0.0:" not in text for text in texts)


def _args(command: str, *argv: str) -> argparse.Namespace:
    return build_parser().parse_args([command, *argv])


def test_up_advertises_one_host_with_each_part_s_port(machine: Callable[..., None]) -> None:
    _, broker, proxy = up.configs(_args("up", "--host", "0.0.0.0", "--advertise", "10.2.2.2", "--amqp-port", "-1"))
    assert (broker.advertised_address, proxy.advertised_address) == ("10.2.2.2:10911", "10.2.2.2:8081")
    _, broker, proxy = up.configs(_args("up", "--host", "0.0.0.0", "--amqp-port", "-1"))
    assert (broker.advertised_address, proxy.advertised_address) == (f"{MACHINE}:10911", f"{MACHINE}:8081")
    with pytest.raises(ConfigError, match="give the host alone"):
        up.configs(_args("up", "--advertise", "10.2.2.2:8081", "--amqp-port", "-1"))


def test_a_node_s_broker_is_advertised_where_its_proxy_is(machine: Callable[..., None]) -> None:
    """Issue 43 item 2: `sluice node --host 0.0.0.0 --advertise A` registered its broker at 0.0.0.0."""
    broker, proxy = node.configs(_args("node", "--namesrv", "10.0.0.1:9876", "--host", "0.0.0.0",
                                       "--advertise", "10.3.3.3:8081"))  # fmt: skip
    assert broker.advertised_address == "10.3.3.3:10911"
    assert broker.client_endpoint == proxy.advertised_address == "10.3.3.3:8081"
    broker, proxy = node.configs(_args("node", "--namesrv", "10.0.0.1:9876", "--host", "0.0.0.0"))
    assert (broker.advertised_address, broker.client_endpoint) == (f"{MACHINE}:10911", f"{MACHINE}:8081")


def _etcd_urls(*argv: str) -> dict[str, str]:
    command = etcd.argv(_args("etcd", *argv), "/usr/bin/etcd")
    return {flag[2:]: value for flag, value in zip(command[1::2], command[2::2], strict=True)}


def test_etcd_on_a_wildcard_advertises_the_machine_s_address(machine: Callable[..., None]) -> None:
    """`sluice etcd --host 0.0.0.0` advertised http://0.0.0.0:2379 (a client that asks etcd for its
    members would dial its own machine) and the same peer URL."""
    urls = _etcd_urls("--host", "0.0.0.0", "--name", "e1")
    assert (urls["listen-client-urls"], urls["listen-peer-urls"]) == ("http://0.0.0.0:2379", "http://0.0.0.0:2380")
    assert urls["advertise-client-urls"] == f"http://{MACHINE}:2379"
    assert urls["initial-advertise-peer-urls"] == f"http://{MACHINE}:2380"
    assert urls["initial-cluster"] == f"e1=http://{MACHINE}:2380"
    urls = _etcd_urls("--host", "::", "--advertise", "etcd-1.example", "--port", "3379")
    assert (urls["listen-client-urls"], urls["advertise-client-urls"]) == (
        "http://[::]:3379",
        "http://etcd-1.example:3379",
    )
    assert _etcd_urls("--host", "10.5.5.5")["advertise-client-urls"] == "http://10.5.5.5:2379"


@pytest.mark.parametrize(("argv", "refusal"), [
    (("--host", "0.0.0.0", "--advertise", "0.0.0.0"), "not an address anyone can dial"),
    (("--advertise", "10.2.2.2:2379"), "give the host alone"),
])  # fmt: skip
def test_etcd_refuses_an_advertise_nobody_can_use(argv: tuple[str, ...], refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        etcd.argv(_args("etcd", *argv), "/usr/bin/etcd")


def test_etcd_on_a_wildcard_of_a_machine_of_several_addresses_refuses_naming_the_flag(
    machine: Callable[..., None],
) -> None:
    machine("10.0.0.1", "10.1.0.1")
    with pytest.raises(ConfigError, match="--advertise"):
        etcd.argv(_args("etcd", "--host", "0.0.0.0"), "/usr/bin/etcd")
    assert _etcd_urls("--host", "0.0.0.0", "--advertise", "10.1.0.1")["advertise-client-urls"] == "http://10.1.0.1:2379"
