"""Topics: the list (paged, with backlog, rates, bytes on disk and in S3, lite topics), a topic's
page (queues, rate in/out plots, tiering, lite topics), create, change and delete.

Create, change and delete call `admin.topics` exactly as `sluice admin topic create [--update]
| update --perm | delete` do, with the same parsing of the type and the same validation (by the
brokers: queues never shrink, names are checked); a refused change shows the error and changes
nothing. A change keeps the topic on the brokers that hold it (`--brokers` of the CLI). System topics
(`%DLQ%...`, names starting with `%`) are left out of the list; dead letters have their own page.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from admin import tier, topics
from admin.cluster import Cluster
from admin.output import Report
from admin.parse import parse_message_types
from common.config import ConfigError
from common.errors import SluiceError
from common.model import EXCLUSIVE_TYPES, SYSTEM_PREFIX
from console import fanout
from console.app import act, console_of, delete_confirmed, render
from console.charts import line_chart
from console.history import topic_point
from console.paging import paginate
from console.units import human_bytes

TYPES_HINT = "normal, fifo, delay, transaction, mixed or a list such as normal,delay; lite or priority alone"
KEEP = ""  # a change form's field left as it is


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/topics", topic_list)
    router.add_post("/topics", topic_create)
    router.add_get("/topics/{name}", topic_page)
    router.add_post("/topics/{name}/update", topic_update)
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
        figures: dict[str, Any] = {"written": None, "retained": None, "rate_in_per_s": None, "rate_out_per_s": None,
                                   "on_disk": "", "lite_topics": None, "error": ""}  # fmt: skip
        if isinstance(report, SluiceError):
            figures["error"] = str(report)
        else:
            point = topic_point(report)
            console.history.record_topic(row["topic"], point)
            figures.update(written=point.stored, retained=point.backlog, on_disk=human_bytes(point.local_bytes),
                           rate_in_per_s=_rounded(console.history.last_rate_in(row["topic"])),
                           rate_out_per_s=_rounded(console.history.last_topic_rate_out(row["topic"])),
                           lite_topics=_lite_count(report))  # fmt: skip
        rows.append({**row, **figures, "in_s3": human_bytes(tiered.get(row["topic"], 0))})
    return render(request, "topics.html", page=page, rows=rows, types_hint=TYPES_HINT)


async def topic_page(request: web.Request) -> web.Response:
    console = console_of(request)
    name = request.match_info["name"]
    report = await topics.describe_topic(console.cluster, name)
    point = topic_point(report)
    console.history.record_topic(name, point)
    rate_in, rate_out = await console.plots.topic_rate_in(name), await console.plots.topic_rate_out(name)
    charts = [
        line_chart(rate_in.points, title="messages in per second", unit="msg/s", source=rate_in.source),
        line_chart(rate_out.points, title="messages out per second (every delivery)", unit="msg/s",
                   source=rate_out.source),
    ]  # fmt: skip
    tiering = [t for t in await _tier_topics(console.cluster) if t["topic"] == name]
    local = sum(_count(q, "local_min", "local_max") for t in tiering for q in t["queues"]) if tiering else point.backlog
    lite = report.data if isinstance(report.data, dict) else None
    return render(request, "topic.html", name=name, report=report, point=point, charts=charts,
                  tier_rows=[tier_row(t) for t in tiering], local=local, only_in_s3=max(0, point.backlog - local),
                  on_disk=human_bytes(point.local_bytes), in_s3=human_bytes(sum(int(t["bytes"]) for t in tiering)),
                  lite=lite, current=_current(report), permissions=sorted(topics.PERMISSIONS),
                  types_hint=TYPES_HINT)  # fmt: skip


def tier_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One broker's tiering of a topic (`tier status --json`), as a person reads it: how many
    messages are on local disk and in S3 and which offsets (per queue in the cell's tooltip)."""
    return {
        "broker": doc["broker"],
        "local": _ranges_text(doc["queues"], "local_min", "local_max"),
        "local_title": _ranges_title(doc["queues"], "local_min", "local_max"),
        "tiered": _ranges_text(doc["queues"], "tiered_min", "tiered_end"),
        "tiered_title": _ranges_title(doc["queues"], "tiered_min", "tiered_end"),
        "lag_messages": doc["lag_messages"],
        "lag_s": round(doc["lag_s"], 1),
        "s3_size": human_bytes(doc["bytes"]),
        "objects": doc["objects"],
        "last_upload": doc["last_upload"],
        "error": doc["last_error"],
    }


def _count(queue: dict[str, int], low: str, high: str) -> int:
    return max(0, queue[high] - queue[low])


