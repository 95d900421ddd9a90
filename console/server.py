"""Running the console: the aiohttp server on `host:port`, the plot sampler, until `stop` is set.

Used by `sluice console` and by `sluice up --console-port` (the merged topology serves it from the
same process, through the same admin functions over loopback gRPC).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from admin.cluster import Cluster
from console.app import CONSOLE, build_app
from console.config import ConsoleConfig
from navigation.client import NavigationClient

log = logging.getLogger("sluice.console")
SHUTDOWN_GRACE_S = 2.0


async def run_console(config: ConsoleConfig, stop: asyncio.Event, on_ready: Callable[[str], None]) -> None:
    """Serve until `stop`; `on_ready(url)` once listening. OSError if the port cannot be bound."""
    navigation = NavigationClient(config.navigation, timeout_s=config.timeout_s) if config.navigation else None
    async with Cluster(
        config.namesrv, timeout_s=config.timeout_s, nameserver_cache_s=config.nameserver_cache_s
    ) as cluster:
        app = build_app(config, cluster, navigation)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        try:
            site = web.TCPSite(runner, config.host, config.port)
            await site.start()
            url = _url(runner, config.host)
            log.info("console listening on %s (read-only: %s, auth: %s)", url, config.read_only, config.auth)
            on_ready(url)
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(app[CONSOLE].history.run(cluster, stop))
                await stop.wait()
        finally:
            await runner.cleanup()
            if navigation is not None:
                await navigation.close()


def _url(runner: web.AppRunner, host: str) -> str:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return f"http://{host}:{address[1]}"
    return f"http://{host}"
