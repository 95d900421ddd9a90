"""Prometheus metrics of a running cluster, as the e2e tests read them: every process's /metrics
(`Cluster.ops`) scraped over HTTP and summed per series, so one assertion holds for one merged
process and for the separated topology alike."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.support.cluster import Cluster

HTTP_TIMEOUT_S = 5.0

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def http(address: str, path: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{address}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(cluster: Cluster) -> tuple[set[str], Series]:
    """(family names with their TYPE line, summed samples) over every process of the cluster."""
    names: set[str] = set()
    series: Series = {}
    for address in cluster.ops.values():
        status, body = http(address, "/metrics")
        assert status == 200, f"/metrics of {address} answered {status}"
        text = body.decode()
        names.update(re.findall(r"^# TYPE (sluice_\S+) ", text, flags=re.MULTILINE))
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                series[key] = series.get(key, 0.0) + s.value
    return names, series


def total(series: Series, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and want <= set(ls))
