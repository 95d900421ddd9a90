"""Access: users, access rules and rate limits of the cluster's security document, and editing them.

Every edit is one `admin.security.edit` with the change `sluice admin user|acl|limit` would
make, parsed by the same functions (`parse_pattern`, `parse_actions`), so the same input is
refused with the same message. Secrets are never shown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from admin import security
from common.config import ConfigError
from common.security import Effect, Limit, LimitScope, parse_actions, parse_pattern, validate_namespace
from console.app import act, console_of, render

BACK = "/access"
Form = MultiDictProxy[Any]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/access", access_page)
    router.add_post("/access/users", user_create)
    router.add_post("/access/users/delete", user_delete)
    router.add_post("/access/rules", rule_grant)
    router.add_post("/access/rules/revoke", rule_revoke)
    router.add_post("/access/limits", limit_set)
    router.add_post("/access/limits/delete", limit_delete)


async def access_page(request: web.Request) -> web.Response:
    doc = await security.read(console_of(request).cluster)
    return render(request, "access.html", users=security.list_users(doc), rules=security.list_rules(doc, None),
                  limits=security.list_limits(doc), version=doc.version,
                  auth_on=console_of(request).config.auth_required)  # fmt: skip


async def user_create(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key, secret = _field(form, "access_key"), str(form.get("secret", ""))
    return await _edit(request, f"create user {key[:128]!r}", lambda: security.create_user(key, secret))


async def user_delete(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key = _field(form, "access_key")
    return await _edit(request, f"delete user {key[:128]!r}", lambda: security.delete_user(key))


async def rule_grant(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key, ns = _field(form, "access_key"), _field(form, "namespace")
    effect = Effect.DENY if form.get("deny") == "on" else Effect.ALLOW

    def change() -> security.Edit:
        validate_namespace(ns)
        return security.grant(key, ns, parse_pattern(_field(form, "resource")), parse_actions(_field(form, "actions")),
                              effect)  # fmt: skip

    return await _edit(request, f"grant to {key[:128]!r}", change)


async def rule_revoke(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key, ns, actions = _field(form, "access_key"), _field(form, "namespace"), _field(form, "actions")

    def change() -> security.Edit:
        validate_namespace(ns)
        return security.revoke(key, ns, parse_pattern(_field(form, "resource")),
                               parse_actions(actions) if actions else None)  # fmt: skip

    return await _edit(request, f"revoke from {key[:128]!r}", change)


async def limit_set(request: web.Request) -> web.StreamResponse:
    form = await request.post()

    def change() -> security.Edit:
        scope, ns, name = _limit_key(form)
        return security.set_limit(Limit(scope, ns, name, _rate(form, "messages_per_s"), _rate(form, "bytes_per_s")))

    return await _edit(request, "set limit", change)


async def limit_delete(request: web.Request) -> web.StreamResponse:
    form = await request.post()

    def change() -> security.Edit:
        return security.delete_limit(*_limit_key(form))

    return await _edit(request, "delete limit", change)


async def _edit(request: web.Request, what: str, make: Callable[[], security.Edit]) -> web.StreamResponse:
    cluster = console_of(request).cluster

    async def run() -> str:
        change = make()  # parsing errors surface inside `act`, as a message on the page
        return (await security.edit(cluster, change)).note

    return await act(request, what, BACK, run)


def _field(form: Form, name: str) -> str:
    return str(form.get(name, "")).strip()


def _limit_key(form: Form) -> tuple[LimitScope, str, str]:
    scope_text, ns, name = _field(form, "scope"), _field(form, "namespace"), _field(form, "name")
    try:
        scope = LimitScope(scope_text)
    except ValueError:
        raise ConfigError(f"scope must be namespace, topic or group, got {scope_text[:32]!r}") from None
    validate_namespace(ns)
    if scope is not LimitScope.NAMESPACE and not name:
        raise ConfigError(f"a {scope.value} limit needs the {scope.value}'s name")
    return scope, ns, "" if scope is LimitScope.NAMESPACE else name


def _rate(form: Form, name: str) -> float:
    text = _field(form, name) or "0"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name.replace('_', ' ')} must be a number, got {text[:32]!r}") from None
    if value < 0 or value != value:
        raise ConfigError(f"{name.replace('_', ' ')} must be 0 (no limit) or more, got {text[:32]!r}")
    return value
