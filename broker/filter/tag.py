"""Tag filters: `*` (everything) or `TagA || TagB || ...` (a message whose tag is one of them).

Invariants: a `TagFilter` either accepts everything (`tags` and `tag_hashes` are None, expression
`*`) or holds a non-empty set of non-empty tags, with `tag_hashes` exactly their `tag_hash`es.
The normalised expression lists the tags sorted and without repeats, so `B || A || A` and `A||B`
are the same filter.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.filter.api import EXPRESSION_CHARS_MAX, FilterKind, MessageFilter, display_text
from broker.tags import tag_hash
from common.errors import IllegalFilterExpression

MATCH_ALL_EXPRESSION = "*"
_SEPARATOR = "||"


class TagFilter(MessageFilter):
    """Accepts messages whose tag is in `tags`; `tags` None accepts every message, tagged or not."""

    __slots__ = ("tags",)

    tags: frozenset[str] | None

    def __init__(self, tags: frozenset[str] | None) -> None:
        if tags is None:
            super().__init__(FilterKind.TAG, MATCH_ALL_EXPRESSION, None)
        else:
            assert tags and all(tags), "a tag filter lists at least one tag, none of them empty"
            expression = f" {_SEPARATOR} ".join(sorted(tags))
            super().__init__(FilterKind.TAG, expression, frozenset(tag_hash(t) for t in tags))
        self.tags = tags

    def matches(self, tag: str | None, properties: Mapping[str, str]) -> bool:
        if self.tags is None:
            return True
        return tag is not None and tag in self.tags


MATCH_ALL = TagFilter(None)
"""The `*` tag filter: every message, with or without a tag."""


def compile_tag_filter(expression: str, *, chars_max: int = EXPRESSION_CHARS_MAX) -> TagFilter:
    """Compile a tag expression; raises IllegalFilterExpression with a readable message."""
    if len(expression) > chars_max:
        raise IllegalFilterExpression(f"tag filter is {len(expression)} characters long; the limit is {chars_max}")
    stripped = expression.strip()
    if not stripped or stripped == MATCH_ALL_EXPRESSION:
        return MATCH_ALL
    tags: set[str] = set()
    for index, part in enumerate(stripped.split(_SEPARATOR)):
        tags.add(_check_tag(expression, index, part.strip()))
    return TagFilter(frozenset(tags))


def _check_tag(expression: str, index: int, tag: str) -> str:
    where = f'tag filter "{display_text(expression)}" is invalid: alternative {index + 1}'
    if not tag:
        raise IllegalFilterExpression(
            f"{where} is empty; write tags separated by '||', such as 'TagA || TagB', or '*' for all"
        )
    if tag == MATCH_ALL_EXPRESSION:
        raise IllegalFilterExpression(f"{where} is '*', which must be the whole expression to mean all tags")
    if "|" in tag:
        raise IllegalFilterExpression(f"{where} ('{display_text(tag)}') contains '|'; separate alternatives with '||'")
    try:
        tag.encode("utf-8")
    except UnicodeEncodeError:
        raise IllegalFilterExpression(f"{where} is not valid Unicode text") from None
    return tag
