"""common/logs.py: request id and client id on every line of an RPC, JSON lines, runtime level."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from common import logs


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.RequestContextFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream, handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_json_lines_carry_the_request_of_their_task(captured: tuple[io.StringIO, logging.Handler]) -> None:
    stream, handler = captured
    handler.setFormatter(logs._JsonFormatter())
    log = logging.getLogger("sluice.test")

    async def rpc(request_id: str, client_id: str) -> None:
        logs.bind_request(request_id, client_id)
        await asyncio.sleep(0)  # interleave the two "RPCs"
        log.info("handled", extra=logs.kv(topic="t"))

    async def main() -> None:
        await asyncio.gather(rpc("r1", "c1"), rpc("r2", "c2"))
        log.info("outside")

    asyncio.run(main())
    docs = [json.loads(line) for line in stream.getvalue().splitlines()]
    handled = sorted((d["request_id"], d["client_id"], d["topic"]) for d in docs if d["msg"] == "handled")
    assert handled == [("r1", "c1", "t"), ("r2", "c2", "t")]
    outside = next(d for d in docs if d["msg"] == "outside")
    assert "request_id" not in outside and "client_id" not in outside


def test_text_lines_append_the_request_fields(captured: tuple[io.StringIO, logging.Handler]) -> None:
    stream, handler = captured
    handler.setFormatter(logs._TextFormatter("%(message)s"))

    async def rpc() -> None:
        logs.bind_request("req-9", "client-9")
        logging.getLogger("sluice.test").warning("slow", extra=logs.kv(ms=12))

    asyncio.run(rpc())
    assert stream.getvalue().strip() == "slow ms=12 request_id=req-9 client_id=client-9"


def test_level_changes_at_runtime_and_rejects_unknown_levels() -> None:
    root = logging.getLogger()
    old = root.level
    try:
        logs.set_level("debug")
        assert logs.get_level() == "debug"
        logs.set_level(" WARNING ")
        assert logs.get_level() == "warning"
        for bad in ("loud", "", "critical", "notset"):
            with pytest.raises(ValueError, match="use debug, info, warning or error"):
                logs.set_level(bad)
        assert logs.get_level() == "warning"
    finally:
        root.setLevel(old)


def test_debug_is_ours_not_the_libraries() -> None:
    """At debug, gRPC's `[_cygrpc] Loaded running loop` (one per call) flooded the log."""
    root = logging.getLogger()
    old = root.level
    try:
        logs.set_level("debug")
        assert logging.getLogger("sluice.broker").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.INFO)
        logs.set_level("warning")
        assert not logging.getLogger("botocore.endpoint").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(old)
        for name in logs.QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_a_burst_of_like_events_is_one_line_and_a_count(captured: tuple[io.StringIO, logging.Handler]) -> None:
    """One consumer failing every message dead-lettered 201 messages in 201 INFO lines."""
    stream, handler = captured
    handler.setFormatter(logs._TextFormatter("%(message)s"))
    burst = logs.BurstLog(logging.getLogger("sluice.test"), "moved", window_s=0.2)

    async def main() -> None:
        for i in range(201):
            burst.event(("g", "t"), group="g", id=i)
        burst.event(("g2", "t"), group="g2", id=0)  # another key: a line of its own
        await asyncio.sleep(0.4)  # the window closes: one line counts the rest
        burst.event(("g", "t"), group="g", id=201)  # a new burst starts with a line

    asyncio.run(main())
    assert stream.getvalue().splitlines() == [
        "moved group=g id=0",
        "moved group=g2 id=0",
        "moved (more within 0.2 s) count=200 group=g id=200",
        "moved group=g id=201",
    ]
