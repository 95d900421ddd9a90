"""Dead letters: the groups that have some, a group's dead letters (why they got there), resend.

Reads and resends go through `admin.dlq`, as `sluice admin dlq list|resend` do: a resent
dead letter is a new message (new id) in its origin topic (or the topic given), carrying the
property `SLUICE_RESENT_FROM` with the original id; the dead letter stays listed.
"""

from __future__ import annotations

from aiohttp import web

from admin import dlq, topics
from common.config import ConfigError
from common.errors import SluiceError
from common.model import DLQ_PREFIX, validate_group_name
from console import fanout
from console.app import act, console_of, render
from console.history import topic_point
from console.paging import paginate

IDS_MAX = 1000


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/dlq", dlq_groups)
    router.add_get("/dlq/{group}", dlq_group)
    router.add_post("/dlq/{group}/resend", dlq_resend)


async def dlq_groups(request: web.Request) -> web.Response:
    console = console_of(request)
    names = [r["topic"] for r in (await topics.list_topics(console.cluster)).rows if r["topic"].startswith(DLQ_PREFIX)]
    page = paginate(request, names, lambda n: n[len(DLQ_PREFIX) :], console.config.page_rows)
    reports = await fanout.each(page.items, lambda n: topics.describe_topic(console.cluster, n))
    rows = [
        {"group": n[len(DLQ_PREFIX) :], "dead_letters": None if isinstance(r, SluiceError) else topic_point(r).backlog}
        for n, r in zip(page.items, reports, strict=True)
    ]
    return render(request, "dlq_groups.html", page=page, rows=rows)


async def dlq_group(request: web.Request) -> web.Response:
    console = console_of(request)
    group = request.match_info["group"]
    validate_group_name(group)
    letters = await dlq.read_dead_letters(console.cluster, group)
    rows = [d.to_row() for d in letters]
    page = paginate(request, rows, lambda r: f"{r['message_id']} {r['origin_topic']} {r['tag'] or ''}",
                    console.config.page_rows)  # fmt: skip
    return render(request, "dlq_group.html", group=group, page=page, total=len(rows),
                  capped=len(rows) >= dlq.DLQ_READ_MAX, columns=dlq.DLQ_COLUMNS)  # fmt: skip


async def dlq_resend(request: web.Request) -> web.StreamResponse:
    console = console_of(request)
    group = request.match_info["group"]
    form = await request.post()
    ids = [str(v).strip() for v in form.getall("id", []) if str(v).strip()]
    every = form.get("all") == "on"
    to = str(form.get("to", "")).strip() or None

    async def resend() -> str:
        validate_group_name(group)
        if every and ids:
            raise ConfigError("choose either some dead letters or all of them, not both")
        if not every and not ids:
            raise ConfigError("choose at least one dead letter to resend (or all)")
        if len(ids) > IDS_MAX:
            raise ConfigError(f"at most {IDS_MAX} ids at once; use all")
        return (await dlq.resend(console.cluster, group, None if every else ids, to)).note

    what = f"resend {'all' if every else len(ids)} dead letter(s) of group {group[:127]!r}" + (
        f" to {to}" if to else ""
    )
    return await act(request, what, f"/dlq/{group}", resend)
