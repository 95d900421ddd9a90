"""`sluice admin user|acl|limit ...`: edit the cluster security document (common/security.py).

Every broker holds a copy. An edit reads every live broker's copy, takes the highest version,
applies the change and writes version + 1 to every live broker (a broker refuses a version not
above its own, so two concurrent edits cannot both land: one fails with PRECONDITION_FAILED and is
simply run again). A broker that was down during an edit catches up at the next edit; meanwhile
proxies use the highest version they can read. Proxies pick a change up within their
`policy_refresh_s` (2 s by default). Secrets are printed nowhere, not even by `user create`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from admin.cluster import Cluster
from admin.output import Report
from common.errors import BadRequest, NotFound
from common.security import (
    Action,
    Effect,
    Limit,
    LimitScope,
    Pattern,
    Rule,
    SecurityDoc,
    User,
    decode,
    encode,
    validate_limit,
    validate_namespace,
    validate_user,
)

Edit = Callable[[SecurityDoc], tuple[SecurityDoc, str]]  # the new document and a note for the operator


async def read(cluster: Cluster) -> SecurityDoc:
    """The newest copy among the live brokers (an empty document if none was ever written)."""
    brokers = await cluster.brokers()
    copies = await cluster.on_each([(b.broker_name, b.address) for b in brokers], lambda r: r.get_security())
    version, data = max(copies, key=lambda c: (c[0], c[1]))
    return dataclasses.replace(decode(data), version=version)


async def edit(cluster: Cluster, change: Edit) -> Report:
    """Apply `change` to the newest copy and store the result on every live broker."""
    doc = await read(cluster)
    changed, note = change(doc)
    new = dataclasses.replace(changed, version=doc.version + 1)
    data = encode(new)
    brokers = await cluster.brokers()
    await cluster.on_each([(b.broker_name, b.address) for b in brokers], lambda r: r.put_security(new.version, data))
    return Report(columns=["version", "brokers"], rows=[{"version": new.version, "brokers": len(brokers)}],
                  data={"version": new.version, "brokers": len(brokers), "note": note}, note=note)  # fmt: skip


# -- users --------------------------------------------------------------------------------------


def create_user(access_key: str, secret: str) -> Edit:
    user = User(access_key, secret)
    validate_user(user)

    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        if doc.user(access_key) is not None:
            raise BadRequest(f"user {access_key} already exists; delete it first to change its secret")
        return dataclasses.replace(doc, users=(*doc.users, user)), f"user {access_key} created"

    return change


def delete_user(access_key: str) -> Edit:
    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        if doc.user(access_key) is None:
            raise NotFound(f"user {access_key} does not exist; see `sluice admin user list`")
        users = tuple(u for u in doc.users if u.access_key != access_key)
        rules = tuple(r for r in doc.rules if r.access_key != access_key)
        return dataclasses.replace(doc, users=users, rules=rules), f"user {access_key} and its rules deleted"

    return change


def list_users(doc: SecurityDoc) -> Report:
    rows = [{"access_key": u.access_key, "rules": sum(r.access_key == u.access_key for r in doc.rules)}
            for u in sorted(doc.users, key=lambda u: u.access_key)]  # fmt: skip
    return Report(columns=["access_key", "rules"], rows=rows)  # keys only: secrets are never shown


# -- access rules -------------------------------------------------------------------------------


def grant(access_key: str, namespace: str, pattern: Pattern, actions: frozenset[Action], effect: Effect) -> Edit:
    validate_namespace(namespace)

    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        if doc.user(access_key) is None:
            raise NotFound(f"user {access_key} does not exist; create it with `sluice admin user create`")
        rules, merged = [], False
        for r in doc.rules:
            if (r.access_key, r.namespace, r.pattern, r.effect) == (access_key, namespace, pattern, effect):
                r, merged = dataclasses.replace(r, actions=r.actions | actions), True
            rules.append(r)
        if not merged:
            rules.append(Rule(access_key, namespace, pattern, actions, effect))
        verb = "denied" if effect is Effect.DENY else "granted"
        return dataclasses.replace(doc, rules=tuple(rules)), (
            f"{access_key} {verb} {','.join(sorted(a.value for a in actions))} on {_where(pattern, namespace)}"
        )

    return change


def revoke(access_key: str, namespace: str, pattern: Pattern, actions: frozenset[Action] | None) -> Edit:
    """Remove `actions` (all if None) from the user's allow and deny rules on exactly `pattern`."""

    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        rules, touched = [], False
        for r in doc.rules:
            if (r.access_key, r.namespace, r.pattern) == (access_key, namespace, pattern):
                left = frozenset() if actions is None else r.actions - actions
                touched = touched or left != r.actions
                if not left:
                    continue
                r = dataclasses.replace(r, actions=left)
            rules.append(r)
        if not touched:
            raise NotFound(
                f"{access_key} has no such rule on {_where(pattern, namespace)}; see `sluice admin acl list`"
            )
        return dataclasses.replace(
            doc, rules=tuple(rules)
        ), f"rule(s) of {access_key} on {_where(pattern, namespace)} revoked"

    return change


def list_rules(doc: SecurityDoc, access_key: str | None) -> Report:
    rows = [
        {"access_key": r.access_key, "namespace": r.namespace, "resource": r.pattern.text(),
         "actions": ",".join(sorted(a.value for a in r.actions)), "effect": r.effect.value}
        for r in doc.rules if access_key is None or r.access_key == access_key
    ]  # fmt: skip
    return Report(columns=["access_key", "namespace", "resource", "actions", "effect"], rows=rows)


def _where(pattern: Pattern, namespace: str) -> str:
    return pattern.text() + (f" in namespace {namespace}" if namespace else "")


# -- limits -------------------------------------------------------------------------------------


def set_limit(limit: Limit) -> Edit:
    validate_limit(limit)

    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        limits = tuple(x for x in doc.limits if x.key != limit.key)
        unlimited = not limit.messages_per_s and not limit.bytes_per_s
        if not unlimited:
            limits = (*limits, limit)
        what = _limit_name(limit)
        note = f"{what}: limit removed" if unlimited else f"{what}: limit set"
        return dataclasses.replace(doc, limits=limits), note

    return change


def delete_limit(scope: LimitScope, namespace: str, name: str) -> Edit:
    def change(doc: SecurityDoc) -> tuple[SecurityDoc, str]:
        limits = tuple(x for x in doc.limits if x.key != (scope, namespace, name))
        if len(limits) == len(doc.limits):
            raise NotFound("no such limit; see `sluice admin limit list`")
        return dataclasses.replace(doc, limits=limits), "limit deleted"

    return change


def list_limits(doc: SecurityDoc) -> Report:
    rows = [
        {"scope": x.scope.value, "namespace": x.namespace, "name": x.name,
         "messages_per_s": x.messages_per_s, "bytes_per_s": x.bytes_per_s}
        for x in sorted(doc.limits, key=lambda x: (x.scope.value, x.namespace, x.name))
    ]  # fmt: skip
    return Report(columns=["scope", "namespace", "name", "messages_per_s", "bytes_per_s"], rows=rows)


def _limit_name(limit: Limit) -> str:
    where = f"namespace {limit.namespace or '(default)'}"
    return where if limit.scope is LimitScope.NAMESPACE else f"{limit.scope.value} {limit.name} in {where}"
