"""The broker's message filters: a subscription's tag or SQL expression, compiled once and then
evaluated per message, so filtered-out messages never leave the broker.

    compile_filter(FilterKind.TAG, "TagA || TagB")         # a message whose tag is TagA or TagB
    compile_filter(FilterKind.SQL, "region = 'eu' AND amount > 100")

`compile_filter` raises only `IllegalFilterExpression`, whose message names what was wrong and,
for SQL, the 0-based character position. `MessageFilter.matches` never raises. Filters are
immutable and compare equal (and hash alike) by kind and normalised expression.

Modules: `api` (the contract and limits), `tag` (tag filters), `sql_lexer`, `sql_parser`,
`sql_ast` (tree and normalised rendering), `sql_eval` (compilation to closures).

Tag expressions
---------------
- `*`, empty or blank: every message, with or without a tag (`MATCH_ALL`, `tag_hashes` None).
- Otherwise `TagA || TagB`: whitespace around tags and `||` is ignored; a message matches when
  its tag equals one of them exactly (case-sensitive). A message without a tag (None or "")
  matches only `*`.
- Rejected: an empty alternative (`A || || B`, a leading or trailing `||`); `*` as one of several
  alternatives (it must be the whole expression to mean everything); a tag containing `|` (the
  official clients refuse such tags, so it is a mistyped `||`); text that is not valid Unicode.
- Normalised text: the distinct tags, sorted, joined by ` || `.

SQL expressions (RocketMQ's SQL92 dialect, with the choices below where it is loose)
-------------------------------------------------------------------------------------
- Identifiers `[A-Za-z_$][A-Za-z0-9_$.]*` are user property names, case-sensitive. `.` is allowed
  because dotted names are common; `-` is not (RocketMQ does not allow it either, and `a-1` would
  be ambiguous with a signed number). Keywords are reserved, case-insensitively: NOT AND OR
  BETWEEN IN IS NULL TRUE FALSE CONTAINS STARTSWITH ENDSWITH. A property whose name is not an
  identifier cannot be referenced.
- `TAGS` (exactly so) is the message tag rather than a user property; no tag or an empty tag is
  NULL.
- Literals: strings in single quotes with `''` for a quote; numbers in decimal notation
  (`12`, `-3.5`, `.5`, `7.`) with an optional sign; TRUE, FALSE. No exponents, hex or `L` suffix
  (RocketMQ accepts `1E3` and `5L`; here they are errors rather than silently different).
  NULL appears only in `IS [NOT] NULL`.
- Property values are strings. Compared with a number literal, a value is read as a number when
  it matches the number grammar exactly (no spaces, no exponent) and compared exactly in decimal
  (`'1.0' = 1` holds, with no float rounding); otherwise the comparison is unknown. Compared with a
  string literal, values are compared as strings, exactly. Compared with TRUE or FALSE, `true` and
  `false` (any case) are booleans and any other value is unknown.
- `<`, `<=`, `>`, `>=` and BETWEEN compare numbers only, as in RocketMQ: a string or boolean
  literal operand is a compile-time error (`a > 'x'`), never a lexicographic comparison. Two
  properties compare as strings under `=`/`<>` and as numbers under ordering operators (unknown
  unless both are numbers). Two literals must have the same type, and are folded at compile time.
- `!=` is a synonym of `<>`; `==` is an error.
- `x BETWEEN lo AND hi` is `x >= lo AND x <= hi` (inclusive); NOT BETWEEN is its negation. With
  literal bounds, `lo > hi` is rejected at compile time (as in RocketMQ), since it can never hold.
- `x IN (...)` takes a non-empty list of literals, all strings or all numbers (RocketMQ allows
  strings only) and means `x = item1 OR x = item2 ...`; NOT IN is its negation.
- CONTAINS, STARTSWITH, ENDSWITH (and NOT ...) take a string literal pattern and test
  case-sensitively; an empty pattern holds for every non-NULL value.
- Three-valued logic: a comparison, IN, BETWEEN or string test involving a missing property is
  unknown, and so is NOT of unknown; `IS [NOT] NULL` is never unknown. A message matches only
  when the whole expression is TRUE, so neither `a = 1` nor `NOT a = 1` matches a message
  without `a`.
- Precedence: NOT binds tighter than AND, AND tighter than OR; NOT applies to a whole predicate
  (`NOT a = 1` is `NOT (a = 1)`). Parentheses group conditions, not values.
- A property or literal alone is not a condition (RocketMQ reads a bare property as a boolean
  that string values never are); TRUE and FALSE alone are. Comparisons do not chain
  (`a = 1 = TRUE` is an error). No arithmetic, LIKE, comments or quoted identifiers.
- Normalised text: keywords upper-case, single spaces, `<>` for `!=`, numbers in plain decimal,
  parentheses only where precedence needs them.

Limits (keyword arguments of `compile_filter`, defaults in `api`): expressions longer than
`EXPRESSION_CHARS_MAX` (4096) characters, and SQL nesting (parentheses and NOTs) deeper than
`NESTING_DEPTH_MAX` (64), are rejected as IllegalFilterExpression.
"""

from __future__ import annotations

from broker.filter.api import (
    EXPRESSION_CHARS_MAX,
    NESTING_DEPTH_CEILING,
    NESTING_DEPTH_MAX,
    FilterKind,
    MessageFilter,
)
from broker.filter.sql_eval import SqlFilter, compile_sql_filter
from broker.filter.tag import MATCH_ALL, TagFilter, compile_tag_filter
from common.errors import IllegalFilterExpression

__all__ = [
    "EXPRESSION_CHARS_MAX",
    "MATCH_ALL",
    "NESTING_DEPTH_MAX",
    "FilterKind",
    "MessageFilter",
    "SqlFilter",
    "TagFilter",
    "compile_filter",
]


def compile_filter(
    kind: FilterKind | int,
    expression: str,
    *,
    chars_max: int = EXPRESSION_CHARS_MAX,
    depth_max: int = NESTING_DEPTH_MAX,
) -> MessageFilter:
    """Compile a subscription's filter expression of the given `FilterType` number.

    Raises IllegalFilterExpression, and nothing else, for any kind number and expression text.
    `chars_max` and `depth_max` are configuration, not client input: `depth_max` above
    NESTING_DEPTH_CEILING is a programming error (ValueError).
    """
    if not 1 <= depth_max <= NESTING_DEPTH_CEILING:
        raise ValueError(f"depth_max must be between 1 and {NESTING_DEPTH_CEILING}, not {depth_max}")
    try:
        filter_kind = FilterKind(kind)
    except ValueError:
        raise IllegalFilterExpression(
            f"unknown filter type {kind}; expected {FilterKind.TAG} (TAG) or {FilterKind.SQL} (SQL)"
        ) from None
    if filter_kind is FilterKind.TAG:
        return compile_tag_filter(expression, chars_max=chars_max)
    return compile_sql_filter(expression, chars_max=chars_max, depth_max=depth_max)
