"""`proto.servers` against fake servers: address parsing, failover order, fan-out outcomes, heartbeats.

`grpc.aio.insecure_channel` is replaced by a fake channel that remembers its address, and each
fake stub answers from a table (address -> response or gRPC error), so no test opens a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
import pytest

from common.codes import Code
from common.config import ConfigError
from common.errors import BadRequest, InternalError, SluiceError, TopicNotFound, Unavailable
from nameserver.client import parse_addresses as parse_nameservers
from nameserver.model import split_address
from navigation.client import parse_addresses as parse_navigation
from proto.rpc import CODE_KEY
from proto.servers import HeartbeatSender, Outcome, ServerKind, ServerSet

T = TypeVar("T")

LOGGER = "sluice.test.servers"
KIND = ServerKind(
    name="Widget server",
    prefix="widget",
    example_port=1234,
    split_address=split_address,
    log=logging.getLogger(LOGGER),
    log_key="widget",
    max_message_bytes=4 << 20,
)


def run(coro: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro()

    return asyncio.run(main())


def unreachable(details: str = "connection refused") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def broken(details: str = "boom") -> grpc.aio.AioRpcError:
    """A failure without a Sluice code (e.g. a crash in gRPC itself): becomes InternalError."""
    return grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def coded(code: Code, details: str) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata((CODE_KEY, str(int(code))))
    return grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(), trailing, details)


@dataclasses.dataclass
class Answer:
    text: str
    proxies: tuple[str, ...] = ()


class FakeChannel:
    def __init__(self, address: str, options: list[tuple[str, int]]) -> None:
        self.address = address
        self.options = dict(options)
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class FakeServers:
    """What each address answers (a response or an AioRpcError to raise), and the calls received."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.calls: list[tuple[str, str, Any, float]] = []  # (address, method, request, timeout)
        self.channels: list[FakeChannel] = []

    def channel(self, address: str, options: list[tuple[str, int]]) -> FakeChannel:
        self.channels.append(FakeChannel(address, options))
        return self.channels[-1]

    def stub(self, channel: FakeChannel) -> FakeStub:
        return FakeStub(self, channel.address)

    def asked(self) -> list[str]:
        return [address for address, *_ in self.calls]


class FakeStub:
    def __init__(self, servers: FakeServers, address: str) -> None:
        self._servers = servers
        self._address = address

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        async def rpc(request: Any, **options: float) -> Any:
            self._servers.calls.append((self._address, method, request, options["timeout"]))
            answer = self._servers.answers.get(self._address, Answer(self._address))
            if isinstance(answer, grpc.aio.AioRpcError):
                raise answer
            return answer

        return rpc


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServers]:
    servers = FakeServers()
    monkeypatch.setattr(grpc.aio, "insecure_channel", lambda address, options: servers.channel(address, options))
    yield servers


def server_set(fake: FakeServers, addresses: Sequence[str] | str = "a:1;b:2;c:3", **kwargs: Any) -> ServerSet:
    settings: dict[str, Any] = {"timeout_s": 2.5, "reconnect_backoff_max_s": 5.0, "max_message_bytes": 1024}
    settings.update(kwargs)
    return ServerSet(KIND, addresses, fake.stub, **settings)


# -- addresses ----------------------------------------------------------------------------------


