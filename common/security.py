"""The cluster's security and flow-control state: users, access rules and rate limits.

One `SecurityDoc` holds all of it, stamped with a `version` that grows by one on every change.
Brokers store the encoded document durably (broker/security_store.py) without interpreting it;
`sluice admin` edits it (read, change, write back with compare-and-set on the version) and every
proxy polls it (proxy/policy.py). This module is the one codec, pure and stdlib-only.

Encoding: UTF-8 JSON, `{"format": 1, "version": N, "users": [...], "rules": [...], "limits": [...]}`.
Secrets are stored in plain text: HMAC-SHA1 verification needs them server-side. They are never
logged; `User.__repr__` hides them.

Resources (`Pattern`): `topic:NAME`, `group:NAME`, `topic:PREFIX*`, `group:PREFIX*`, `topic:*`,
`group:*`, or `*` (every topic and group), always within one namespace ("" is the default one).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from common.errors import BadRequest, StoreCorrupted

FORMAT = 1
_ACCESS_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.%\-]*$")
MAX_SECRET_CHARS = 256


class Action(Enum):
    PUB = "PUB"
    SUB = "SUB"
    # Every action on the resource (and whatever administrative action a client RPC may need).
    ADMIN = "ADMIN"


class ResourceKind(Enum):
    TOPIC = "topic"
    GROUP = "group"
    ANY = "*"


class Effect(Enum):
    ALLOW = "allow"
    DENY = "deny"


class LimitScope(Enum):
    NAMESPACE = "namespace"  # produce, summed over the namespace's topics
    TOPIC = "topic"  # produce to one topic
    GROUP = "group"  # messages received by one consumer group


@dataclass(frozen=True, slots=True)
class User:
    access_key: str
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Pattern:
    """A resource pattern within a namespace: kind ANY matches topics and groups."""

    kind: ResourceKind
    name: str  # "" with prefix=True: every name
    prefix: bool = False

    def matches(self, kind: ResourceKind, name: str) -> bool:
        if self.kind is not ResourceKind.ANY and self.kind is not kind:
            return False
        return name.startswith(self.name) if self.prefix else name == self.name

    def text(self) -> str:
        if self.kind is ResourceKind.ANY:
            return "*"
        return f"{self.kind.value}:{self.name}{'*' if self.prefix else ''}"


@dataclass(frozen=True, slots=True)
class Rule:
    access_key: str
    namespace: str
    pattern: Pattern
    actions: frozenset[Action]
    effect: Effect = Effect.ALLOW


@dataclass(frozen=True, slots=True)
class Limit:
    scope: LimitScope
    namespace: str
    name: str  # the topic or group (short name); "" for a namespace limit
    messages_per_s: float = 0.0  # 0: unlimited
    bytes_per_s: float = 0.0  # 0: unlimited (produce only)

    @property
    def key(self) -> tuple[LimitScope, str, str]:
        return (self.scope, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class SecurityDoc:
    version: int = 0
    users: tuple[User, ...] = ()
    rules: tuple[Rule, ...] = ()
    limits: tuple[Limit, ...] = ()

    def user(self, access_key: str) -> User | None:
        return next((u for u in self.users if u.access_key == access_key), None)


# -- parsing of operator input -------------------------------------------------------------------


def parse_pattern(text: str) -> Pattern:
    """`topic:NAME`, `group:PREFIX*`, `topic:*`, `*`; BadRequest naming the accepted forms otherwise."""
    text = text.strip()
    if text == "*":
        return Pattern(ResourceKind.ANY, "", prefix=True)
    kind_text, sep, name = text.partition(":")
    forms = "use topic:NAME, group:NAME, topic:PREFIX*, group:PREFIX* or *"
    if not sep or kind_text not in ("topic", "group"):
        raise BadRequest(f"resource {text!r}: {forms}")
    prefix = name.endswith("*")
    bare = name[:-1] if prefix else name
    if "*" in bare or (not bare and not prefix) or not _NAME_RE.match(bare):
        raise BadRequest(f"resource {text!r}: a name of letters, digits, _ . - %, optionally ending in *; {forms}")
    return Pattern(ResourceKind(kind_text), bare, prefix)


def parse_actions(text: str) -> frozenset[Action]:
    names = [a.strip().upper() for a in text.split(",") if a.strip()]
    if not names:
        raise BadRequest("no action given; use a comma-separated list of PUB, SUB, ADMIN")
    try:
        return frozenset(Action(n) for n in names)
    except ValueError:
        raise BadRequest(f"actions {text!r}: each must be PUB, SUB or ADMIN") from None


def validate_user(user: User) -> None:
    if not _ACCESS_KEY_RE.match(user.access_key):
        raise BadRequest(f"access key {user.access_key!r}: use 1 to 128 letters, digits, '_', '.' or '-'")
    if not user.secret or len(user.secret) > MAX_SECRET_CHARS:
        raise BadRequest(f"the secret must be 1 to {MAX_SECRET_CHARS} characters")


def validate_namespace(namespace: str) -> None:
    if "%" in namespace or not _NAME_RE.match(namespace):
        raise BadRequest(f"namespace {namespace!r}: use letters, digits, '_', '.' or '-'")


def validate_limit(limit: Limit) -> None:
    validate_namespace(limit.namespace)
    if limit.messages_per_s < 0 or limit.bytes_per_s < 0:
        raise BadRequest("limits must not be negative (0 means unlimited)")
    if limit.scope is LimitScope.NAMESPACE and limit.name:
        raise BadRequest("a namespace limit names no topic or group")
    if limit.scope is not LimitScope.NAMESPACE and not limit.name:
        raise BadRequest(f"a {limit.scope.value} limit needs the {limit.scope.value} name")
    if limit.scope is LimitScope.GROUP and limit.bytes_per_s:
        raise BadRequest("a group limit counts received messages only; give --messages-per-s")


# -- codec -------------------------------------------------------------------------------------------


def encode(doc: SecurityDoc) -> bytes:
    body = {
        "format": FORMAT,
        "version": doc.version,
        "users": [{"access_key": u.access_key, "secret": u.secret} for u in doc.users],
        "rules": [
            {
                "access_key": r.access_key,
                "namespace": r.namespace,
                "resource": r.pattern.text(),
                "actions": sorted(a.value for a in r.actions),
                "effect": r.effect.value,
            }
            for r in doc.rules
        ],
        "limits": [
            {
                "scope": x.scope.value,
                "namespace": x.namespace,
                "name": x.name,
                "messages_per_s": x.messages_per_s,
                "bytes_per_s": x.bytes_per_s,
            }
            for x in doc.limits
        ],
    }
    return json.dumps(body, sort_keys=True).encode()


def decode(data: bytes) -> SecurityDoc:
    """The document in `data`; StoreCorrupted (with what is wrong) if it is not one."""
    if not data:
        return SecurityDoc()
    try:
        body: dict[str, Any] = json.loads(data)
        if body.get("format") != FORMAT:
            raise StoreCorrupted(f"security document format {body.get('format')!r} is not {FORMAT}")
        return SecurityDoc(
            version=int(body["version"]),
            users=tuple(User(u["access_key"], u["secret"]) for u in body["users"]),
            rules=tuple(
                Rule(
                    r["access_key"],
                    r["namespace"],
                    parse_pattern(r["resource"]),
                    frozenset(Action(a) for a in r["actions"]),
                    Effect(r["effect"]),
                )
                for r in body["rules"]
            ),
            limits=tuple(
                Limit(
                    LimitScope(x["scope"]),
                    x["namespace"],
                    x["name"],
                    float(x["messages_per_s"]),
                    float(x["bytes_per_s"]),
                )
                for x in body["limits"]
            ),
        )
    except StoreCorrupted:
        raise
    except (ValueError, KeyError, TypeError, BadRequest) as exc:
        raise StoreCorrupted(f"security document is malformed: {type(exc).__name__}: {exc}") from None


@runtime_checkable
class SecurityStoreApi(Protocol):
    """Where the encoded document is kept durably: every broker holds a copy (Local or Remote)."""

    async def get_security(self) -> tuple[int, bytes]:
        """(version, encoded document); (0, b"") when none was ever written."""

    async def put_security(self, version: int, data: bytes) -> None:
        """Store `data` as `version`; PreconditionFailed unless `version` is above the one held."""
