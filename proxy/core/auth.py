"""Authentication (request signatures) and authorisation (access rules), on our own dataclasses.

Signature (as the official clients sign): the `authorization` header is
`MQv2-HMAC-SHA1 Credential=AK[/...], SignedHeaders=x-mq-date-time, Signature=HEX` and
HEX = HMAC-SHA1(secret, value of x-mq-date-time), in either hex case. Only the date-time is signed,
so a verified (authorization header, date-time) pair stays valid for as long as the user's
secret is unchanged: it is cached for `signature_cache_s`, and the cache is dropped whenever a new
security document arrives. The date-time is not checked against the clock: the Python client
stamps its local time with a `Z` suffix, so its value says nothing reliable about freshness.

Authorisation: each user's rules are compiled once per document into per-namespace lists, and
decisions are cached per (user, namespace, kind, name, action). A DENY rule that matches wins; else
an ALLOW rule must match; else the request is forbidden. ADMIN in a rule stands for every action.

`AccessControl` is used from the event loop's thread only.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import Forbidden, Unauthorized
from common.security import Action, Effect, Pattern, ResourceKind, SecurityDoc

SCHEME = "MQv2-HMAC-SHA1"
SIGNED_HEADER = "x-mq-date-time"

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """What `AccessControl` needs of the proxy's `[proxy.auth]` config."""

    signature_cache_s: float
    signature_cache_max: int
    decision_cache_max: int


@dataclass(frozen=True, slots=True)
class Signed:
    access_key: str
    signature: bytes


def parse_authorization(header: str) -> Signed:
    """The access key and signature bytes of an `authorization` header; Unauthorized if malformed."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme != SCHEME:
        raise Unauthorized(f"the authorization header must use {SCHEME}; configure the client's credentials")
    items: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            items[key.strip()] = value.strip()
    access_key = items.get("Credential", "").split("/", 1)[0]
    if not access_key:
        raise Unauthorized("the request carries no access key; give the client credentials (access key and secret)")
    if SIGNED_HEADER not in items.get("SignedHeaders", "").lower().split(";"):
        raise Unauthorized(f"the signature must cover {SIGNED_HEADER}")
    try:
        signature = bytes.fromhex(items.get("Signature", ""))
    except ValueError:
        raise Unauthorized("the request signature is not hexadecimal") from None
    if not signature:
        raise Unauthorized("the request carries no signature")
    return Signed(access_key, signature)


def sign(secret: str, date_time: str) -> str:
    """The signature a client sends for `date_time` (lower-case hex)."""
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


@dataclass(frozen=True, slots=True)
class _Compiled:
    deny: tuple[tuple[Pattern, frozenset[Action]], ...]
    allow: tuple[tuple[Pattern, frozenset[Action]], ...]


def _covers(actions: frozenset[Action], action: Action) -> bool:
    return action in actions or Action.ADMIN in actions


class AccessControl:
    def __init__(self, settings: AuthSettings, clock: Clock = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._secrets: dict[str, bytes] = {}
        self._policies: dict[tuple[str, str], _Compiled] = {}
        self._verified: dict[tuple[str, str], tuple[float, str]] = {}  # (header, date-time) -> (expiry, key)
        self._decisions: dict[tuple[str, str, ResourceKind, str, Action], bool] = {}
        self.version = -1  # of the document in force; -1: none received yet

    def update(self, doc: SecurityDoc) -> None:
        """Put `doc` in force: recompile every user's rules and forget every cached result."""
        self._secrets = {u.access_key: u.secret.encode() for u in doc.users}
        grouped: dict[tuple[str, str], tuple[list[tuple[Pattern, frozenset[Action]]], ...]] = {}
        for rule in doc.rules:
            deny, allow = grouped.setdefault((rule.access_key, rule.namespace), ([], []))
            (deny if rule.effect is Effect.DENY else allow).append((rule.pattern, rule.actions))
        self._policies = {key: _Compiled(tuple(d), tuple(a)) for key, (d, a) in grouped.items()}
        self._verified.clear()
        self._decisions.clear()
        self.version = doc.version

    def authenticate(self, authorization: str, date_time: str) -> str:
        """The access key of a correctly signed request; Unauthorized otherwise."""
        now = self._clock()
        # Cached by the raw header values: a hit costs one dict lookup, no parsing, no HMAC.
        hit = self._verified.get((authorization, date_time))
        if hit is not None and hit[0] > now:
            return hit[1]
        if not authorization:
            raise Unauthorized("the request is not signed; give the client credentials (access key and secret)")
        signed = parse_authorization(authorization)
        secret = self._secrets.get(signed.access_key)
        if secret is None:
            raise Unauthorized(
                f"access key {signed.access_key} is not known; create it with `sluice admin user create`"
            )
        if not date_time:
            raise Unauthorized(f"the request has no {SIGNED_HEADER} header to verify the signature with")
        expected = hmac.new(secret, date_time.encode(), hashlib.sha1).digest()
        if not hmac.compare_digest(expected, signed.signature):
            raise Unauthorized(f"the signature of access key {signed.access_key} does not match; check its secret")
        if len(self._verified) >= self._settings.signature_cache_max:
            self._verified.clear()  # bounded: a full cache restarts rather than growing
        self._verified[(authorization, date_time)] = (now + self._settings.signature_cache_s, signed.access_key)
        return signed.access_key

    def allowed(self, access_key: str, namespace: str, kind: ResourceKind, name: str, action: Action) -> bool:
        key = (access_key, namespace, kind, name, action)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(access_key, namespace, kind, name, action)
            if len(self._decisions) >= self._settings.decision_cache_max:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def authorize(self, access_key: str, namespace: str, kind: ResourceKind, name: str, *actions: Action) -> None:
        """Forbidden, naming the action(s) and the resource, unless `access_key` may do one of `actions`."""
        for action in actions:
            if self.allowed(access_key, namespace, kind, name, action):
                return
        where = f" in namespace {namespace}" if namespace else ""
        wanted = " or ".join(a.value for a in actions)
        raise Forbidden(
            f"access key {access_key} may not {wanted} on {kind.value} {name}{where}; "
            "grant it with `sluice admin acl grant`"
        )

    def _decide(self, access_key: str, namespace: str, kind: ResourceKind, name: str, action: Action) -> bool:
        policy = self._policies.get((access_key, namespace))
        if policy is None:
            return False
        if any(p.matches(kind, name) and _covers(a, action) for p, a in policy.deny):
            return False
        return any(p.matches(kind, name) and _covers(a, action) for p, a in policy.allow)
