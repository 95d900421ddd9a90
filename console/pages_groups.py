"""Consumer groups: the list (paged, with lag, in-flight, retries and dead letters), a group's page,
create, delete.

A group's page shows per topic its backlog (lag), messages in flight and being retried, its dead
letters, its lag and consume-rate plots, per queue the offsets (`describe_group`, as
`sluice admin group describe --json`: lag, in flight, retrying, dead letters) and the clients connected
(`admin.clients.list_clients`, as `sluice admin client list --group`). Create, delete and
reset-offset call `admin.groups` and `admin.offsets.reset_offsets` exactly as
`sluice admin group create|delete|reset-offset` do, with the same parsing; a reset needs the
"confirm" box ticked and can be a dry run first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from admin import clients, groups, offsets
from admin.output import Report
from admin.parse import parse_consume_from, parse_reset_target
from broker.client.api import GroupSpec
from common.config import ConfigError
from common.errors import SluiceError
from console import fanout
from console.app import act, console_of, delete_confirmed, render, session_of
from console.charts import line_chart
from console.history import group_point
from console.paging import paginate


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/groups", group_list)
    router.add_post("/groups", group_create)
    router.add_get("/groups/{name}", group_page)
    router.add_post("/groups/{name}/delete", group_delete)
    router.add_post("/groups/{name}/reset-offset", group_reset_offset)


async def group_list(request: web.Request) -> web.Response:
    console = console_of(request)
    cluster = console.cluster
    listed = (await groups.list_groups(cluster)).rows
    page = paginate(request, listed, lambda r: r["group"], console.config.page_rows)
    described = await fanout.each(page.items, lambda r: groups.describe_group(cluster, r["group"]))
    rows = []
    for row, report in zip(page.items, described, strict=True):
        figures: dict[str, Any] = {"lag": None, "in_flight": None, "retrying": None, "dead_letters": None,
                                   "rate_out_per_s": None, "error": ""}  # fmt: skip
        if isinstance(report, SluiceError):
            figures["error"] = str(report)
        else:
            point = group_point(report)
            console.history.record_group(row["group"], point)
            rate = console.history.last_rate_out(row["group"])
            figures.update(lag=point.lag, in_flight=point.in_flight, retrying=point.retrying,
                           dead_letters=report.data["dead_letters"],
                           rate_out_per_s=None if rate is None else round(rate, 2))  # fmt: skip
        rows.append({**row, **figures})
    return render(request, "groups.html", page=page, rows=rows)


async def group_page(request: web.Request) -> web.Response:
    console = console_of(request)
    name = request.match_info["name"]
    report = await groups.describe_group(console.cluster, name)
    console.history.record_group(name, group_point(report))
    connected = await clients.list_clients(console.cluster, group=name)
    per_topic = _per_topic(report)
    lag, rate = await console.plots.group_lag(name), await console.plots.group_rate_out(name)
    charts = [
        line_chart(lag.points, title="lag (messages not acknowledged)", unit="messages", source=lag.source),
        line_chart(rate.points, title="consumed per second", unit="msg/s", source=rate.source),
    ]
    return render(request, "group.html", name=name, report=report, per_topic=per_topic, charts=charts,
                  group=report.data["group"], dead_letters=report.data["dead_letters"], clients=connected,
                  preview=_take_preview(request))  # fmt: skip


async def group_create(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    form = await request.post()
    name = str(form.get("name", "")).strip()

    async def create() -> str:
        consume_from, timestamp_ms = parse_consume_from(str(form.get("consume_from", "latest")) or "latest")
        spec = GroupSpec(name, fifo=form.get("fifo") == "on", consume_from=consume_from,
                         consume_from_timestamp_ms=timestamp_ms)  # fmt: skip
        attempts = str(form.get("max_attempts", "")).strip()
        if attempts:
            if not attempts.isdigit():
                raise ConfigError(f"max attempts must be a whole number, got {attempts[:32]!r}")
            spec = dataclasses.replace(spec, max_delivery_attempts=int(attempts))
        return (await groups.create_group(console.cluster, spec)).note

    return await act(request, f"create group {name[:127]!r}", "/groups", create,
                     done=f"/groups/{name}" if name else None)  # fmt: skip


async def group_delete(request: web.Request) -> web.StreamResponse:
    console = console_of(request)

    async def delete(name: str) -> str:
        return (await groups.delete_group(console.cluster, name)).note

    return await delete_confirmed(request, "group", delete, "/groups")


async def group_reset_offset(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    name = request.match_info["name"]
    form = await request.post()
    topic = str(form.get("topic", "")).strip()
    to = str(form.get("to", "")).strip()
    dry_run = form.get("dry_run") == "on"

    async def reset() -> str:
        if not topic:
            raise ConfigError("choose the topic whose offsets to reset")
        target = parse_reset_target(to)
        if not dry_run and form.get("confirm") != "on":
            raise ConfigError("tick 'confirm' to reset the offsets (or choose a dry run first)")
        report = await offsets.reset_offsets(console.cluster, name, topic, target, dry_run=dry_run)
        if dry_run:
            session_of(request).preview = report.rows
        return report.note

    what = f"{'dry run of ' if dry_run else ''}reset offsets of group {name} on topic {topic[:127]!r} to {to[:64]!r}"
    return await act(request, what, f"/groups/{name}", reset)


def _take_preview(request: web.Request) -> list[dict[str, Any]]:
    session = session_of(request)
    rows, session.preview = session.preview, []
    return rows


def _per_topic(report: Report) -> list[dict[str, Any]]:
    totals: dict[str, dict[str, Any]] = {}
    for row in report.rows:
        t = totals.setdefault(row["topic"], {"topic": row["topic"], "queues": 0, "lag": 0, "in_flight": 0,
                                             "retrying": 0})  # fmt: skip
        t["queues"] += 1
        t["lag"] += row["lag"]
        t["in_flight"] += row["in_flight"]
        t["retrying"] += row["retrying"]
    return [totals[k] for k in sorted(totals)]
