"""Paging of long lists: a name filter and one page of rows, from the query string (`q`, `page`).

Bad paging input is not an error worth a page of its own: a page number that is not a positive
integer is page 1, one past the end is the last page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from aiohttp import web

T = TypeVar("T")
QUERY_CHARS_MAX = 200


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    number: int  # 1-based
    pages: int
    total: int
    first: int  # 1-based index of the first item shown (0 when none)
    last: int
    query: str


def paginate(request: web.Request, items: Sequence[T], name: Callable[[T], str], rows: int) -> Page[T]:
    query = request.query.get("q", "").strip()[:QUERY_CHARS_MAX]
    chosen = [i for i in items if query.lower() in name(i).lower()] if query else list(items)
    pages = max(1, -(-len(chosen) // rows))
    text = request.query.get("page", "1")
    number = min(max(int(text), 1), pages) if text.isdigit() else 1
    start = (number - 1) * rows
    shown = chosen[start : start + rows]
    return Page(shown, number, pages, len(chosen), start + 1 if shown else 0, start + len(shown), query)
