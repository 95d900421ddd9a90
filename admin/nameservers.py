"""`sluice admin nameserver list`: each NameServer of `--namesrv` asked on its own.

The other commands ask the NameServers as a set (the first that answers); this one asks every
address and says which answer and what each knows (brokers, topics), so a NameServer that is down,
or that lost its registrations, shows. The console's cluster page shows the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

from admin.output import Report
from common.errors import SluiceError
from nameserver.client import NameServerClient, parse_addresses

COLUMNS = ["nameserver", "health", "brokers", "topics", "error"]


async def list_nameservers(namesrv: str, timeout_s: float) -> Report:
    rows = await asyncio.gather(*(_ask(address, timeout_s) for address in parse_addresses(namesrv)))
    down = sum(1 for r in rows if r["health"] != "ok")
    return Report(columns=COLUMNS, rows=list(rows), note=f"{len(rows)} NameServer(s), {down} not answering")


async def _ask(address: str, timeout_s: float) -> dict[str, Any]:
    async with NameServerClient(address, timeout_s=timeout_s) as client:
        try:
            brokers, topics = await asyncio.gather(client.list_brokers(), client.list_topics())
        except SluiceError as exc:
            return {"nameserver": address, "health": "unreachable", "brokers": None, "topics": None,
                    "error": str(exc)}  # fmt: skip
    return {"nameserver": address, "health": "ok", "brokers": len(brokers), "topics": len(topics), "error": ""}
