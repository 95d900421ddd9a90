"""`sluice cluster`'s pure parts: the topology loader (and its errors), the config writer, the state file.

A bad topology file must fail before anything starts, with one line naming the file, the entry and
the key; these tests hold every such message to that. No process is started here.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import tomlwrite
from cluster.errors import ClusterError, NoCluster, TopologyError
from cluster.loader import load_topology
from cluster.state import ClusterState, ProcessState, read_state, state_path, write_state
from cluster.topology import ClusterSettings, Probe

REPO_ROOT = Path(__file__).resolve().parents[2]
SEPARATED = REPO_ROOT / "deploy" / "topologies" / "separated.toml"
REPLICATED = REPO_ROOT / "deploy" / "topologies" / "replicated.toml"

NAMESERVER = '[[nameserver]]\nname = "ns"\nport = 9876\nmetrics_port = 9976\n'
BROKER = '[[broker]]\nname = "broker-a"\nport = 10911\n'
PROXY = '[[proxy]]\nname = "proxy-a"\nport = 8081\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str, **kwargs: Any) -> str:
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as info:
        load_topology(path, run_dir=tmp_path / "run", **kwargs)
    message = str(info.value)
    assert message.startswith(f"topology {path}: "), message
    assert "\n" not in message, "one line"
    return message


# -- good files ---------------------------------------------------------------------------------------


def test_separated_topology_builds_the_command_lines(tmp_path: Path) -> None:
    topology = load_topology(SEPARATED, run_dir=tmp_path)
    assert [[p.name for p in g] for g in topology.groups()] == [
        ["nameserver-1"], ["navigation-1"], ["broker-a", "broker-b"], ["proxy-a", "proxy-b"],
    ]  # fmt: skip
    broker = topology.process("broker-a")
    assert broker.argv[:1] == ("broker",)
    assert " --namesrv 127.0.0.1:9876 " in " ".join(broker.argv) + " "
    assert broker.data_dir == tmp_path.resolve() / "data" / "broker-a"
    assert broker.config_path == tmp_path.resolve() / "config" / "broker-a.toml"
    assert broker.config["broker"]["store"]["commitlog"]["flush_policy"] == "async"
    assert [p.target for p in broker.probes] == ["http://127.0.0.1:11011/readyz"]
    proxy = topology.process("proxy-b")
    argv = " ".join(proxy.argv)
    for part in ("--navigation 127.0.0.1:9877", "--zone zone-b", "--workers 2", "--proxy-id proxy-b"):
        assert part in argv
    assert [p.port for p in proxy.probes] == [8182], "one metrics endpoint answers for every worker"
    assert proxy.ports["metrics_port"] == 8182 and "metrics_port_1" not in proxy.ports
    assert proxy.stop_timeout_s == topology.settings.stop_timeout_s + 2.0, "plus the proxy's drain_s"


def test_replicated_topology_starts_etcd_and_two_groups_of_three(tmp_path: Path) -> None:
    topology = load_topology(REPLICATED, run_dir=tmp_path, port_offset=5)
    groups = [[p.name for p in g] for g in topology.groups()]
    assert groups[0] == ["etcd-1", "nameserver-1"]
    assert groups[1] == ["g1-a", "g1-b", "g1-c", "g2-a", "g2-b", "g2-c"]
    etcd = " ".join(topology.process("etcd-1").argv)
    assert etcd.startswith("etcd --host 127.0.0.1 --port 2384 ") and "--peer-port 2385" in etcd
    member = " ".join(topology.process("g2-b").argv)
    assert "--group g2 --etcd http://127.0.0.1:2384 --min-insync 2" in member
    assert topology.process("g2-b").config["broker"]["replication"]["lease_ttl_s"] == 3


def test_a_grouped_broker_needs_etcd(tmp_path: Path) -> None:
    grouped = '[[broker]]\nname = "b1"\nport = 10911\ngroup = "g1"\n'
    assert "need etcd: add an [[etcd]]" in load_error(tmp_path, NAMESERVER + grouped)


def test_port_offset_shifts_every_port_and_address(tmp_path: Path) -> None:
    plain = load_topology(SEPARATED, run_dir=tmp_path)
    shifted = load_topology(SEPARATED, run_dir=tmp_path, port_offset=1000)
    for a, b in zip(plain.processes, shifted.processes, strict=True):
        assert {k: v + 1000 for k, v in a.ports.items()} == dict(b.ports)
        assert [p.port + 1000 for p in a.probes] == [p.port for p in b.probes]
    assert "127.0.0.1:10876" in shifted.process("proxy-a").argv


def test_defaults_without_metrics_port_probe_the_listen_port(tmp_path: Path) -> None:
    topology = load_topology(write(tmp_path, NAMESERVER + BROKER), run_dir=tmp_path / "run")
    broker = topology.process("broker-a")
    assert [p.target for p in broker.probes] == ["tcp://127.0.0.1:10911"]
    assert broker.data_dir == (tmp_path / "run").resolve() / "data" / "broker-a"
    assert broker.config_path is None and "--config" not in broker.argv


def test_entry_config_is_merged_over_the_shared_table(tmp_path: Path) -> None:
    text = NAMESERVER + BROKER + 'config = { heartbeat_interval_s = 2.0 }\n[config.broker]\ncluster = "c1"\n'
    broker = load_topology(write(tmp_path, text), run_dir=tmp_path).process("broker-a")
    assert broker.config == {"broker": {"cluster": "c1", "heartbeat_interval_s": 2.0}}


# -- bad files: one clear line each -------------------------------------------------------------------


BAD_FILES = [
    ("not toml", "[[broker]\nname=", "is not valid TOML"),
    ("empty", "", "no process: add at least one of"),
    ("unknown table", NAMESERVER + "[brokers]\nx = 1\n", "unknown table(s) brokers"),
    ("table not array", '[broker]\nname = "b"\nport = 1\n', "write [[broker]] (an array of tables"),
    ("missing key", NAMESERVER + '[[broker]]\nname = "broker-a"\n', "[broker.broker-a] missing key(s) port"),
    ("unknown key", NAMESERVER + BROKER + "prot = 1\n", "[broker.broker-a] unknown key(s) prot"),
    ("wrong type", NAMESERVER + BROKER.replace("10911", '"x"'), "broker.broker-a.port: expected an integer"),
    ("bad name", NAMESERVER + '[[broker]]\nname = "Broker_A"\nport = 1\n', "name 'Broker_A'"),
    ("name with newline", NAMESERVER + '[[broker]]\nname = "b\\n"\nport = 1\n',
     "[broker#1] name 'b\\n': use 1-63 lowercase"),
    ("port zero", NAMESERVER + '[[broker]]\nname = "b"\nport = 0\n', "port 0 is out of range 1..65535"),
    ("same name", NAMESERVER + BROKER + BROKER.replace("10911", "10912"), "name 'broker-a' is used twice"),
    ("same port", NAMESERVER + BROKER + PROXY.replace("8081", "9976"), "port 9976 is used twice (ns metrics_port"),
    ("merged and separated", NAMESERVER + '[[up]]\nname = "u"\nport = 1\nnamesrv_port = 2\nbroker_port = 3\n',
     "merged ([[up]] only) or separated"),
    ("no nameserver", PROXY, "brokers and proxies need a NameServer"),
    ("bad config key", NAMESERVER + BROKER + "[config.broker.store.commitlog]\nflush = 'sync'\n",
     "config of broker-a: [broker.store.commitlog] unknown key(s) flush; known keys:"),
    ("bad config value", NAMESERVER + BROKER + "[config.broker]\nheartbeat_interval_s = 'soon'\n",
     "broker.heartbeat_interval_s: expected a number"),
    ("config not a component", NAMESERVER + "[config.brokers]\nx = 1\n", "[config.brokers] is not a component"),
    ("reserved config key", NAMESERVER + BROKER + "[config.broker]\nport = 1\n", "broker.port of broker-a are set by"),
    ("unknown flag", NAMESERVER + BROKER + 'args = ["--bogus"]\n', "sluice broker has no flag --bogus"),
    ("reserved flag", NAMESERVER + BROKER + 'args = ["--port", "1"]\n', "--port is set by the topology"),
    ("workers", NAMESERVER + PROXY + "workers = -1\n", "workers must be in 0..64 (0: one per core)"),
    ("zone", NAMESERVER + PROXY + 'zone = "a b"\n', "zone 'a b'"),
    ("advertise", NAMESERVER + PROXY + 'advertise = ["nowhere"]\n', "advertise 'nowhere'"),
    ("wildcard", NAMESERVER + PROXY + 'host = "0.0.0.0"\n', "proxy proxy-a listens on '0.0.0.0': set advertise"),
    ("cluster key", '[cluster]\nreadiness_s = 1\n' + NAMESERVER, "[cluster] unknown key(s) readiness_s"),
    ("log level", '[cluster]\nlog_level = "loud"\n' + NAMESERVER, "log_level 'loud' is not one of"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_topology_gives_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in load_error(tmp_path, text)


def test_port_offset_out_of_range(tmp_path: Path) -> None:
    message = load_error(tmp_path, NAMESERVER, port_offset=60000)
    assert "port offset 60000 moves ns's port 9876 to 69876, outside 1..65535" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"config file .*nope.toml does not exist"):
        load_topology(tmp_path / "nope.toml", run_dir=tmp_path)


# -- settings, probes, config writer, state file ------------------------------------------------------


def test_backoff_doubles_up_to_the_maximum() -> None:
    settings = ClusterSettings(restart_backoff_initial_s=0.5, restart_backoff_max_s=3.0)
    assert [settings.backoff_s(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert settings.backoff_s(10_000) == 3.0


@pytest.mark.parametrize("probe", [Probe("127.0.0.1", 9976, "/readyz"), Probe("::1", 80), Probe("h", 1, "/a/b")])
def test_probe_target_round_trip(probe: Probe) -> None:
    assert Probe.parse(probe.target) == probe


scalars = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)
tables = st.recursive(
    st.dictionaries(st.text(max_size=10), values, max_size=4),
    lambda inner: st.dictionaries(st.text(max_size=10), inner | values, max_size=4),
    max_leaves=12,
)


@given(tables)
def test_tomlwrite_round_trips(table: dict[str, Any]) -> None:
    assert tomllib.loads(tomlwrite.dumps(table)) == table


def test_tomlwrite_refuses_what_toml_cannot_hold() -> None:
    with pytest.raises(TypeError):
        tomlwrite.dumps({"a": None})
    assert tomllib.loads(tomlwrite.dumps({"x": math.inf}))["x"] == math.inf


def test_state_file_round_trip(tmp_path: Path) -> None:
    process = ProcessState("broker-a", "broker", {"port": 1}, "/l", ["tcp://127.0.0.1:1"], ["py"], 10.0, pid=7)
    state = ClusterState(supervisor_pid=42, topology="/t.toml", run_dir=str(tmp_path), processes=[process])
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file was renamed into place"


def test_state_file_errors(tmp_path: Path) -> None:
    with pytest.raises(NoCluster, match=r"no cluster is running in .* \(start one with sluice cluster up\)"):
        read_state(tmp_path)
    state_path(tmp_path).write_text(json.dumps({"version": 99}))
    with pytest.raises(ClusterError, match="is not a Sluice cluster state"):
        read_state(tmp_path)
    state_path(tmp_path).write_text("{")
    with pytest.raises(ClusterError, match="is unreadable"):
        read_state(tmp_path)
