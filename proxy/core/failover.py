"""A call to a broker group that may be failing over: the proxy finds the new primary itself.

A member that is not the group's primary (a replica, a fenced or deposed primary) refuses with
`NotPrimary`; nothing was done. A killed primary cannot be reached at all (`Unreachable`). In both
cases the group's next primary registers under the same name (docs/replication.md), so
`call_through_failover` looks the name's address up again every `FAILOVER_POLL_S` and calls there,
while the client's deadline allows (less `FAILOVER_MARGIN_S`, kept for the call itself), or
`FAILOVER_WAIT_S` when it set none. Only then does the refusal reach the client. Sends, receives,
acks and invisible-duration changes all go through it (proxy/core/producer.py, consumer.py).

A send a primary refused because too few members are in sync (`TooFewInSync`: its replicas cut
off, or a new primary's not caught up yet) was not acknowledged, and the primary takes it once a
replica is back: a send to a topic's only broker (group) is retried there the same way, every
`FAILOVER_POLL_S` within the deadline (`wait_in_sync`). Not an ack: the primary applied it before
it refused it, and a retry would find the handle spent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker.client.api import CallContext, MessagingApi
from common.errors import NotPrimary, TooFewInSync, Unavailable, Unreachable
from proxy.directory import BrokerDirectory

T = TypeVar("T")

# How long a call waits for a group's new primary when its client set no deadline.
FAILOVER_WAIT_S = 5.0
# How often the new primary's address is looked for meanwhile, and what is kept of the client's
# deadline for the retried call itself.
FAILOVER_POLL_S = 0.2
FAILOVER_MARGIN_S = 0.5


async def _always() -> bool:
    return True


async def _never() -> bool:
    return False


async def call_through_failover(
    directory: BrokerDirectory, broker: str, call: Callable[[MessagingApi], Awaitable[T]], ctx: CallContext, *,
    wait_unreachable: Callable[[], Awaitable[bool]] = _always, wait_in_sync: Callable[[], Awaitable[bool]] = _never,
) -> T:  # fmt: skip
    """`call(api)` on `broker`. On `NotPrimary`, or `Unreachable` when `wait_unreachable()` says the
    caller has nowhere else to go (a topic's only broker, the broker a receipt handle names), wait for
    the group's new address and call there until the deadline; on `TooFewInSync` too when
    `wait_in_sync()` says so (the group's primary takes it once a replica is back in sync; a topic's
    only broker, else the client's retry goes to another). Another retriable refusal is
    retried once if the broker has moved meanwhile, else raised (the client retries elsewhere)."""
    api: MessagingApi = directory.broker(broker)
    loop = asyncio.get_running_loop()
    remaining = ctx.remaining_s()
    until = loop.time() + (FAILOVER_WAIT_S if remaining is None else remaining - FAILOVER_MARGIN_S)
    while True:
        try:
            return await call(api)
        except Unavailable as exc:
            if (
                isinstance(exc, NotPrimary)
                or (isinstance(exc, TooFewInSync) and await wait_in_sync())
                or (isinstance(exc, Unreachable) and await wait_unreachable())
            ):
                # The group's new primary (a new address), this one's term again (a primary that
                # rode out a coordinator pause), or its replicas back in sync: ask again shortly,
                # while the deadline allows.
                if loop.time() + FAILOVER_POLL_S >= until:
                    raise
                await asyncio.sleep(FAILOVER_POLL_S)
                with contextlib.suppress(Unavailable):
                    await directory.moved(broker)
                    api = directory.broker(broker)
                continue
            # Moved while the call ran (the route refresh learned the group's new address and
            # closed the client of the old one, cancelling the call: a paused primary's successor),
            # or moved now: once more, there.
            current = api
            with contextlib.suppress(Unavailable):
                current = directory.broker(broker)
            moved = current if current is not api else await directory.moved(broker)
            if moved is None:
                raise
            return await call(moved)
