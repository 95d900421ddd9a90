"""Console sessions: who is logged in, the CSRF token of their forms, and one-shot page messages.

A session lives in memory only (a console restart logs everyone out), keyed by a random id carried
in an HttpOnly, SameSite=Strict cookie. Every session has its own CSRF token: every form carries it
in a hidden field and every POST must send it back (`csrf_ok`), so a page of another site cannot
make a logged-in browser change the cluster. Sessions idle longer than `idle_s` are forgotten;
at most `max_sessions` are held (the least recently used one is dropped first).

Admin rights (`is_admin`): the user exists, the secret matches, and an ALLOW rule gives it ADMIN on
every resource (`*`) of the default namespace with no DENY rule of that user on `*` — the same
rights `sluice admin` effectively has when run by a cluster operator.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.security import Action, Effect, ResourceKind, SecurityDoc

COOKIE = "sluice_console"
CSRF_FIELD = "csrf"
_ID_BYTES = 32


@dataclass(slots=True)
class Session:
    session_id: str
    csrf: str
    user: str = ""  # "" until a login (or for good when the console runs without auth)
    seen_s: float = 0.0
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (kind "ok"|"error", text), shown once
    preview: list[dict[str, Any]] = field(default_factory=list)  # a dry run's rows, shown once

    def flash(self, kind: str, text: str) -> None:
        self.flashes.append((kind, text))

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken


class Sessions:
    def __init__(self, *, idle_s: float, max_sessions: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._idle_s = idle_s
        self._max = max_sessions
        self._clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (its idle clock restarted), or None."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        now = self._clock()
        if session is None or now - session.seen_s > self._idle_s:
            self._by_id.pop(session_id, None)
            return None
        session.seen_s = now
        self._by_id.move_to_end(session_id)
        return session

    def new(self) -> Session:
        while len(self._by_id) >= self._max:
            self._by_id.popitem(last=False)
        session = Session(secrets.token_urlsafe(_ID_BYTES), secrets.token_urlsafe(_ID_BYTES), seen_s=self._clock())
        self._by_id[session.session_id] = session
        return session

    def renew(self, old: Session, user: str) -> Session:
        """A fresh session (new id and CSRF token) for `user` after a login: no session fixation."""
        self._by_id.pop(old.session_id, None)
        session = self.new()
        session.user = user
        return session

    def end(self, session: Session) -> None:
        self._by_id.pop(session.session_id, None)


def csrf_ok(session: Session, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode())


def check_login(doc: SecurityDoc, access_key: str, secret: str) -> str:
    """ "" when `access_key`/`secret` is a user with admin rights, else why the login is refused."""
    user = doc.user(access_key)
    # The same answer for an unknown user and a wrong secret: a login form must not reveal users.
    if user is None or not hmac.compare_digest(user.secret.encode(), secret.encode()):
        return "unknown user or wrong secret"
    if not is_admin(doc, access_key):
        return f"user {access_key} has no admin rights (it needs ADMIN on * in the default namespace)"
    return ""


def is_admin(doc: SecurityDoc, access_key: str) -> bool:
    everything = [r for r in doc.rules if r.access_key == access_key and r.namespace == ""
                  and r.pattern.kind is ResourceKind.ANY and Action.ADMIN in r.actions]  # fmt: skip
    denied = any(r.effect is Effect.DENY for r in doc.rules if r.access_key == access_key
                 and r.namespace == "" and r.pattern.kind is ResourceKind.ANY)  # fmt: skip
    return not denied and any(r.effect is Effect.ALLOW for r in everything)