def test_parse_addresses_keeps_order_and_drops_duplicates() -> None:
    assert KIND.parse_addresses(" c:3 ;a:1;; c:3;b:2 ") == ["c:3", "a:1", "b:2"]
    assert KIND.parse_addresses("[::1]:9876") == ["[::1]:9876"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no Widget server address in ''; give host:port[;host:port...]"),
        (" ; ", "no Widget server address in ' ; '; give host:port[;host:port...]"),
        ("a:1,b:2", "widget addresses 'a:1,b:2': separate them with ';', e.g. a:1234;b:1234"),
        ("a:1;b 2", "widget addresses 'a:1;b 2': separate them with ';', e.g. a:1234;b:1234"),
        ("a", "Widget server address 'a' is not host:port"),
        ("a:70000", "Widget server address 'a:70000': port 70000 is out of range 1..65535"),
    ],
)
def test_parse_addresses_errors_name_the_kind(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        KIND.parse_addresses(text)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_nameservers, "", "no NameServer address in ''; give host:port[;host:port...]"),
        (parse_nameservers, "a:1,b:2", "NameServer addresses 'a:1,b:2': separate them with ';', e.g. a:9876;b:9876"),
        (parse_nameservers, "a", "NameServer address 'a' is not host:port"),
        (parse_navigation, "", "no navigation server address in ''; give host:port[;host:port...]"),
        (parse_navigation, "a:1,b:2", "navigation addresses 'a:1,b:2': separate them with ';', e.g. a:9877;b:9877"),
        (parse_navigation, "a", "navigation server endpoint 'a' is not host:port"),
    ],
)
def test_client_parsers_keep_their_wording(parse: Callable[[str], list[str]], text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert str(caught.value) == message


def test_server_set_takes_a_list_or_text_and_checks_its_settings(fake: FakeServers) -> None:
    assert server_set(fake, "a:1; b:2;a:1").addresses == ("a:1", "b:2")
    assert server_set(fake, ["b:2", "a:1"]).addresses == ("b:2", "a:1")
    message = r"^widget client timeout_s and reconnect_backoff_max_s must be positive$"
    bad_settings: list[dict[str, Any]] = [{"timeout_s": 0}, {"reconnect_backoff_max_s": -1}]
    for bad in bad_settings:
        with pytest.raises(ConfigError, match=message):
            server_set(fake, **bad)


# -- calls and channels -------------------------------------------------------------------------


def test_channels_are_made_once_per_server_with_the_options_and_closed(fake: FakeServers) -> None:
    servers = server_set(fake, reconnect_backoff_max_s=0.5)

    async def scenario() -> None:
        await servers.call("a:1", "Get", "r1")
        await servers.call("a:1", "Get", "r2")
        await servers.call("b:2", "Get", "r3")
        await servers.close()

    run(scenario)
    assert [c.address for c in fake.channels] == ["a:1", "b:2"]
    assert fake.channels[0].options == {
        "grpc.max_receive_message_length": 1024,
        "grpc.max_send_message_length": 1024,
        "grpc.initial_reconnect_backoff_ms": 500,  # never above the maximum
        "grpc.max_reconnect_backoff_ms": 500,
    }
    assert all(c.closed for c in fake.channels)
    assert [(address, timeout) for address, _, _, timeout in fake.calls] == [("a:1", 2.5)] * 2 + [("b:2", 2.5)]


def test_call_turns_rpc_errors_into_sluice_errors(fake: FakeServers) -> None:
    servers = server_set(fake)
    fake.answers["a:1"] = coded(Code.TOPIC_NOT_FOUND, "topic t not found")
    fake.answers["b:2"] = unreachable()
    with pytest.raises(TopicNotFound, match=r"^topic t not found$"):
        run(lambda: servers.call("a:1", "Get", None))
    with pytest.raises(Unavailable, match=r"^unavailable from b:2: connection refused$"):
        run(lambda: servers.call("b:2", "Get", None))


# -- first_answer: failover -----------------------------------------------------------------------


def test_failover_starts_at_the_server_that_answered_last(fake: FakeServers) -> None:
    servers = server_set(fake)
    fake.answers["a:1"] = unreachable()
    fake.answers["b:2"] = broken()

    async def scenario() -> list[Any]:
        return [await servers.first_answer("Get", None), await servers.first_answer("Get", None)]

    assert run(scenario) == [Answer("c:3"), Answer("c:3")]
    assert fake.asked() == ["a:1", "b:2", "c:3", "c:3"]

    fake.calls.clear()
    fake.answers["c:3"] = unreachable()
    fake.answers.pop("a:1")
    assert run(lambda: servers.first_answer("Get", None)) == Answer("a:1")
    assert fake.asked() == ["c:3", "a:1"]  # wraps around from the preferred one


def test_a_final_error_is_raised_without_asking_the_next(fake: FakeServers) -> None:
    servers = server_set(fake)
    fake.answers["a:1"] = coded(Code.BAD_REQUEST, "topic name is empty")
    with pytest.raises(BadRequest, match=r"^topic name is empty$"):
        run(lambda: servers.first_answer("Get", None))
    assert fake.asked() == ["a:1"]


def test_unknown_here_fails_over_and_wins_when_every_server_failed(fake: FakeServers) -> None:
    servers = server_set(fake)
    fake.answers["a:1"] = coded(Code.TOPIC_NOT_FOUND, "topic t not found")
    with pytest.raises(TopicNotFound):  # final without unknown_here
        run(lambda: servers.first_answer("Get", None))

    fake.calls.clear()
    assert run(lambda: servers.first_answer("Get", None, unknown_here=(TopicNotFound,))) == Answer("b:2")
    assert fake.asked() == ["a:1", "b:2"]

    fake.answers["b:2"] = unreachable()
    fake.answers["c:3"] = unreachable()
    with pytest.raises(TopicNotFound) as caught:
        run(lambda: servers.first_answer("Get", None, unknown_here=(TopicNotFound,)))
    assert str(caught.value) == (
        "topic t not found (asked b:2: unavailable from b:2: connection refused; "
        "c:3: unavailable from c:3: connection refused; a:1: topic t not found)"
    )


def test_no_answer_messages_name_the_kind(fake: FakeServers) -> None:
    servers = server_set(fake, "a:1;b:2")
    fake.answers["a:1"] = unreachable()
    fake.answers["b:2"] = unreachable("deadline")
    with pytest.raises(Unavailable) as caught:
        run(lambda: servers.first_answer("Get", None))
    assert str(caught.value) == (
        "no Widget server answered: a:1: unavailable from a:1: connection refused; b:2: unavailable from b:2: deadline"
    )

    fake.answers["b:2"] = broken()
    with pytest.raises(InternalError) as failed:
        run(lambda: servers.first_answer("Get", None))
    assert str(failed.value) == (
        "no Widget server answered correctly: a:1: unavailable from a:1: connection refused; "
        "b:2: rpc failed from b:2: StatusCode.INTERNAL boom"
    )
    # A single unknown_here failure keeps its own message.
    assert str(KIND.no_answer([("a:1", TopicNotFound("t?"))], (TopicNotFound,))) == "t?"


def test_rejected_answers_move_on_and_give_none_when_some_server_answered(fake: FakeServers) -> None:
    servers = server_set(fake)
    fake.answers["a:1"] = unreachable()
    fake.answers["b:2"] = Answer("b:2")
    fake.answers["c:3"] = Answer("c:3", proxies=("p",))
    seen: list[str] = []

    def has_proxies(address: str, response: Any) -> bool:
        seen.append(address)
        return bool(response.proxies)

    assert run(lambda: servers.first_answer("Get", None, accept=has_proxies)) == Answer("c:3", ("p",))
    assert seen == ["b:2", "c:3"]

    fake.answers["c:3"] = Answer("c:3")
    fake.calls.clear()
    assert run(lambda: servers.first_answer("Get", None, accept=has_proxies)) is None
    assert fake.asked() == ["c:3", "a:1", "b:2"]  # c:3 stayed preferred: it was the last accepted

    fake.answers["b:2"] = fake.answers["c:3"] = unreachable()
    with pytest.raises(Unavailable, match=r"^no Widget server answered: "):
        run(lambda: servers.first_answer("Get", None, accept=has_proxies))


def test_failover_is_logged_at_debug_with_the_kind(fake: FakeServers, caplog: pytest.LogCaptureFixture) -> None:
    servers = server_set(fake, "a:1;b:2")
    fake.answers["a:1"] = unreachable()
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run(lambda: servers.first_answer("Get", None))
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.getMessage() == "widget server did not answer, trying the next"
    assert list(record.__dict__["kv"]) == ["widget", "error"]


# -- on_all: fan-out ------------------------------------------------------------------------------


def test_on_all_collects_an_outcome_per_server_in_address_order(fake: FakeServers) -> None:
    servers = server_set(fake, "c:3;a:1;b:2")
    fake.answers["a:1"] = unreachable()
    fake.answers["b:2"] = coded(Code.BAD_REQUEST, "bad registration")
    outcomes = run(lambda: servers.on_all("Register", "req"))
    assert list(outcomes) == ["c:3", "a:1", "b:2"]
    assert outcomes["c:3"] is None
    assert isinstance(outcomes["a:1"], Unavailable)
    assert isinstance(outcomes["b:2"], BadRequest)
    assert sorted(fake.asked()) == ["a:1", "b:2", "c:3"]
    assert {request for _, _, request, _ in fake.calls} == {"req"}

    assert KIND.accepted_or_raise(outcomes, "registration of w") == 1


def test_accepted_or_raise_prefers_a_final_error_over_unavailable() -> None:
    down: Outcome = Unavailable("down")
    assert KIND.accepted_or_raise({"a:1": None, "b:2": None, "c:3": down}, "x") == 2
    with pytest.raises(BadRequest, match=r"^registration of w refused by b:2: bad$"):
        KIND.accepted_or_raise({"a:1": down, "b:2": BadRequest("bad")}, "registration of w")
    with pytest.raises(Unavailable, match=r"^registration of w reached no Widget server: a:1: down; b:2: down$"):
        KIND.accepted_or_raise({"a:1": down, "b:2": down}, "registration of w")


# -- HeartbeatSender ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Registration:
    name: str
    instance_id: str = ""
    sequence: int = 0


class Sender(HeartbeatSender[Registration]):
    """Beats until it has sent `beats` registrations, then stops itself."""

    def __init__(self, interval_s: float = 0.001, beats: int = 3) -> None:
        super().__init__(KIND, lambda: Registration("w"), heartbeat_interval_s=interval_s, unregister_on_stop=True)
        self.sent: list[Registration] = []
        self._beats = beats
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        await self._every_interval(stop or self._stop, self._beat)

    async def _beat(self) -> None:
        self.sent.append(self._stamped())
        if len(self.sent) == self._beats:
            self._stop.set()

    def note(self, address: str, exc: SluiceError | None) -> None:
        self._note(address, exc, sender="w")


def test_heartbeat_interval_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"^heartbeat_interval_s must be positive, got 0$"):
        Sender(0)


