"""`Durability`: what a write waits for before it is acknowledged, handed to the store at construction.

A standalone broker's write is durable once its own flush policy says so (`LOCAL`: waits for
nothing more). A replicated primary's (broker/replication/gate.py `AckGate`, docs/replication.md)
is durable once every member of the group's in-sync set holds it:

- `attach(index, written_position)`: once, as the store opens. The durability may record the
  replicated consumer state written through `index` (the recorder it returns; statelog.py).
- `admit()`: before anything is written. A write the gate would refuse anyway (fenced, draining
  for a switchover, too few in sync) is refused before it reaches the CommitLog, so the client's
  retry leaves no second copy.
- `wait(end)`: after an append ending at CommitLog position `end`, before it is acknowledged.
- `wait_state()`: after a consumer state change (ack, offset, timer, half message, lite index,
  the security and AMQP documents), before it is acknowledged.
- `acked_position()`: the CommitLog position every in-sync member holds (`MessageStore.acked_end`);
  None: all of it.
- `acked_state()`: the latest consumer state change (its number, `Index.write`) every in-sync
  member holds while the set has `min_insync` members, as `wait_state` would acknowledge it; -1
  while not even the state the primary's term began with is known to be held; None: every change.
  A FIFO message group's next message waits for the change that settled the one before it
  (broker/popstate.py, docs/replication.md).

`LOCAL` records nothing, admits everything, waits for nothing. `replicated` is False for `LOCAL`
only: the hot paths test it instead of awaiting a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.store.index import Index
    from broker.store.statelog import StateRecorder


class Durability(Protocol):
    @property
    def replicated(self) -> bool: ...

    def attach(self, index: Index, written_position: Callable[[], int]) -> StateRecorder | None: ...

    def admit(self) -> None: ...

    async def wait(self, end: int) -> None: ...

    async def wait_state(self) -> None: ...

    def acked_position(self) -> int | None: ...

    def acked_state(self) -> int | None: ...


class LocalDurability:
    """A standalone broker's: durable under its own flush policy, nothing to wait for."""

    replicated = False

    def attach(self, index: Index, written_position: Callable[[], int]) -> StateRecorder | None:
        return None

    def admit(self) -> None:
        return None

    async def wait(self, end: int) -> None:
        return None

    async def wait_state(self) -> None:
        return None

    def acked_position(self) -> int | None:
        return None

    def acked_state(self) -> int | None:
        return None


LOCAL: Durability = LocalDurability()
