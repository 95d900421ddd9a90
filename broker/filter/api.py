"""The filter contract shared by tag and SQL filters, and the limits every expression is held to.

A `MessageFilter` is compiled once per subscription and then evaluated for every candidate
message on the delivery path, from any task or thread: filters are immutable after construction
and `matches` has no side effects. Two filters are equal when they have the same kind and the same
normalised expression, so a compiled filter can key a cache (for example, of per-queue scan
positions) no matter how its subscriber spaced or cased the text.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from broker.client.api import FilterKind

# A filter expression arrives in every subscription from the network; bound it before doing any
# work proportional to its size. 4096 characters is far beyond any hand-written filter.
EXPRESSION_CHARS_MAX = 4096

# Parentheses and NOT operators nest; each level costs a few Python frames in the parser, the
# compiler and the evaluator, so the depth is bounded well below the interpreter's recursion limit.
NESTING_DEPTH_MAX = 64

# The largest nesting depth a caller may configure: beyond this, parsing or evaluating a deep
# expression could approach Python's default recursion limit (1000 frames).
NESTING_DEPTH_CEILING = 200


def display_text(text: str, chars_max: int = 80) -> str:
    """`text` made fit for an error message: at most `chars_max` characters, and always encodable
    as UTF-8 (a lone surrogate from a client would otherwise break the status message it travels in).
    """
    if len(text) > chars_max:
        text = text[: chars_max - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class MessageFilter(ABC):
    """A compiled filter expression.

    `expression` is the normalised text (the same for every spelling of the same filter).
    `tag_hashes` lets the ConsumeQueue scan skip entries without reading the CommitLog: when it is
    not None, a message whose stored tag hash (`broker.tags.tag_hash`) is not in the set cannot
    match. None means the hash alone decides nothing. A hash match must still be confirmed with
    `matches`, because different tags can share a hash.
    """

    __slots__ = ("expression", "kind", "tag_hashes")

    kind: FilterKind
    expression: str
    tag_hashes: frozenset[int] | None

    def __init__(self, kind: FilterKind, expression: str, tag_hashes: frozenset[int] | None) -> None:
        self.kind = kind
        self.expression = expression
        self.tag_hashes = tag_hashes

    @abstractmethod
    def matches(self, tag: str | None, properties: Mapping[str, str]) -> bool:
        """Whether a message with this tag (None or "" for no tag) and user properties is accepted.

        Never raises for a mapping of str to str.
        """

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageFilter):
            return NotImplemented
        return self.kind == other.kind and self.expression == other.expression

    def __hash__(self) -> int:
        return hash((self.kind, self.expression))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind.name}, {self.expression!r})"
