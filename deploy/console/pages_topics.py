"""Topics: the list (paged, with backlog, rate in and bytes tiered), a topic's page, create and delete.

Create and delete call `deploy.admin.topics` exactly as `sluice admin topic create|delete` does, with
the same parsing of the type and the same validation (by the brokers); a refused change shows the
error and changes nothing. System topics (`%DLQ%...`, names starting with `%`) are left out of the
list; dead letters have their own page.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from common.config import ConfigError
from common.errors import SluiceError
from common.model import SYSTEM_PREFIX
from deploy.admin import tier, topics
from deploy.admin.cluster import Cluster
from deploy.admin.parse import parse_message_types
from deploy.console import fanout
from deploy.console.app import act, console_of, render
from deploy.console.charts import line_chart
from deploy.console.history import topic_point
from deploy.console.paging import paginate

TYPES_HINT = "normal, fifo, delay, transaction, mixed or a list such as normal,delay"


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/topics", topic_list)
    router.add_post("/topics", topic_create)
    router.add_get("/topics/{name}", topic_page)
    router.add_post("/topics/{name}/delete", topic_delete)


async def topic_list(request: web.Request) -> web.Response:
    console = console_of(request)
    listed = (await topics.list_topics(console.cluster)).rows
    user_topics = [r for r in listed if not r["topic"].startswith(SYSTEM_PREFIX)]
    page = paginate(request, user_topics, lambda r: r["topic"], console.config.page_rows)
    described = await fanout.each(page.items, lambda r: topics.describe_topic(console.cluster, r["topic"]))
    tiered = await _tiered_bytes(console.cluster)
    rows = []
    for row, report in zip(page.items, described, strict=True):
        figures: dict[str, Any] = {"stored": None, "backlog": None, "rate_in_per_s": None, "error": ""}
        if isinstance(report, SluiceError):
            figures["error"] = str(report)
        else:
            point = topic_point(report)
            console.history.record_topic(row["topic"], point)
            rate = console.history.last_rate_in(row["topic"])
            figures.update(stored=point.stored, backlog=point.backlog,
                           rate_in_per_s=None if rate is None else round(rate, 2))  # fmt: skip
        rows.append({**row, **figures, "bytes_in_s3": tiered.get(row["topic"], 0)})
    return render(request, "topics.html", page=page, rows=rows, types_hint=TYPES_HINT)


async def topic_page(request: web.Request) -> web.Response:
    console = console_of(request)
    name = request.match_info["name"]
    report = await topics.describe_topic(console.cluster, name)
    point = topic_point(report)
    console.history.record_topic(name, point)
    chart = line_chart(console.history.topic_rate_in(name), title="messages in per second", unit="/s")
    tier_rows = [r for r in (await _tier_rows(console.cluster)) if r.get("topic") == name]
    return render(request, "topic.html", name=name, report=report, point=point, chart=chart,
                  tier_rows=tier_rows)  # fmt: skip


async def topic_create(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    form = await request.post()
    name = str(form.get("name", "")).strip()
    types_text = str(form.get("type", "normal"))
    queues_text = str(form.get("queues", "8")).strip()

    async def create() -> str:
        if not queues_text.isdigit() or int(queues_text) < 1:
            raise ConfigError(f"queues must be a whole number of at least 1, got {queues_text[:32]!r}")
        report = await topics.create_topic(console.cluster, name, parse_message_types(types_text), int(queues_text))
        return report.note

    return await act(request, f"create topic {name[:127]!r}", "/topics", create,
                     done=f"/topics/{name}" if name else None)  # fmt: skip


async def topic_delete(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    name = request.match_info["name"]
    form = await request.post()

    async def delete() -> str:
        if form.get("confirm") != name:
            raise ConfigError(f"type the topic's name ({name}) to confirm its deletion")
        return (await topics.delete_topic(console.cluster, name)).note

    return await act(request, f"delete topic {name}", f"/topics/{name}", delete, done="/topics")


async def _tier_rows(cluster: Cluster) -> list[dict[str, Any]]:
    try:
        return (await tier.status(cluster)).rows
    except SluiceError:
        return []


async def _tiered_bytes(cluster: Cluster) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for row in await _tier_rows(cluster):
        sizes[row["topic"]] = sizes.get(row["topic"], 0) + int(row.get("bytes") or 0)
    return sizes