def test_stamps_carry_the_instance_id_and_an_increasing_sequence() -> None:
    sender = Sender(beats=3)
    run(lambda: asyncio.wait_for(sender.run(), timeout=5))
    assert len(sender.instance_id) == 32
    assert [(r.instance_id, r.sequence) for r in sender.sent] == [(sender.instance_id, n) for n in (1, 2, 3)]
    assert sender.instance_id != Sender().instance_id


def test_stopped_before_the_first_beat_sends_nothing() -> None:
    sender = Sender()

    async def scenario() -> None:
        stop = asyncio.Event()
        stop.set()
        await sender.run(stop)

    run(scenario)
    assert sender.sent == []


def test_failures_are_logged_once_per_change_and_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    sender = Sender()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        sender.note("a:1", None)  # never failed: nothing to say
        sender.note("a:1", Unavailable("down"))
        sender.note("a:1", Unavailable("down"))
        sender.note("a:1", Unavailable("still down"))
        sender.note("a:1", None)
        sender.note("a:1", None)
    lines = [(r.levelname, r.getMessage(), r.__dict__["kv"]) for r in caplog.records if r.name == LOGGER]
    warning = "registration with widget server failed; retrying at the next heartbeat"
    assert [(level, message) for level, message, _ in lines] == [
        ("WARNING", warning),
        ("WARNING", warning),
        ("INFO", "widget server accepts registrations again"),
    ]
    assert [list(fields) for _, _, fields in lines] == [["widget", "sender", "error"]] * 2 + [["widget"]]
