"""Namespaces: how a client-visible resource name maps to the cluster-wide name, and back.

A namespace isolates topics and groups: `topic` in namespace `ns` is stored as `ns%topic`, so the
same name in two namespaces is two resources. The empty namespace maps to the name itself. A
dead-letter topic `%DLQ%group` belongs to its group, so its group part is what gets wrapped.
"""

from __future__ import annotations

from common.model import DLQ_PREFIX

SEPARATOR = "%"


def wrap(namespace: str, name: str) -> str:
    if not namespace:
        return name
    if name.startswith(DLQ_PREFIX):
        return DLQ_PREFIX + wrap(namespace, name[len(DLQ_PREFIX) :])
    return f"{namespace}{SEPARATOR}{name}"


def unwrap(namespace: str, name: str) -> str:
    if not namespace:
        return name
    if name.startswith(DLQ_PREFIX):
        return DLQ_PREFIX + unwrap(namespace, name[len(DLQ_PREFIX) :])
    prefix = f"{namespace}{SEPARATOR}"
    return name[len(prefix) :] if name.startswith(prefix) else name
