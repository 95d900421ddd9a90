"""Reading many topics or groups for one page: concurrent admin calls, bounded, failures kept per item.

A list page shows one page of rows (50 by default) and reads each row's figures with one admin call
(`describe_topic`, `describe_group`); they run concurrently, at most `CONCURRENCY_MAX` at a time, so
a page costs about one broker round trip per `CONCURRENCY_MAX` rows. A row whose call fails shows
the error instead of its figures; the rest of the page still renders.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from common.errors import SluiceError

T = TypeVar("T")
R = TypeVar("R")
CONCURRENCY_MAX = 16


async def each(items: Sequence[T], call: Callable[[T], Awaitable[R]]) -> list[R | SluiceError]:
    gate = asyncio.Semaphore(CONCURRENCY_MAX)

    async def one(item: T) -> R | SluiceError:
        async with gate:
            try:
                return await call(item)
            except SluiceError as exc:
                return exc

    return list(await asyncio.gather(*(one(i) for i in items)))
