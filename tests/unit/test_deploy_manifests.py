"""The deployment files hold no command, flag, config key or port the code does not have.

Checked against the code itself, not a copy of it:
- every container of `deploy/k8s` runs a `sluice` subcommand, and its whole argument list parses
  with `sluice.main.build_parser()` (so flags exist and values have the right type);
- every `--config` file is a ConfigMap of the kustomization mounted where the flag points, and it
  loads with the component's own loader (`common.config.load_config` + its dataclass), so an
  unknown key fails here;
- readiness (`/readyz`) and liveness (`/healthz`) probes point at the container's metrics port
  (`--metrics-port`; navigation's readiness at its HTTP API port), every container port is a port
  the process listens on, and every Service port matches a container port of the pods it selects;
- brokers are a StatefulSet with a volume claim holding `--data-dir`, advertising their stable
  DNS name; proxies and brokers address the NameServer and navigation by Service name;
- the Dockerfile's entrypoint is `sluice` and its default command parses;
- the shipped topology files load (loader.py validates their flags and config) and every command
  line they produce parses, on loopback ports listed in each file's header.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.config import BrokerConfig
from cluster.loader import command_flags, load_topology
from common.config import load_config, read_toml
from nameserver.config import NameServerConfig
from navigation.config import NavigationConfig
from proxy.config import ProxyConfig
from sluice.main import build_parser

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
TOPOLOGY_DIR = REPO_ROOT / "deploy" / "topologies"
DOCKERFILE = K8S_DIR / "Dockerfile"
CONFIG_CLASSES: dict[str, type] = {
    "nameserver": NameServerConfig,
    "navigation": NavigationConfig,
    "broker": BrokerConfig,
    "proxy": ProxyConfig,
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
PORT_FLAGS = ("--port", "--metrics-port", "--http-port")
ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
ZONE_LABEL = "metadata.labels['topology.kubernetes.io/zone']"


# -- reading the manifests ----------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    doc = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for resource in kustomization()["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S_DIR / resource).read_text()) if d)
    return docs


def workloads() -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] in WORKLOAD_KINDS]


def services() -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == "Service"]


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for workload in workloads():
        for container in pod_spec(workload)["containers"]:
            yield workload, container


def container_ids() -> list[str]:
    return [f"{w['metadata']['name']}/{c['name']}" for w, c in containers()]


def generated_configmaps() -> dict[str, dict[str, Path]]:
    """ConfigMap name -> {key: source file} from the kustomization's configMapGenerator."""
    out: dict[str, dict[str, Path]] = {}
    for generator in kustomization().get("configMapGenerator", []):
        files: dict[str, Path] = {}
        for entry in generator["files"]:
            key, _, source = entry.partition("=")
            files[key if source else Path(key).name] = K8S_DIR / (source or key)
        out[generator["name"]] = files
    return out


