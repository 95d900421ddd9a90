"""A consumption history checker for fault tests: what the clients were told, and what they got.

Record every send the client saw acknowledged (`sent`), every delivery (`delivered`) and every ack
answered OK (`acked`). Several consumer threads may record into one history (a lock keeps it whole):
each delivery is then placed at the time its receive call returned (`at`: the broker popped it
before), each settlement at the time its ack call began (`at`: the broker applied it after), so the
order rule below counts only what certainly happened in that order. Without `at`, an event is
placed when it is recorded (one thread: the order of the calls). Messages are named by body;
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
  reported, not an error);
- out_of_order: deliveries that broke the order of an ordered stream (below; must be 0);
- same_handle_twice: deliveries of a stored copy under a receipt handle version it was already
  delivered under (when `delivered` is given the version; must be 0: every delivery of a copy,
  across primaries' terms, gets a handle of its own, so an old handle cannot settle a new delivery).

**Ordered streams** (a FIFO message group, a lite topic): a send recorded with `stream=S` is the
next message of S, in the order its `sent` calls came (the producer sends the next one only after
the previous was acknowledged). The order holds when **no message of S is delivered while an
earlier acknowledged message of S is unsettled**, i.e. neither acked OK nor with a failed ack
(which the broker may have applied). Redelivery of a message whose ack was not answered OK is
allowed, even after later messages of S: only an ack answered OK must survive a failover. A message
delivered that no send of the history names (a send whose answer was lost, never retried) does not
take part. This is what FIFO across failovers means here: the broker hands out a message of a
group only after every earlier one was acked, whichever primary holds the group.
"""

from __future__ import annotations

import threading
import time
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
    out_of_order: list[str] = field(default_factory=list)
    same_handle_twice: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"acknowledged {self.acknowledged}, consumed {self.consumed}, lost {len(self.lost)}, "
                f"redelivered-after-ack {len(self.redelivered_after_ack)}, duplicates {self.duplicates}, "
                f"out-of-order {len(self.out_of_order)}, same-handle-twice {len(self.same_handle_twice)}")  # fmt: skip

    def assert_nothing_lost(self) -> None:
        """What every fault test demands: no acknowledged send lost, and no stored copy delivered
        again after an ack of it was answered OK."""
        assert not self.lost, f"acknowledged sends lost: {self.lost[:10]}"
        assert not self.redelivered_after_ack, f"acked messages delivered again: {self.redelivered_after_ack[:10]}"


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
    # Ordered streams: each one's acknowledged sends in order; and the consumers' deliveries and
    # settlements (True: delivered, False: acked or ack failed), each with its time (see above) and
    # the order it was recorded in.
    streams: dict[str, list[str]] = field(default_factory=dict)
    consumed_log: list[tuple[float, int, bool, str]] = field(default_factory=list)
    handle_versions: set[tuple[Stored, int]] = field(default_factory=set)
    same_handle: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, body: str, *, stream: str | None = None) -> None:
        with self.lock:
            self.sends.append(body)
            if stream is not None:
                self.streams.setdefault(stream, []).append(body)

    def delivered(self, body: str, copy: Stored, version: int | None = None, *, at: float | None = None) -> None:
        """A delivery of `body`; `at`: when the receive call that brought it returned."""
        with self.lock:
            if copy in self.acked_copies:
                self.after_ack.append(body)
            if version is not None:
                if (copy, version) in self.handle_versions:
                    self.same_handle.append(f"{body} ({copy}, handle version {version})")
                self.handle_versions.add((copy, version))
            self.deliveries[body] += 1
            self._log(at, True, body)

    def acked(self, body: str, copy: Stored, *, at: float | None = None) -> None:
        """An ack of `body` answered OK; `at`: when the ack call began."""
        with self.lock:
            self.acks.add(body)
            self.acked_copies.add(copy)
            self._log(at, False, body)

    def ack_failed(self, body: str, *, at: float | None = None) -> None:
        """An ack of `body` not answered OK; `at`: when the ack call began."""
        with self.lock:
            self.unsure.add(body)
            self._log(at, False, body)

    def _log(self, at: float | None, delivery: bool, body: str) -> None:
        self.consumed_log.append((time.monotonic() if at is None else at, len(self.consumed_log), delivery, body))

    def settled(self) -> set[str]:
        """Messages acked OK, or whose ack's outcome is unknown: nothing more can be waited for."""
        with self.lock:
            return self.acks | self.unsure

    def verdict(self) -> Verdict:
        with self.lock:
            return self._verdict()

    def _verdict(self) -> Verdict:
        wanted = set(self.sends)
        consumed = wanted & set(self.deliveries)
        return Verdict(
            acknowledged=len(wanted),
            consumed=len(consumed),
            lost=sorted(wanted - consumed),
            redelivered_after_ack=list(self.after_ack),
            duplicates=sum(n - 1 for n in self.deliveries.values()),
            out_of_order=self._out_of_order(),
            same_handle_twice=list(self.same_handle),
        )

    def _out_of_order(self) -> list[str]:
        """Deliveries made while an earlier acknowledged message of their stream was unsettled."""
        place = {body: (stream, i) for stream, bodies in self.streams.items() for i, body in enumerate(bodies)}
        settled: dict[str, set[int]] = {stream: set() for stream in self.streams}
        prefix = dict.fromkeys(self.streams, 0)  # per stream: how many leading messages are settled
        broken: list[str] = []
        for _, _, delivery, body in sorted(self.consumed_log):
            if body not in place:
                continue
            stream, i = place[body]
            if delivery:
                if prefix[stream] < i:
                    broken.append(f"{body} (stream {stream}: {self.streams[stream][prefix[stream]]} unsettled)")
                continue
            settled[stream].add(i)
            while prefix[stream] in settled[stream]:
                prefix[stream] += 1
        return broken
