"""Pure parts of transactions: the transaction id codec, the pending-entry codec, the check-back registry."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client import txid
from broker.client.api import TransactionCheck
from broker.transaction.pending import HalfEntry, HalfState
from common.errors import InvalidTransactionId, StoreCorrupted, Unavailable
from common.model import MessageType
from proxy.config import TransactionCheckConfig
from proxy.core.checkback import CheckBackRegistry, OrphanChecker
from tests.helpers.records import delivered

U64 = st.integers(0, (1 << 64) - 1)
U32 = st.integers(0, (1 << 32) - 1)
NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@given(broker=NAMES, position=U64, size=U32)
def test_transaction_id_round_trips(broker: str, position: int, size: int) -> None:
    tid = txid.TransactionId(broker, position, size)
    text = tid.encode()
    assert txid.decode(text) == tid
    assert txid.broker_of(text) == broker


@pytest.mark.parametrize("text", ["", "plain", "~tAQ", "b~AQAAAAAAAAAAhwAAAA", "b~t!!!", "b~tAQ", "b~" + "t" * 600])
def test_malformed_transaction_ids_are_invalid_transaction_id(text: str) -> None:
    with pytest.raises(InvalidTransactionId):
        txid.decode(text)


def test_a_transaction_id_of_another_format_is_refused() -> None:
    good = txid.TransactionId("b", 1, 2).encode()
    with pytest.raises(InvalidTransactionId, match="format"):
        txid.decode(good[:3] + "g" + good[4:])  # first base64 char: format byte 1 -> 0x81


@given(
    position=U64, size=U32, queue_id=U32, created=U64, due=U64, checks=U32,
    topic=NAMES, message_id=NAMES, state=st.sampled_from(list(HalfState)),
)  # fmt: skip
def test_half_entry_round_trips(
    position: int, size: int, queue_id: int, created: int, due: int, checks: int, topic: str, message_id: str,
    state: HalfState,
) -> None:  # fmt: skip
    entry = HalfEntry(position, size, topic, queue_id, message_id, created, due, checks, state)
    key = position.to_bytes(8, "big")
    assert HalfEntry.decode(key, entry.encode()) == entry


@pytest.mark.parametrize("raw", [b"", b"\x01", b"\x09" + b"\x00" * 40, b"\x01\x07" + b"\x00" * 38])
def test_a_damaged_half_entry_is_store_corrupted(raw: bytes) -> None:
    with pytest.raises(StoreCorrupted):
        HalfEntry.decode(b"\x00" * 8, raw)


# -- check-back registry ------------------------------------------------------------------------


def check(topic: str) -> TransactionCheck:
    msg = delivered(topic, 0, 0, b"x", "id", MessageType.TRANSACTION, None, (), None, {}, {}, 0, "", 0, "", 0, 1)
    return TransactionCheck("tx", msg, 1)


class Stream:
    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.got: list[tuple[str, str]] = []

    def __call__(self, c: TransactionCheck, namespace: str) -> bool:
        if self.accept:
            self.got.append((c.message.topic, namespace))
        return self.accept


def test_checks_go_to_streams_of_the_topic_in_turn() -> None:
    reg = CheckBackRegistry()
    a, b, other = Stream(), Stream(), Stream()
    reg.register(1, "client-a", {"ns%t": "ns"}, a)
    reg.register(2, "client-b", {"ns%t": "ns"}, b)
    reg.register(3, "client-c", {"u": ""}, other)
    assert reg.topics() == ["ns%t", "u"]
    for _ in range(4):
        assert reg.deliver(check("ns%t"))
    assert len(a.got) == len(b.got) == 2 and other.got == []
    assert a.got[0] == ("ns%t", "ns")
    assert not reg.deliver(check("unknown"))


def test_a_full_stream_is_skipped() -> None:
    reg = CheckBackRegistry()
    full, ok = Stream(accept=False), Stream()
    reg.register(1, "c1", {"t": ""}, full)
    reg.register(2, "c2", {"t": ""}, ok)
    assert all(reg.deliver(check("t")) for _ in range(3))
    assert len(ok.got) == 3
    reg.unregister(2)
    assert not reg.deliver(check("t"))


def test_topics_sent_to_are_added_and_clients_are_forgotten() -> None:
    reg = CheckBackRegistry()
    s = Stream()
    reg.register(1, "c1", {}, s)
    reg.note_sent("c1", "t", "")
    reg.note_sent("someone-else", "other", "")
    assert reg.topics() == ["t"]
    assert reg.deliver(check("t"))
    reg.forget_client("c1")
    assert reg.topics() == []


class FakeBroker:
    def __init__(self, checks: list[TransactionCheck] | None) -> None:
        self.checks = checks
        self.asked: list[tuple[list[str], int]] = []

    async def claim_transaction_checks(self, topics: list[str], max_checks: int) -> list[TransactionCheck]:
        self.asked.append((topics, max_checks))
        if self.checks is None:
            raise Unavailable("broker down")
        return self.checks


class FakeDirectory:
    def __init__(self, brokers: dict[str, FakeBroker]) -> None:
        self.brokers = brokers

    def broker_names(self) -> list[str]:
        return sorted(self.brokers)

    def broker(self, name: str) -> FakeBroker:
        return self.brokers[name]


def test_the_poller_asks_every_broker_for_its_producers_topics_and_survives_a_down_one() -> None:
    reg = CheckBackRegistry()
    stream = Stream()
    up, down = FakeBroker([check("t"), check("t")]), FakeBroker(None)
    poller = OrphanChecker(FakeDirectory({"a": down, "b": up}), reg, TransactionCheckConfig(max_checks_per_poll=5))
    assert asyncio.run(poller.poll_once()) == 0  # no producer connected: brokers are not asked
    assert up.asked == []
    reg.register(1, "c", {"t": ""}, stream)
    assert asyncio.run(poller.poll_once()) == 2
    assert up.asked == down.asked == [(["t"], 5)]
    assert stream.got == [("t", ""), ("t", "")]
