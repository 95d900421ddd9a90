"""The security document codec, signature verification, access rules and token-bucket limits."""

from __future__ import annotations

import pytest

from common.errors import BadRequest, Forbidden, StoreCorrupted, TooManyRequests, Unauthorized
from common.security import (
    Action,
    Effect,
    Limit,
    LimitScope,
    ResourceKind,
    Rule,
    SecurityDoc,
    User,
    decode,
    encode,
    parse_actions,
    parse_pattern,
    validate_limit,
)
from proxy.core.auth import AccessControl, AuthSettings, parse_authorization, sign
from proxy.core.limits import FlowControl

TOPIC, GROUP = ResourceKind.TOPIC, ResourceKind.GROUP
SETTINGS = AuthSettings(signature_cache_s=60.0, signature_cache_max=4, decision_cache_max=4)
DATE = "20261122T032501Z"


def header(access_key: str, signature: str) -> str:
    return f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={signature}"


def doc(*rules: Rule, limits: tuple[Limit, ...] = ()) -> SecurityDoc:
    return SecurityDoc(3, (User("alice", "s3cret"), User("bob", "other")), rules, limits)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- codec and parsing ----------------------------------------------------------------------------


def test_document_round_trips() -> None:
    original = doc(
        Rule("alice", "ns1", parse_pattern("topic:ord*"), frozenset({Action.PUB, Action.SUB})),
        Rule("bob", "", parse_pattern("*"), frozenset({Action.ADMIN}), Effect.DENY),
        limits=(Limit(LimitScope.TOPIC, "ns1", "orders", 10.0, 1000.0),),
    )
    assert decode(encode(original)) == original


def test_secret_is_not_in_repr() -> None:
    assert "s3cret" not in repr(doc())


@pytest.mark.parametrize("data", [b"{", b'{"format": 9}', b'{"format": 1, "version": 1}'])
def test_malformed_document_is_corruption(data: bytes) -> None:
    with pytest.raises(StoreCorrupted):
        decode(data)


def test_patterns() -> None:
    assert parse_pattern("topic:orders").matches(TOPIC, "orders")
    assert not parse_pattern("topic:orders").matches(GROUP, "orders")
    assert parse_pattern("group:bill*").matches(GROUP, "billing")
    assert parse_pattern("*").matches(GROUP, "x") and parse_pattern("*").matches(TOPIC, "y")
    assert parse_pattern("topic:*").matches(TOPIC, "anything")
    for bad in ("orders", "queue:x", "topic:", "topic:a*b", "topic:a b"):
        with pytest.raises(BadRequest, match="topic:NAME"):
            parse_pattern(bad)


def test_actions_and_limits_are_checked() -> None:
    assert parse_actions("pub, SUB") == {Action.PUB, Action.SUB}
    with pytest.raises(BadRequest, match="PUB, SUB or ADMIN"):
        parse_actions("PUB,WRITE")
    with pytest.raises(BadRequest, match="group limit"):
        validate_limit(Limit(LimitScope.GROUP, "", "g", 1.0, 5.0))
    with pytest.raises(BadRequest, match="negative"):
        validate_limit(Limit(LimitScope.TOPIC, "", "t", -1.0))


# -- signatures --------------------------------------------------------------------------------------


def test_signature_of_protocol_example() -> None:
    assert sign("SK", DATE).upper() == "BCFF4E70EC84EAF10388E19D733DB3B93E111917"


def test_authenticate_accepts_either_hex_case_and_rejects_wrong_secret() -> None:
    access = AccessControl(SETTINGS)
    access.update(doc())
    good = sign("s3cret", DATE)
    assert access.authenticate(header("alice", good), DATE) == "alice"
    assert access.authenticate(header("alice", good.upper()), DATE) == "alice"
    with pytest.raises(Unauthorized, match="does not match"):
        access.authenticate(header("alice", sign("wrong", DATE)), DATE)
    with pytest.raises(Unauthorized, match="not known"):
        access.authenticate(header("mallory", sign("s3cret", DATE)), DATE)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "not signed"),
        ("Basic abc", "MQv2-HMAC-SHA1"),
        (header("", "00ab"), "no access key"),
        (header("alice", "zz"), "not hexadecimal"),
        ("MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=host, Signature=00", "x-mq-date-time"),
    ],
)
def test_malformed_headers_are_unauthorized(value: str, message: str) -> None:
    access = AccessControl(SETTINGS)
    access.update(doc())
    with pytest.raises(Unauthorized, match=message):
        access.authenticate(value, DATE)


