"""Lite topic filters: wildcard subscriptions to lite topics (docs/lite-topics.md, docs/mqtt.md).

A lite topic name's levels are separated by `/`. A filter is a name whose levels may be `+` (any
one level) or, as its last level, `#` (this level and every level below it, none included): `a/+/c`
matches `a/b/c`, `a/#` matches `a`, `a/b` and `a/b/c`. A wildcard at the first level never matches a
name whose first level starts with `$` (escaped as `=24`, the MQTT gateway's names): MQTT keeps
`$SYS/...` and the like out of `#`.

`FilterTrie` holds filters, each with the owners that subscribed with it, and finds the owners whose
filters match a name by walking one node per level (plus the `+` and `#` branches met): its cost
depends on the name's depth and the filters that match, never on how many filters or names exist.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from common.errors import IllegalLiteTopic

SEPARATOR = "/"
ONE, ALL = "+", "#"
DOLLAR = ("$", "=24")  # a first level starting so is never matched by a first-level wildcard

Owner = TypeVar("Owner", bound=Hashable)


def validate_filter(text: str) -> str:
    """`text` as a valid filter: non-empty, `#` only as the whole last level, `+` only as a whole level."""
    if not text:
        raise IllegalLiteTopic("a topic filter must not be empty")
    levels = text.split(SEPARATOR)
    for i, level in enumerate(levels):
        if ALL in level and (level != ALL or i != len(levels) - 1):
            raise IllegalLiteTopic(f"topic filter {text[:64]!r}: '#' must be the whole last level")
        if ONE in level and level != ONE:
            raise IllegalLiteTopic(f"topic filter {text[:64]!r}: '+' must be a whole level")
    return text


def matches(topic_filter: str, name: str) -> bool:
    """Whether `topic_filter` (valid) matches the name."""
    f_levels = topic_filter.split(SEPARATOR)
    n_levels = name.split(SEPARATOR)
    if f_levels[0] in (ONE, ALL) and n_levels[0].startswith(DOLLAR):
        return False
    for i, level in enumerate(f_levels):
        if level == ALL:
            return True
        if i >= len(n_levels):
            return False
        if level != ONE and level != n_levels[i]:
            return False
    return len(f_levels) == len(n_levels)


class _Node(Generic[Owner]):
    __slots__ = ("all_owners", "children", "owners")

    def __init__(self) -> None:
        self.children: dict[str, _Node[Owner]] = {}
        self.owners: set[Owner] = set()  # owners of the filter ending here
        self.all_owners: set[Owner] = set()  # owners of `<this node>/#`


class FilterTrie(Generic[Owner]):
    """Filters and their owners. Not thread-safe: one event loop's thread."""

    def __init__(self) -> None:
        self._root: _Node[Owner] = _Node()
        self.count = 0  # (filter, owner) entries held

    def add(self, topic_filter: str, owner: Owner) -> bool:
        """Subscribe `owner` with the filter; False when it already was."""
        node, last = self._walk(topic_filter, create=True)
        assert node is not None
        table = node.all_owners if last == ALL else node.owners
        if owner in table:
            return False
        table.add(owner)
        self.count += 1
        return True

    def remove(self, topic_filter: str, owner: Owner) -> bool:
        """Drop the owner's filter; False when it had none. Emptied branches are pruned."""
        levels = topic_filter.split(SEPARATOR)
        path: list[tuple[_Node[Owner], str]] = []
        node = self._root
        last = levels[-1]
        for level in levels if last != ALL else levels[:-1]:
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        table = node.all_owners if last == ALL else node.owners
        if owner not in table:
            return False
        table.discard(owner)
        self.count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.children or child.owners or child.all_owners:
                break
            del parent.children[level]
        return True

    def _walk(self, topic_filter: str, *, create: bool) -> tuple[_Node[Owner] | None, str]:
        levels = topic_filter.split(SEPARATOR)
        last = levels[-1]
        node = self._root
        for level in levels if last != ALL else levels[:-1]:
            child = node.children.get(level)
            if child is None:
                if not create:
                    return None, last
                child = node.children[level] = _Node()
            node = child
        return node, last

    def match(self, name: str) -> set[Owner]:
        """The owners of every filter that matches `name`."""
        out: set[Owner] = set()
        levels = name.split(SEPARATOR)
        dollar = levels[0].startswith(DOLLAR)
        stack: list[tuple[_Node[Owner], int]] = [(self._root, 0)]
        depth = len(levels)
        while stack:
            node, i = stack.pop()
            wild_ok = not (i == 0 and dollar)
            if wild_ok and node.all_owners:
                out.update(node.all_owners)  # `<prefix>/#` matches the prefix itself and all below it
            if i == depth:
                out.update(node.owners)
                continue
            children = node.children
            child = children.get(levels[i])
            if child is not None:
                stack.append((child, i + 1))
            if wild_ok:
                plus = children.get(ONE)
                if plus is not None:
                    stack.append((plus, i + 1))
        return out

    def filters(self) -> Iterator[tuple[str, Owner]]:
        """Every (filter, owner) held (tests, listings)."""
        stack: list[tuple[_Node[Owner], list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            for owner in node.owners:
                yield SEPARATOR.join(path), owner
            for owner in node.all_owners:
                yield SEPARATOR.join([*path, ALL]), owner
            for level, child in node.children.items():
                stack.append((child, [*path, level]))
