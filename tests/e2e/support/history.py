"""A consumption history checker for fault tests: what the clients were told, and what they got.

Record every send the client saw acknowledged (`sent`), every delivery (`delivered`) and every ack
answered OK (`acked`), in the order they happened (one test thread). Messages are named by body;
deliveries and acks also by the stored copy (queue and queue offset, from the receipt handle): a
send the client retried may be stored twice, and delivering its second copy after the first was
acked is a duplicate, not an ack forgotten. `verdict()` counts:

A failed ack (`ack_failed`) may have been applied before the broker died: its message may come
back (and is then acked again) or not.

- acknowledged: sends answered OK;
- consumed: distinct acknowledged sends delivered at least once;
- lost: acknowledged sends never delivered;
- redelivered_after_ack: deliveries of a stored copy after an ack of it was answered OK (must be
  0: an acknowledged ack survives a failover);
- duplicates: deliveries beyond the first of a message (expected for messages that were not
  acked in time, e.g. held past their invisibility on purpose, and for sends stored twice;
  reported, not an error).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

Stored = tuple[int, int]  # (queue id, queue offset) of a stored copy


@dataclass
class Verdict:
    acknowledged: int
    consumed: int
    lost: list[str]
    redelivered_after_ack: list[str]
    duplicates: int

    def summary(self) -> str:
        return (f"acknowledged {self.acknowledged}, consumed {self.consumed}, lost {len(self.lost)}, "
                f"redelivered-after-ack {len(self.redelivered_after_ack)}, duplicates {self.duplicates}")  # fmt: skip


@dataclass
class History:
    sends: list[str] = field(default_factory=list)
    deliveries: Counter[str] = field(default_factory=Counter)
    acks: set[str] = field(default_factory=set)
    acked_copies: set[Stored] = field(default_factory=set)
    after_ack: list[str] = field(default_factory=list)
    # Messages whose ack failed (a kill): the broker may or may not have applied it before it died,
    # so the message may come back or not; either is allowed.
    unsure: set[str] = field(default_factory=set)

    def sent(self, body: str) -> None:
        self.sends.append(body)

    def delivered(self, body: str, copy: Stored) -> None:
        if copy in self.acked_copies:
            self.after_ack.append(body)
        self.deliveries[body] += 1

    def acked(self, body: str, copy: Stored) -> None:
        self.acks.add(body)
        self.acked_copies.add(copy)

    def ack_failed(self, body: str) -> None:
        self.unsure.add(body)

    def settled(self) -> set[str]:
        """Messages acked OK, or whose ack's outcome is unknown: nothing more can be waited for."""
        return self.acks | self.unsure

    def verdict(self) -> Verdict:
        wanted = set(self.sends)
        consumed = wanted & set(self.deliveries)
        return Verdict(
            acknowledged=len(wanted),
            consumed=len(consumed),
            lost=sorted(wanted - consumed),
            redelivered_after_ack=list(self.after_ack),
            duplicates=sum(n - 1 for n in self.deliveries.values()),
        )