def test_credential_scope_suffix_is_ignored() -> None:
    assert parse_authorization(header("alice/2026/region", "00ff")).access_key == "alice"


def test_cached_verification_is_dropped_when_the_secret_changes() -> None:
    clock = Clock()
    access = AccessControl(SETTINGS, clock)
    access.update(doc())
    signed = header("alice", sign("s3cret", DATE))
    access.authenticate(signed, DATE)
    access.update(SecurityDoc(4, (User("alice", "rotated"),)))
    with pytest.raises(Unauthorized):
        access.authenticate(signed, DATE)


def test_forged_signature_is_rejected_while_a_valid_one_for_the_same_date_time_is_cached() -> None:
    access = AccessControl(SETTINGS, Clock())
    access.update(doc())
    assert access.authenticate(header("alice", sign("s3cret", DATE)), DATE) == "alice"
    # The cache is keyed by the whole header: another signature for the same date-time is verified.
    with pytest.raises(Unauthorized, match="does not match"):
        access.authenticate(header("alice", sign("guess", DATE)), DATE)
    # Bob's key with Alice's valid signature is still Bob's request, checked with Bob's secret.
    with pytest.raises(Unauthorized, match="does not match"):
        access.authenticate(header("bob", sign("s3cret", DATE)), DATE)


def test_cached_header_replayed_with_another_date_time_is_rejected() -> None:
    access = AccessControl(SETTINGS, Clock())
    access.update(doc())
    signed = header("alice", sign("s3cret", DATE))
    access.authenticate(signed, DATE)
    with pytest.raises(Unauthorized, match="does not match"):
        access.authenticate(signed, "20261122T032502Z")


def test_cached_verification_expires_and_is_checked_again() -> None:
    clock = Clock()
    access = AccessControl(SETTINGS, clock)
    access.update(doc())
    signed = header("alice", sign("s3cret", DATE))
    access.authenticate(signed, DATE)
    # White-box: change the secret without update() (which would drop the cache) to see whether
    # the HMAC is recomputed. Within signature_cache_s the cached answer stands; past it, it does not.
    access._secrets["alice"] = b"rotated"
    clock.now += SETTINGS.signature_cache_s - 1
    assert access.authenticate(signed, DATE) == "alice"
    clock.now += 2
    with pytest.raises(Unauthorized, match="does not match"):
        access.authenticate(signed, DATE)


def test_signature_cache_is_bounded() -> None:
    access = AccessControl(SETTINGS, Clock())
    access.update(doc())
    for second in range(3 * SETTINGS.signature_cache_max):
        date = f"20261122T0325{second:02d}Z"
        assert access.authenticate(header("alice", sign("s3cret", date)), date) == "alice"
        assert len(access._verified) <= SETTINGS.signature_cache_max
    # Failures are never cached: a forged header costs an HMAC each time and is refused each time.
    for _ in range(2):
        with pytest.raises(Unauthorized):
            access.authenticate(header("alice", sign("guess", DATE)), DATE)
    assert all(key[0] != header("alice", sign("guess", DATE)) for key in access._verified)


# -- access rules -------------------------------------------------------------------------------------


