"""Messages: search a topic by message id, by key or by store time; a message's page with its trace.

The topic is chosen from a list (the NameServer's topics; dead-letter topics apart), or typed
when the NameServer cannot be asked.

The search calls `admin.messages` (`get_message`, `find_messages`, `list_messages`), the
message page `get_message` and `admin.trace.trace_message`, as `sluice admin message
get|find|list|trace` do. A body is shown as pretty-printed JSON when it parses as JSON, as text when
it is UTF-8, else as a hex dump. A dead letter's page offers to resend it (console/pages_dlq.py).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from aiohttp import web

from admin import messages, topics, trace
from admin.output import Report
from admin.parse import parse_time_ms
from common.config import ConfigError
from common.errors import MessageNotFound, SluiceError
from common.model import DLQ_PREFIX, validate_topic_name
from console.app import console_of, describe, error_status, render

SEARCH_LIMIT = 200
HEX_BYTES_MAX = 4096
_HOUR_MS = 3_600_000


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/messages", search)
    router.add_get("/messages/{topic}/{message_id}", message_page)


async def search(request: web.Request) -> web.Response:
    q = request.query
    form = {k: q.get(k, "").strip() for k in ("topic", "id", "key", "from", "to")}
    report: Report | None = None
    error, status = "", 200
    if any(form.values()):
        try:
            report = await _search(request, form)
        except (ConfigError, SluiceError) as exc:  # shown above the form, which keeps what was typed
            error, status = describe(exc), error_status(exc)
    topic_names, dead_letter_topics = await _topic_choices(request)
    return render(request, "messages.html", status=status, form=form, report=report, error=error,
                  limit=SEARCH_LIMIT, topic_names=topic_names, dead_letter_topics=dead_letter_topics)  # fmt: skip


async def _topic_choices(request: web.Request) -> tuple[list[str] | None, list[str]]:
    """The topics to choose from: user topics, and dead-letter topics apart; (None, []) when the
    NameServer cannot be asked (the form then takes the name as text)."""
    try:
        names = sorted(r["topic"] for r in (await topics.list_topics(console_of(request).cluster)).rows)
    except SluiceError:
        return None, []
    return [n for n in names if not n.startswith("%")], [n for n in names if n.startswith(DLQ_PREFIX)]


async def _search(request: web.Request, form: dict[str, str]) -> Report:
    cluster = console_of(request).cluster
    topic = form["topic"]
    if not topic:
        raise ConfigError("give the topic to search")
    validate_topic_name(topic, allow_system=True)
    if form["id"]:
        return await messages.get_message(cluster, topic, form["id"])
    if form["key"]:
        return await messages.find_messages(cluster, topic, form["key"], SEARCH_LIMIT)
    now_ms = int(time.time() * 1000)
    begin = parse_time_ms(form["from"], "from") if form["from"] else now_ms - _HOUR_MS
    end = parse_time_ms(form["to"], "to") if form["to"] else now_ms + 1
    return await messages.list_messages(cluster, topic, begin, end, SEARCH_LIMIT)


async def message_page(request: web.Request) -> web.Response:
    console = console_of(request)
    topic, message_id = request.match_info["topic"], request.match_info["message_id"]
    validate_topic_name(topic, allow_system=True)
    copies: list[dict[str, Any]] = (await messages.get_message(console.cluster, topic, message_id)).data
    try:
        traced: Report | None = await trace.trace_message(console.cluster, message_id)
    except MessageNotFound:
        traced = None
    shown = [{**c, "body_view": body_view(base64.b64decode(c["body_base64"]))} for c in copies]
    group = topic[len(DLQ_PREFIX) :] if topic.startswith(DLQ_PREFIX) else ""
    return render(request, "message.html", topic=topic, message_id=message_id, copies=shown, trace=traced,
                  dlq_group=group)  # fmt: skip


def body_view(body: bytes) -> dict[str, str]:
    """{"kind": "json"|"text"|"hex"|"empty", "text": what to show}."""
    if not body:
        return {"kind": "empty", "text": ""}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return {"kind": "hex", "text": _hex_dump(body[:HEX_BYTES_MAX]) + ("\n…" if len(body) > HEX_BYTES_MAX else "")}
    try:
        return {"kind": "json", "text": json.dumps(json.loads(text), indent=2, ensure_ascii=False)}
    except ValueError:
        return {"kind": "text", "text": text}


def _hex_dump(data: bytes) -> str:
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<47}  {printable}")
    return "\n".join(lines)
