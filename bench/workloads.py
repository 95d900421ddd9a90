"""The loops a bench run is made of: one task each, all stopping by themselves at a deadline.

`produce_loop` sends `batch` messages per SendMessage call, either as fast as the server answers
(`interval_s=None`, a closed loop: one call in flight per task) or on a fixed schedule (open loop:
call k of a task is due at `first_s + k * interval_s`). On a schedule, latency is measured from
the time the call was *due* whenever the task is behind (the previous call overran), so a slow
server is charged for the calls it delayed (no coordinated omission); when the task is on time it
is measured from the moment the call starts (timer lateness is the generator's, not the server's).
A task still behind schedule at the deadline stops anyway and counts the messages it never sent
(`unsent`): a rate the server could not keep shows as unsent messages, not as a longer run.

`consume_loop` receives a batch (long polling), acks the whole batch in one AckMessage, and — for
end-to-end runs — records now minus the born time carried in each message of this run.

Every call has a deadline (the client's); a failed call is counted by code and followed by a short
pause, so a dead server cannot turn a loop into a busy spin.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.client import BenchClient, CallError
from bench.payload import BORN_PROPERTY, RUN_PROPERTY, SendPayload
from bench.stats import Meter
from proto.apache.rocketmq.v2 import definition_pb2 as pb

ERROR_PAUSE_S = 0.05


@dataclass(frozen=True)
class Deadline:
    """When loops stop: at `at_s` (time.monotonic) or as soon as `stop` is set (a signal)."""

    at_s: float
    stop: asyncio.Event

    def passed(self, now_s: float | None = None) -> bool:
        return self.stop.is_set() or (time.monotonic() if now_s is None else now_s) >= self.at_s


class Rotation:
    """The client of each call: the next of `clients` (round robin from `start`). A producer that
    follows the route gets one per writable queue, as the official producers pick the next queue
    for each send and send it to that queue's endpoint; otherwise it holds one client."""

    def __init__(self, clients: Sequence[BenchClient], start: int = 0) -> None:
        self._clients = list(clients)
        self._next = start % len(self._clients)

    def __call__(self) -> BenchClient:
        client = self._clients[self._next]
        self._next = (self._next + 1) % len(self._clients)
        return client


async def produce_loop(
    clients: Rotation, payload: SendPayload, meter: Meter, deadline: Deadline, *, batch: int,
    interval_s: float | None = None, first_s: float = 0.0,
) -> None:  # fmt: skip
    due_s = first_s
    while True:
        now = time.monotonic()
        if interval_s is None:
            if deadline.passed(now):
                return
            started = now
        else:
            if deadline.passed(now) or deadline.passed(due_s):
                if due_s < deadline.at_s and not deadline.stop.is_set():  # behind schedule at the end
                    meter.unsent += batch * math.ceil((deadline.at_s - due_s) / interval_s)
                return
            if due_s > now:
                await asyncio.sleep(due_s - now)
                if deadline.stop.is_set():
                    return
                started = time.monotonic()
            else:
                started = due_s  # behind schedule: charge the wait to the server
            due_s += interval_s
        try:
            failed = await clients().send(payload.request(batch))
        except CallError as exc:
            meter.error(exc.code, batch)
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        meter.record(time.monotonic() - started, batch - len(failed))
        for code in failed:
            meter.error(code)


@dataclass(frozen=True)
class ConsumeSpec:
    group: str
    topic: str
    batch: int
    invisible_s: float
    long_poll_s: float
    run_id: str = ""  # end-to-end latency is measured for messages of this run only


async def consume_loop(
    client: BenchClient, queue: pb.MessageQueue, spec: ConsumeSpec, receive: Meter, ack: Meter, deadline: Deadline,
    e2e: Meter | None = None,
) -> None:  # fmt: skip
    while not deadline.passed():
        started = time.monotonic()
        try:
            messages = await client.receive(spec.group, queue, batch=spec.batch, invisible_s=spec.invisible_s,
                                            long_poll_s=spec.long_poll_s)  # fmt: skip
        except CallError as exc:
            receive.error(exc.code)
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        received = time.monotonic()
        epoch = ack.epoch
        receive.record(received - started, len(messages))
        if not messages:
            continue
        if e2e is not None:
            _record_e2e(messages, spec.run_id, e2e)
        try:
            failed = await client.ack(spec.group, spec.topic, messages)
        except CallError as exc:
            ack.error(exc.code, len(messages))
            continue
        if ack.epoch != epoch:
            continue  # received during the warm-up: its ack is not part of the measurement either
        ack.record(time.monotonic() - received, len(messages) - len(failed))
        for code in failed:
            ack.error(code)


def _record_e2e(messages: list[pb.Message], run_id: str, e2e: Meter) -> None:
    now_ns = time.time_ns()
    for m in messages:
        props = m.user_properties
        if props.get(RUN_PROPERTY) != run_id:
            continue  # a backlog of an earlier run: its age says nothing about this one
        born = props.get(BORN_PROPERTY)
        if born is not None and born.isdigit():
            e2e.record(max(0, now_ns - int(born)) / 1e9, 1)