def flag_values(args: list[str]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            flag, sep, inline = arg.partition("=")
            nxt = args[i + 1] if i + 1 < len(args) else ""
            values.setdefault(flag, []).append(inline if sep else ("" if nxt.startswith("--") else nxt))
    return values


def flag(args: list[str], name: str) -> str:
    found = flag_values(args).get(name)
    assert found and len(found) == 1, f"expected one {name} in {args}"
    return found[0]


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def resolve_port(container: Mapping[str, Any], port: int | str) -> int:
    ports = container_ports(container)
    if isinstance(port, str):
        assert port in ports, f"port {port!r} is not a named port of container {container['name']}: {ports}"
        return ports[port]
    assert port in ports.values(), f"port {port} is not declared by container {container['name']}: {ports}"
    return port


def parse_sluice(argv: list[str]) -> argparse.Namespace:
    """Parse like `sluice ARGV`; a parser error becomes a test failure carrying argparse's message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`sluice {shlex.join(argv)}` does not parse: {stderr.getvalue().strip()}")


def subcommands() -> set[str]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("sluice has no subcommands")


# -- kustomization ------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_config_file() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, "every manifest is applied by `kubectl apply -k deploy/k8s`, and only those"
    for name, files in generated_configmaps().items():
        for key, source in files.items():
            assert source.is_file(), f"ConfigMap {name} key {key}: {source} does not exist"
            assert source.suffix == ".toml"
    assert kustomization()["namespace"], "everything goes into one namespace"


def test_every_document_is_named_and_labelled() -> None:
    for doc in documents():
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc["metadata"].get("name"), doc
        if doc["kind"] in (*WORKLOAD_KINDS, "Service"):
            assert doc["metadata"]["labels"]["app.kubernetes.io/component"], doc["metadata"]["name"]


def test_workload_selectors_match_their_pod_labels() -> None:
    for workload in workloads():
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]


# -- containers: commands, flags, config --------------------------------------------------------------


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_container_runs_an_existing_command_with_existing_flags(
    workload: dict[str, Any], container: dict[str, Any]
) -> None:
    args = container["args"]
    assert all(isinstance(a, str) for a in args), f"quote every argument as a string: {args}"
    assert "command" not in container, "the image's entrypoint is `sluice`; give only args"
    assert args[0] in subcommands(), f"sluice has no command {args[0]!r}"
    known = command_flags(args[0])
    for arg in args[1:]:
        if arg.startswith("--"):
            assert arg.partition("=")[0] in known, f"sluice {args[0]} has no flag {arg}"
    parse_sluice(args)


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_env_references_in_args_are_defined(workload: dict[str, Any], container: dict[str, Any]) -> None:
    defined = {e["name"] for e in container.get("env", [])}
    for arg in container["args"]:
        for name in ENV_REFERENCE.findall(arg):
            assert name in defined, f"{arg!r} uses $({name}), which the container's env does not define"


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_config_file_is_a_mounted_configmap_that_loads(workload: dict[str, Any], container: dict[str, Any]) -> None:
    command = container["args"][0]
    config_path = Path(flag(container["args"], "--config"))
    mounts = {Path(m["mountPath"]): m["name"] for m in container["volumeMounts"]}
    assert config_path.parent in mounts, f"{config_path} is not in a mounted volume: {mounts}"
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    volume = volumes[mounts[config_path.parent]]
    assert "configMap" in volume, f"{config_path} must come from a ConfigMap"
    configmap = generated_configmaps().get(volume["configMap"]["name"])
    assert configmap is not None, f"ConfigMap {volume['configMap']['name']} is not generated by the kustomization"
    source = configmap.get(config_path.name)
    assert source is not None, f"ConfigMap {volume['configMap']['name']} has no key {config_path.name}"
    assert set(read_toml(source)) == {command}, f"{source} holds exactly the [{command}] table"
    load_config(CONFIG_CLASSES[command], section=command, path=source)  # raises on an unknown key or bad value


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_probes_point_at_the_metrics_port(workload: dict[str, Any], container: dict[str, Any]) -> None:
    args = container["args"]
    metrics_port = int(flag(args, "--metrics-port"))
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert resolve_port(container, liveness["port"]) == metrics_port
    assert readiness["path"] == "/readyz"
    # Navigation's HTTP API has its own /readyz, which also waits for the fleet's heartbeats.
    expected = int(flag(args, "--http-port")) if args[0] == "navigation" else metrics_port
    assert resolve_port(container, readiness["port"]) == expected


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_container_ports_are_ports_the_process_listens_on(workload: dict[str, Any], container: dict[str, Any]) -> None:
    values = flag_values(container["args"])
    listened = {int(v) for f in PORT_FLAGS for v in values.get(f, [])}
    assert set(container_ports(container).values()) == listened
    assert flag(container["args"], "--host") == "0.0.0.0", "listen on the pod's addresses, not loopback"


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_resources_and_security(workload: dict[str, Any], container: dict[str, Any]) -> None:
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][bound]), f"{bound} for cpu and memory"
    assert pod_spec(workload)["securityContext"]["runAsNonRoot"] is True
    assert pod_spec(workload)["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


# -- services and addresses ---------------------------------------------------------------------------


def selected_workload(service: Mapping[str, Any]) -> dict[str, Any]:
    selector = service["spec"]["selector"]
    matches = [w for w in workloads() if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
    assert len(matches) == 1, f"Service {service['metadata']['name']} selects {len(matches)} workloads"
    return matches[0]


@pytest.mark.parametrize("service", services(), ids=[s["metadata"]["name"] for s in services()])
def test_service_ports_match_container_ports(service: dict[str, Any]) -> None:
    container = pod_spec(selected_workload(service))["containers"][0]
    for port in service["spec"]["ports"]:
        target = resolve_port(container, port.get("targetPort", port["port"]))
        assert port["port"] == target, f"Service port {port['name']} {port['port']} != container port {target}"


def service_port(host_port: str) -> tuple[dict[str, Any], int]:
    host, _, port = host_port.rpartition(":")
    name = host.split(".")[0]
    found = [s for s in services() if s["metadata"]["name"] == name]
    assert found, f"{host_port}: no Service named {name}"
    assert int(port) in {p["port"] for p in found[0]["spec"]["ports"]}, (
        f"{host_port}: Service {name} has no port {port}"
    )
    return found[0], int(port)


@pytest.mark.parametrize(("workload", "container"), list(containers()), ids=container_ids())
def test_nameserver_and_navigation_are_reached_by_service_name(
    workload: dict[str, Any], container: dict[str, Any]
) -> None:
    values = flag_values(container["args"])
    for option, component in (("--namesrv", "nameserver"), ("--navigation", "navigation")):
        for value in values.get(option, []):
            for address in value.split(";"):
                service, port = service_port(address)
                target = pod_spec(selected_workload(service))["containers"][0]
                assert target["args"][0] == component, f"{option} {address} reaches a {target['args'][0]}"
                assert port == int(flag(target["args"], "--port"))


def test_proxies_register_with_navigation_and_nameserver_with_a_zone() -> None:
    proxies = [(w, c) for w, c in containers() if c["args"][0] == "proxy"]
    assert proxies
    for workload, container in proxies:
        assert workload["kind"] == "Deployment"
        values = flag_values(container["args"])
        assert values.get("--namesrv") and values.get("--navigation")
        zone = ENV_REFERENCE.fullmatch(flag(container["args"], "--zone"))
        assert zone, "the zone comes from the environment"
        env = {e["name"]: e for e in container["env"]}
        assert env[zone.group(1)]["valueFrom"]["fieldRef"]["fieldPath"] == ZONE_LABEL
        assert int(flag(container["args"], "--port")) == 8081
    clients = [
        s for s in services() if selected_workload(s)["spec"]["template"]["spec"]["containers"][0]["args"][0] == "proxy"
    ]
    assert any(p["port"] == 8081 for s in clients for p in s["spec"]["ports"]), "clients connect to a Service on 8081"


def test_brokers_are_a_statefulset_with_volumes_and_stable_names() -> None:
    brokers = [w for w in workloads() if pod_spec(w)["containers"][0]["args"][0] == "broker"]
    assert [w["kind"] for w in brokers] == ["StatefulSet"]
    sts = brokers[0]
    container = pod_spec(sts)["containers"][0]
    args = container["args"]
    headless = [s for s in services() if s["metadata"]["name"] == sts["spec"]["serviceName"]]
    assert headless and headless[0]["spec"].get("clusterIP") == "None", "serviceName is a headless Service"
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: Path(m["mountPath"]) for m in container["volumeMounts"]}
    data_dir = Path(flag(args, "--data-dir"))
    assert any(name in claims and data_dir.is_relative_to(path) for name, path in mounts.items()), (
        f"--data-dir {data_dir} is not on a volume claim ({claims})"
    )
    assert flag(args, "--name") == "$(POD_NAME)"
    advertise = flag(args, "--advertise")
    assert advertise.startswith(f"$(POD_NAME).{sts['spec']['serviceName']}.$(POD_NAMESPACE).svc."), advertise
    assert advertise.endswith(f":{flag(args, '--port')}")


# -- Dockerfile ---------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines if line and line[0] != "#"]


def test_dockerfile_builds_a_non_root_sluice_image() -> None:
    instructions = dockerfile_instructions()
    values: dict[str, list[str]] = {}
    for key, value in instructions:
        values.setdefault(key, []).append(value)
    assert values["FROM"] == ["python:3.11-slim"]
    assert any("pip install ." in run for run in values["RUN"])
    user = values["USER"][-1].split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "a numeric non-root user, so runAsNonRoot can check it"
    assert yaml.safe_load(values["ENTRYPOINT"][-1]) == ["sluice"]
    default_command = yaml.safe_load(values["CMD"][-1])
    parse_sluice(default_command)
    for _, copied in ((k, v) for k, v in instructions if k == "COPY"):
        for source in copied.split()[:-1]:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"


def test_manifests_use_the_image_the_kustomization_names() -> None:
    names = {i["name"] for i in kustomization()["images"]}
    for _, container in containers():
        assert container["image"] in names


# -- topology files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(TOPOLOGY_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_topology_loads_and_every_command_parses(path: Path, tmp_path: Path) -> None:
    topology = load_topology(path, run_dir=tmp_path)  # validates flags and config keys
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    for spec in topology.processes:
        assert spec.host == "127.0.0.1", f"{spec.name}: topology files run on loopback"
        parse_sluice(list(spec.argv))
        for role, port in spec.ports.items():
            assert str(port) in header, f"{path.name}: {spec.name} {role} {port} is not documented in the header"
        for probe in spec.probes:
            assert str(probe.port) in header, f"{path.name}: {spec.name} port {probe.port} is not in the header"


def test_separated_topology_has_the_promised_shape(tmp_path: Path) -> None:
    topology = load_topology(TOPOLOGY_DIR / "separated.toml", run_dir=tmp_path)
    kinds = [p.kind for p in topology.processes]
    assert kinds == ["nameserver", "navigation", "broker", "broker", "proxy", "proxy"]
    zones = {flag(list(p.argv), "--zone") for p in topology.processes if p.kind == "proxy"}
    assert len(zones) == 2, "two proxies in two zones"
    for spec in topology.processes:
        if spec.kind == "proxy":
            assert flag(list(spec.argv), "--navigation")
        if spec.kind == "broker":
            assert spec.data_dir is not None and spec.data_dir.is_relative_to(tmp_path)


def test_merged_topology_is_one_up_process(tmp_path: Path) -> None:
    topology = load_topology(TOPOLOGY_DIR / "merged.toml", run_dir=tmp_path)
    assert [p.kind for p in topology.processes] == ["up"]


# -- replicated overlay (deploy/k8s/replicated) ---------------------------------------------------------


def test_replicated_overlay_runs_a_broker_group_with_etcd() -> None:
    overlay = K8S_DIR / "replicated"
    doc = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert doc["resources"][0] == "../", "the base, without its unreplicated brokers (patched away)"
    docs = [d for r in doc["resources"][1:] for d in yaml.safe_load_all((overlay / r).read_text()) if d]
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    assert set(sets) == {"sluice-etcd", "sluice-g1"}
    group = sets["sluice-g1"]
    assert group["spec"]["replicas"] == 3
    args = pod_spec(group)["containers"][0]["args"]
    assert args[0] == "broker"
    known = command_flags("broker")
    assert all(a in known for a in args[1:] if a.startswith("--")), args
    parse_sluice(args)
    assert flag(args, "--group") == "g1" and flag(args, "--min-insync") == "2"
    etcd_service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluice-etcd")
    client_port = next(p["port"] for p in etcd_service["spec"]["ports"] if p["name"] == "client")
    assert flag(args, "--etcd") == f"http://sluice-etcd:{client_port}"
    ports = {p["name"]: p["containerPort"] for p in pod_spec(group)["containers"][0]["ports"]}
    assert ports["replication"] == int(flag(args, "--repl-port"))