def _ranges_text(queues: list[dict[str, int]], low: str, high: str) -> str:
    """ "none", "300 (offsets 0-299)" for one queue, "1,200 in 4 queues" for more."""
    held = [q for q in queues if _count(q, low, high)]
    total = sum(_count(q, low, high) for q in held)
    if not held:
        return "none"
    if len(held) == 1:
        q = held[0]
        return f"{total:,} (offsets {q[low]:,}-{q[high] - 1:,})"
    return f"{total:,} in {len(held)} queues"


def _ranges_title(queues: list[dict[str, int]], low: str, high: str) -> str:
    def one(q: dict[str, int]) -> str:
        return f"offsets {q[low]:,}-{q[high] - 1:,}" if _count(q, low, high) else "none"

    return "; ".join(f"queue {q['queue_id']}: {one(q)}" for q in queues)


async def topic_create(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    form = await request.post()
    name = str(form.get("name", "")).strip()
    types_text = str(form.get("type", "normal"))
    queues_text = str(form.get("queues", "8")).strip()

    async def create() -> str:
        queues = _queue_count(queues_text)
        report = await topics.create_topic(console.cluster, name, parse_message_types(types_text), queues)
        return report.note

    return await act(request, f"create topic {name[:127]!r}", "/topics", create,
                     done=f"/topics/{name}" if name else None)  # fmt: skip


async def topic_update(request: web.Request) -> web.StreamResponse:
    """Change queues and types (`topic create --update --brokers <its brokers>`) and/or the permission
    (`topic update --perm`); a field left as it is changes nothing."""
    console = console_of(request)
    name = request.match_info["name"]
    form = await request.post()
    perm = str(form.get("perm", KEEP)).strip()
    types_text = str(form.get("type", KEEP)).strip()
    queues_text = str(form.get("queues", KEEP)).strip()

    async def update() -> str:
        if perm != KEEP and perm not in topics.PERMISSIONS:
            raise ConfigError(f"permission must be one of {', '.join(sorted(topics.PERMISSIONS))}, got {perm[:16]!r}")
        current = _current(await topics.describe_topic(console.cluster, name))
        queues = current["queues"] if queues_text == KEEP else _queue_count(queues_text)
        types = parse_message_types(types_text or current["types"])
        notes = []
        if queues != current["queues"] or types != parse_message_types(current["types"]):
            if parse_message_types(current["types"]) & EXCLUSIVE_TYPES:
                raise ConfigError(
                    f"topic {name} is a {current['types']} topic: change it with `sluice admin topic create "
                    "--update`, which takes its lite or priority settings too"
                )
            report = await topics.create_topic(console.cluster, name, types, queues, current["brokers"], update=True)
            notes.append(report.note)
        if perm not in (KEEP, current["perm"]):
            notes.append((await topics.update_permission(console.cluster, name, topics.PERMISSIONS[perm])).note)
        return "; ".join(notes) or f"topic {name}: nothing to change"

    what = f"change topic {name} (queues {queues_text[:16]!r}, type {types_text[:64]!r}, permission {perm[:16]!r})"
    return await act(request, what, f"/topics/{name}", update)


async def topic_delete(request: web.Request) -> web.StreamResponse:
    console = console_of(request)

    async def delete(name: str) -> str:
        return (await topics.delete_topic(console.cluster, name)).note

    return await delete_confirmed(request, "topic", delete, "/topics")


def _queue_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"queues must be a whole number of at least 1, got {text[:32]!r}")
    return int(text)


def _current(report: Report) -> dict[str, Any]:
    """What a topic is now, from its `describe_topic` report: queues, types, brokers, permission."""
    rows = report.rows
    perms = {r["permission"] for r in rows}
    perm_names = {p.name.lower(): short for short, p in topics.PERMISSIONS.items()}
    return {
        "queues": len(rows),
        "types": rows[0]["types"] if rows else "normal",
        "brokers": sorted({r["broker"] for r in rows}),
        "perm": perm_names.get(perms.pop(), KEEP) if len(perms) == 1 else KEEP,  # mixed: nothing to keep
    }


def _lite_count(report: Report) -> int | None:
    return int(report.data["lite_topics"]) if isinstance(report.data, dict) else None


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 2)


async def _tier_topics(cluster: Cluster) -> list[dict[str, Any]]:
    """Every broker's tiered topics (`tier status --json`: ranges per queue, bytes, lag); [] when
    a broker does not answer (the cluster page says which)."""
    try:
        return [t for broker in (await tier.status(cluster)).data for t in broker["topics"]]
    except SluiceError:
        return []


async def _tiered_bytes(cluster: Cluster) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for doc in await _tier_topics(cluster):
        sizes[doc["topic"]] = sizes.get(doc["topic"], 0) + int(doc["bytes"])
    return sizes
