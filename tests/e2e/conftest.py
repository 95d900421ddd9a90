"""End-to-end tests: the official RocketMQ clients, unchanged, against real Sluice processes.

Run them in their own pytest process: `.venv/bin/python -m pytest tests/e2e`. This process imports
the official Python client, whose generated `apache.rocketmq.v2` protobuf modules declare the same
symbols as Sluice's own `proto.apache.rocketmq.v2` modules; the two can never be loaded together
(`TypeError: duplicate symbol`). So nothing here imports `proto.*`, `proxy.*`, `broker.*` or
anything that does: every Sluice component runs as a child process, and raw protocol requests use
the client's stubs (`rocketmq.grpc_protocol`). The guard below fails loudly if that rule is broken.

Fixtures:
- `cluster`: session-scoped, parametrised `merged` / `separated` (see support/cluster.py). Each
  topology starts once per test process (per xdist worker) on first use and stays up until the end.
- `unique`: a name factory; every test uses its own topics and groups.
- `moto`: module-scoped, an S3 server for the modules whose clusters tier (support/moto.py).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator

import pytest

SLUICE_PROTO_MODULE = "proto.apache.rocketmq.v2.definition_pb2"


def _guard(when: str) -> None:
    if SLUICE_PROTO_MODULE in sys.modules:
        raise pytest.UsageError(
            f"{SLUICE_PROTO_MODULE} is loaded in the end-to-end test process ({when}). tests/e2e runs the official "
            "RocketMQ client, whose protobuf modules clash with Sluice's own; run `.venv/bin/python -m pytest "
            "tests/e2e` on its own and never import proto.*, proxy.* or broker.* from tests/e2e."
        )


_guard("while loading tests/e2e/conftest.py")

from tests.e2e.support.clients import bind_client_loop  # noqa: E402
from tests.e2e.support.cluster import Cluster, start_merged, start_separated  # noqa: E402
from tests.e2e.support.moto import Moto, running_moto  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # The client calls the deprecated `Logger.warn`; that is not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:The 'warn' method is deprecated:DeprecationWarning")


# The modules that take longest, longest first (CI runs, `--durations`): `make e2e` hands whole
# modules to its workers in collection order (`--dist loadfile --no-loadscope-reorder`), so these
# start first and the short modules fill in around them; taken last, one of them set the end of the
# run (xdist's own order puts modules with many tests first, and most of these have few). The
# Spark modules are spread out: their JVMs starting together would crowd two cores.
LONGEST_FIRST = (
    "test_replication_faults.py",
    "test_console.py",
    "test_node_client.py",
    "test_replication.py",
    "test_spark_e2e.py",
    "test_auth.py",
    "test_fleet.py",
    "test_cluster_topics.py",
    "test_failover_schedules.py",
    "test_spark_stream_tiers.py",
    "test_transactions.py",
    "test_hosts_merged.py",
    "test_mqtt_secure.py",
    "test_readme.py",
    "test_amqp.py",
    "test_timers.py",
    "test_spark_stream_failover.py",
    "test_topic_deletion.py",
    "test_broker_balance_faults.py",
    "test_operations.py",
    "test_hosts_schedules.py",
    "test_amqp_mapping.py",
    "test_mqtt.py",
    "test_hosts_separated.py",
    "test_tls.py",
)


@pytest.hookimpl(trylast=True)  # after pytest grouped the tests by fixture parameter
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of LONGEST_FIRST first, in its order; the others after them, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    _guard("after collecting the tests")


@pytest.fixture(autouse=True)
def _no_sluice_protos() -> Iterator[None]:
    _guard("before a test")
    yield
    _guard("after a test")


@pytest.fixture(autouse=True)
def _client_loop_bound() -> None:
    """Tests that build an official client themselves get `start()`'s loop binding too (an earlier
    test's `asyncio.run` leaves this thread without a current event loop)."""
    bind_client_loop()


@pytest.fixture(scope="session")
def _shared_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Cluster]]:
    """The shared clusters by kind, each started on first use and stopped when the session ends.

    `cluster` is parametrised; pytest tears a parametrised fixture down whenever the next test wants
    the other parameter, and under `--dist loadfile` every module alternates (its merged tests, then
    its separated ones), so each module restarted both topologies. Kept here, each starts once per
    process."""
    started: dict[str, Cluster] = {}
    try:
        yield started
    finally:
        problems = [problem for shared in started.values() for problem in shared.stop()]
        assert not problems, "cluster teardown:\n" + "\n".join(problems)


@pytest.fixture(scope="session", params=["merged", "separated"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, _shared_clusters: dict[str, Cluster]
) -> Cluster:
    """The shared clusters. The merged one runs two shards (`sluice up --shards 2`, docs/shards.md: two
    merged nodes, each queue routed to the node owning it), so every merged test also crosses shards;
    tests whose point is the single process start their own `start_merged(..., shards=1)` cluster."""
    kind: str = request.param
    if kind not in _shared_clusters:
        root = tmp_path_factory.mktemp(f"cluster-{kind}")
        # Both also serve AMQP and MQTT on free ports (tests/e2e/test_amqp.py, test_mqtt*.py).
        _shared_clusters[kind] = (
            start_merged(root, shards=2, amqp=True, mqtt=True)
            if kind == "merged"
            else start_separated(root, amqp=True, mqtt=True)
        )
    return _shared_clusters[kind]


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """A moto S3 server child process for the module's tiering clusters (support/moto.py)."""
    with running_moto(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique("orders")` → `orders-<test>-<8 hex>`: a fresh, valid topic/group name per call."""
    test = "".join(c if c.isalnum() else "-" for c in request.node.originalname)[:40].strip("-")

    def make(prefix: str) -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make