def test_rules_allow_deny_and_namespace_scope() -> None:
    access = AccessControl(SETTINGS)
    access.update(
        doc(
            Rule("alice", "ns1", parse_pattern("topic:ord*"), frozenset({Action.PUB})),
            Rule("alice", "ns1", parse_pattern("topic:orders-secret"), frozenset({Action.PUB}), Effect.DENY),
            Rule("alice", "ns1", parse_pattern("group:*"), frozenset({Action.ADMIN})),
        )
    )
    access.authorize("alice", "ns1", TOPIC, "orders", Action.PUB)
    access.authorize("alice", "ns1", GROUP, "billing", Action.SUB)  # ADMIN covers SUB
    with pytest.raises(Forbidden, match="may not SUB on topic orders in namespace ns1"):
        access.authorize("alice", "ns1", TOPIC, "orders", Action.SUB)
    with pytest.raises(Forbidden, match="orders-secret"):
        access.authorize("alice", "ns1", TOPIC, "orders-secret", Action.PUB)  # deny wins
    with pytest.raises(Forbidden):
        access.authorize("alice", "ns2", TOPIC, "orders", Action.PUB)  # another namespace
    with pytest.raises(Forbidden):
        access.authorize("alice", "", TOPIC, "orders", Action.PUB)
    with pytest.raises(Forbidden):
        access.authorize("bob", "ns1", TOPIC, "orders", Action.PUB)  # no rules at all
    access.authorize("alice", "ns1", TOPIC, "orders", Action.SUB, Action.PUB)  # any of


def test_decisions_follow_document_updates() -> None:
    access = AccessControl(SETTINGS)
    rule = Rule("alice", "", parse_pattern("topic:t"), frozenset({Action.PUB}))
    access.update(doc(rule))
    assert access.allowed("alice", "", TOPIC, "t", Action.PUB)
    access.update(doc())
    assert not access.allowed("alice", "", TOPIC, "t", Action.PUB)


# -- limits ---------------------------------------------------------------------------------------------


def test_topic_limit_refuses_over_rate_and_refills() -> None:
    clock = Clock()
    flow = FlowControl(proxy_count=1, burst_s=1.0, clock=clock)
    flow.update([Limit(LimitScope.TOPIC, "ns", "t", messages_per_s=10.0)])
    admitted = 0
    for _ in range(50):
        try:
            flow.admit_produce("ns", "t", 1, 100)
            admitted += 1
        except TooManyRequests as exc:
            assert "topic t of namespace ns is over its limit of 10 messages/s" in exc.message
    assert admitted == 10  # the one-second burst, no more at a standing clock
    flow.admit_produce("ns", "other", 1, 100)  # other topics are not limited
    flow.admit_produce("", "t", 1, 100)  # nor the same name in another namespace
    clock.now += 0.5
    admitted = sum(1 for _ in range(20) if _try(flow))
    assert admitted == 5


def _try(flow: FlowControl) -> bool:
    try:
        flow.admit_produce("ns", "t", 1, 1)
    except TooManyRequests:
        return False
    return True


def test_namespace_bytes_limit_and_proxy_share() -> None:
    clock = Clock()
    flow = FlowControl(proxy_count=2, burst_s=1.0, clock=clock)
    flow.update([Limit(LimitScope.NAMESPACE, "ns", "", bytes_per_s=2000.0)])
    flow.admit_produce("ns", "a", 1, 1000)  # this proxy's share: 1000 bytes/s
    with pytest.raises(TooManyRequests, match=r"namespace ns is over its limit of 2000 bytes/s"):
        flow.admit_produce("ns", "b", 1, 1)
    clock.now += 1.0
    flow.admit_produce("ns", "b", 1, 1)


def test_group_receive_limit_charges_after_delivery() -> None:
    clock = Clock()
    flow = FlowControl(proxy_count=1, burst_s=1.0, clock=clock)
    flow.update([Limit(LimitScope.GROUP, "", "g", messages_per_s=5.0)])
    flow.admit_receive("", "g")
    flow.charge_receive("", "g", 32)  # a batch beyond the burst is a debt
    with pytest.raises(TooManyRequests):
        flow.admit_receive("", "g")
    clock.now += 6.0
    flow.admit_receive("", "g")


def test_unchanged_limit_keeps_its_bucket() -> None:
    clock = Clock()
    flow = FlowControl(proxy_count=1, burst_s=1.0, clock=clock)
    limit = Limit(LimitScope.TOPIC, "", "t", messages_per_s=1.0)
    flow.update([limit])
    flow.admit_produce("", "t", 1, 1)
    flow.update([limit])  # a refresh must not hand out a fresh burst
    with pytest.raises(TooManyRequests):
        flow.admit_produce("", "t", 1, 1)
    flow.update([])
    flow.admit_produce("", "t", 1, 1)
