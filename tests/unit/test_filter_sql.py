"""SQL92 filters: every operator, NULL and type semantics, errors with positions, limits, and
property tests against a small reference evaluator written here from the documented rules."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.filter import FilterKind, MessageFilter, SqlFilter, compile_filter
from common.errors import IllegalFilterExpression


def sql(expression: str) -> MessageFilter:
    compiled = compile_filter(FilterKind.SQL, expression)
    assert isinstance(compiled, SqlFilter)
    assert compiled.tag_hashes is None
    return compiled


def matches(expression: str, properties: Mapping[str, str], tag: str | None = None) -> bool:
    return sql(expression).matches(tag, properties)


P = {"a": "5", "s": "abc", "f": "2.50", "neg": "-3", "b": "true", "q": "it's", "e": "", "n": "1e3"}

# (expression, properties, expected): properties None means P.
CASES: list[tuple[str, dict[str, str] | None, bool]] = [
    # = and <> with numbers: the value is read as a number
    ("a = 5", None, True),
    ("a = 5.0", None, True),
    ("a = +5", None, True),
    ("a = 6", None, False),
    ("f = 2.5", None, True),
    ("neg = -3", None, True),
    ("neg = - 3", None, True),  # the sign may stand apart
    ("a <> 6", None, True),
    ("a != 6", None, True),
    ("a <> 5", None, False),
    ("a != 5", None, False),
    ("5 = a", None, True),
    # a value that is not a number makes a numeric comparison unknown: neither = nor <> holds
    ("s = 5", None, False),
    ("s <> 5", None, False),
    ("NOT s = 5", None, False),
    ("n = 1000", None, False),  # no exponents in values either
    ("e = 0", None, False),
    ("x = 0", {"x": " 0"}, False),  # no surrounding spaces
    ("x = 1000", {"x": "1_000"}, False),
    ("x = 3", {"x": "٣"}, False),  # only ASCII digits
    ("x = 5", {"x": "5."}, True),
    ("x = 0.5", {"x": ".5"}, True),
    ("x = 123456789012345678901234567890.5", {"x": "123456789012345678901234567890.5"}, True),
    ("x = 123456789012345678901234567890.5", {"x": "123456789012345678901234567890.4"}, False),
    ("x = 0.1", {"x": "0.10000000000000001"}, False),  # exact, not float
    # = and <> with strings: exact string comparison
    ("s = 'abc'", None, True),
    ("s = 'ABC'", None, False),
    ("s <> 'abd'", None, True),
    ("a = '5'", None, True),
    ("a = '5.0'", None, False),  # a string literal compares text, not numbers
    ("e = ''", None, True),
    ("q = 'it''s'", None, True),
    ("'abc' = s", None, True),
    # booleans
    ("b = TRUE", None, True),
    ("b = true", None, True),
    ("b <> FALSE", None, True),
    ("x = TRUE", {"x": "TRUE"}, True),
    ("x = FALSE", {"x": "False"}, True),
    ("x = TRUE", {"x": "yes"}, False),
    ("x <> TRUE", {"x": "yes"}, False),
    # ordering: numbers only
    ("a > 4", None, True),
    ("a > 5", None, False),
    ("a >= 5", None, True),
    ("a < 5.5", None, True),
    ("a <= 4.99", None, False),
    ("neg < -2", None, True),
    ("4 < a", None, True),
    ("s > 0", None, False),
    ("s <= 0", None, False),
    ("x > 9", {"x": "10"}, True),  # numerically, not lexicographically
    # two properties: strings under = and <>, numbers under ordering
    ("a = x", {"a": "5", "x": "5"}, True),
    ("a = x", {"a": "5", "x": "5.0"}, False),
    ("a < x", {"a": "5", "x": "10"}, True),
    ("a < x", {"a": "5", "x": "ten"}, False),
    ("NOT a < x", {"a": "5", "x": "ten"}, False),
    ("a = x", {"a": "5"}, False),
    # literals on both sides
    ("1 = 1", None, True),
    ("1 < 2", None, True),
    ("'x' <> 'y'", None, True),
    ("TRUE = FALSE", None, False),
    # BETWEEN is inclusive
    ("a BETWEEN 5 AND 6", None, True),
    ("a BETWEEN 4 AND 5", None, True),
    ("a BETWEEN 5 AND 5", None, True),
    ("a BETWEEN 5.01 AND 6", None, False),
    ("a NOT BETWEEN 5 AND 6", None, False),
    ("a NOT BETWEEN 6 AND 7", None, True),
    ("neg BETWEEN -5 AND -3", None, True),
    ("s BETWEEN 1 AND 9", None, False),
    ("s NOT BETWEEN 1 AND 9", None, False),
    ("a BETWEEN lo AND hi", {"a": "5", "lo": "1", "hi": "9"}, True),
    ("a BETWEEN lo AND 1", {"a": "5"}, False),  # unknown AND false
    ("a NOT BETWEEN lo AND 1", {"a": "5"}, True),  # NOT (unknown AND false) = true
    ("a BETWEEN lo AND 9", {"a": "5"}, False),  # unknown
    ("a NOT BETWEEN lo AND 9", {"a": "5"}, False),
    ("7 BETWEEN 1 AND 9", None, True),
    # IN with strings and numbers
    ("s IN ('abc', 'def')", None, True),
    ("s IN ('ab')", None, False),
    ("s NOT IN ('x', 'y')", None, True),
    ("s NOT IN ('abc')", None, False),
    ("a IN (1, 5, 9)", None, True),
    ("a IN (5.0)", None, True),
    ("a IN ('5.0')", None, False),
    ("a NOT IN (1, 2)", None, True),
    ("s IN (1, 2)", None, False),  # not a number: unknown
    ("s NOT IN (1, 2)", None, False),
    ("missing IN ('a')", None, False),
    ("missing NOT IN ('a')", None, False),
    ("'x' IN ('x', 'y')", None, True),
    ("3 NOT IN (1, 2)", None, True),
    # IS NULL is never unknown
    ("missing IS NULL", None, True),
    ("missing IS NOT NULL", None, False),
    ("a IS NULL", None, False),
    ("a IS NOT NULL", None, True),
    ("e IS NOT NULL", None, True),  # an empty value is a value
    ("NOT missing IS NULL", None, False),
    ("'x' IS NULL", None, False),
    # string tests, case-sensitive
    ("s CONTAINS 'b'", None, True),
    ("s CONTAINS 'B'", None, False),
    ("s CONTAINS ''", None, True),
    ("s NOT CONTAINS 'z'", None, True),
    ("s NOT CONTAINS 'bc'", None, False),
    ("s STARTSWITH 'ab'", None, True),
    ("s STARTSWITH 'bc'", None, False),
    ("s NOT STARTSWITH 'bc'", None, True),
    ("s ENDSWITH 'bc'", None, True),
    ("s NOT ENDSWITH 'bc'", None, False),
    ("q CONTAINS ''''", None, True),
    ("missing CONTAINS 'a'", None, False),
    ("missing NOT CONTAINS 'a'", None, False),
    ("'hello' STARTSWITH 'he'", None, True),
    # NULL: any comparison with a missing property is unknown, and only TRUE matches
    ("missing = 1", None, False),
    ("missing <> 1", None, False),
    ("NOT missing = 1", None, False),
    ("missing = 'x' OR a = 5", None, True),
    ("missing = 'x' AND a = 5", None, False),
    ("NOT (missing = 'x' AND a = 6)", None, True),  # unknown AND false = false
    ("NOT (missing = 'x' OR a = 6)", None, False),  # unknown OR false = unknown
    ("missing = 1 OR NOT missing = 1", None, False),
    # precedence: NOT > AND > OR
    ("a = 5 OR a = 6 AND a = 7", None, True),
    ("(a = 5 OR a = 6) AND a = 7", None, False),
    ("NOT a = 6 AND a = 5", None, True),
    ("NOT (a = 5 AND a = 6)", None, True),
    ("NOT a = 5 OR a = 5", None, True),
    ("NOT NOT a = 5", None, True),
    ("((a = 5))", None, True),
    # constants
    ("TRUE", None, True),
    ("FALSE", None, False),
    ("NOT FALSE", None, True),
    ("TRUE AND a = 5", None, True),
    # keywords in any case
    ("a between 1 and 9 and s in ('abc') or false", None, True),
    ("NoT a Is NuLl AnD s CoNtAiNs 'b' aNd s StArTsWiTh 'a' AND s endsWITH 'c'", None, True),
    ("x = true", {"x": "true"}, True),
    # identifiers: case-sensitive, with digits, _, $ and .
    ("A = 5", None, False),
    ("order.region = 'eu'", {"order.region": "eu"}, True),
    ("_x$1 = 1", {"_x$1": "1"}, True),
    ("a_b2 = 'x'", {"a_b2": "x"}, True),
    # strings may hold anything
    ("x = 'a''b''''c'", {"x": "a'b''c"}, True),
    ("x = ''''", {"x": "'"}, True),
    ("x = 'a AND b = ''c'''", {"x": "a AND b = 'c'"}, True),
    ("x = 'line\nbreak'", {"x": "line\nbreak"}, True),
    ("x = '😀'", {"x": "😀"}, True),
    # whitespace is free
    ("a=5", None, True),
    ("a>=5 AND(s<>'x')", None, True),
    ("\ta\n=\r5 ", None, True),
    ("s IN('abc')", None, True),
]


@pytest.mark.parametrize(("expression", "properties", "expected"), CASES)
def test_evaluation(expression: str, properties: dict[str, str] | None, expected: bool) -> None:
    assert matches(expression, P if properties is None else properties) is expected


@pytest.mark.parametrize(
    ("expression", "tag", "expected"),
    [
        ("TAGS = 'TagA'", "TagA", True),
        ("TAGS = 'TagA'", "TagB", False),
        ("TAGS IN ('TagA', 'TagB')", "TagB", True),
        ("TAGS IS NULL", None, True),
        ("TAGS IS NULL", "", True),  # an empty tag is no tag
        ("TAGS IS NOT NULL", "TagA", True),
        ("TAGS = 'TagA'", None, False),
        ("TAGS <> 'TagA'", None, False),
        ("TAGS STARTSWITH 'Tag'", "TagA", True),
        ("tags = 'TagA'", "TagA", False),  # only TAGS, spelled so, is the tag: `tags` is a property
        ("tags = 'p'", "TagA", True),
    ],
)
def test_tags_pseudo_property(expression: str, tag: str | None, expected: bool) -> None:
    # A user property called TAGS does not shadow the message tag.
    assert matches(expression, {"TAGS": "TagA", "tags": "p"}, tag) is expected


@pytest.mark.parametrize(
    ("expression", "normalised"),
    [
        ("a=5", "a = 5"),
        ("a != 5", "a <> 5"),
        ("a > +5.50", "a > 5.50"),
        ("a > - 0.5", "a > -0.5"),
        ("a > .5", "a > 0.5"),
        ("a > 5.", "a > 5"),
        ("x = 'it''s'", "x = 'it''s'"),
        ("a between 1 and 2 or not b in ('x','y')", "a BETWEEN 1 AND 2 OR NOT b IN ('x', 'y')"),
        ("(a = 1 or b = 2) and c = 3", "(a = 1 OR b = 2) AND c = 3"),
        ("a = 1 or (b = 2 and c = 3)", "a = 1 OR b = 2 AND c = 3"),
        ("a = 1 and (b = 2 and c = 3)", "a = 1 AND b = 2 AND c = 3"),
        ("not (a = 1 or b = 2)", "NOT (a = 1 OR b = 2)"),
        ("x is not null", "x IS NOT NULL"),
        ("x not contains 'y'", "x NOT CONTAINS 'y'"),
        ("TRUE", "TRUE"),
        ("a = TRUE", "a = TRUE"),
    ],
)
def test_normalised_expression(expression: str, normalised: str) -> None:
    compiled = sql(expression)
    assert compiled.expression == normalised
    assert sql(normalised) == compiled
    assert hash(sql(normalised)) == hash(compiled)


def test_equality() -> None:
    assert sql("a>1") == sql("  a   >   1  ")
    assert sql("a > 1") != sql("a > 2")
    assert sql("a > 1") != sql("A > 1")
    assert len({sql("a=1"), sql("a = 1"), sql("(a = 1)"), sql("a = 2")}) == 2


# (expression, position, fragment of the message)
ERRORS: list[tuple[str, int, str]] = [
    ("", 0, "the filter is empty"),
    ("   ", 3, "the filter is empty"),
    ("a > ", 4, "expected a value after '>'"),
    ("a >", 3, "expected a value after '>'"),
    ("a = )", 4, "expected a value after '=', but found ')'"),
    ("a", 1, "expected an operator"),
    ("'a'", 0, "is a value, not a condition"),
    ("5", 0, "is a value, not a condition"),
    ("a = 1 b = 2", 6, "expected AND, OR or the end of the filter after '1', but found 'b'"),
    ("a = 1 AND", 9, "expected a condition after AND"),
    ("AND a = 1", 0, "expected a condition, but found AND"),
    ("a = 1 OR OR b = 2", 9, "expected a condition after OR, but found OR"),
    ("(a = 1", 6, "expected ')' to close the '(' at position 0"),
    ("a = 1)", 5, "expected AND, OR or the end of the filter"),
    ("()", 1, "expected a condition"),
    ("(a) = 1", 2, "expected an operator"),  # parentheses group conditions, not values
    ("a = 'abc", 4, "no closing quote"),
    ("a = 'it''s", 4, "no closing quote"),
    ('a = "x"', 4, "strings are written in single quotes"),
    ("a # 1", 2, "unexpected character '#'"),
    ("a ! 1", 2, "unexpected character '!'"),
    ("a == 1", 3, "expected a value after '=', but found '='"),
    ("a = 1.2.3", 4, "'1.2.3' is not a number"),
    ("a = 1e5", 4, "'1e5' is not a number"),
    ("a = 5L", 4, "'5L' is not a number"),
    ("a = 5AND b = 1", 4, "'5AND' is not a number"),
    ("a = -", 5, "expected a number after '-'"),
    ("a = -b", 5, "expected a number after '-', but found 'b'"),
    ("a = --1", 5, "expected a number after '-', but found '-'"),
    ("a = NULL", 4, "NULL can only be tested with IS NULL"),
    ("a IS 5", 5, "expected NULL after IS"),
    ("a IS NOT 5", 9, "expected NULL after NOT"),
    ("a NOT 5", 6, "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT"),
    ("a = 1 = 2", 6, "expected AND, OR or the end of the filter"),  # no chained comparisons
    ("a > 'x'", 4, "'>' compares numbers, but 'x' is a string"),
    ("'x' < a", 0, "'<' compares numbers, but 'x' is a string"),
    ("a >= TRUE", 5, "'>=' compares numbers, but TRUE is a boolean"),
    ("a BETWEEN 'a' AND 'b'", 10, "BETWEEN compares numbers, but 'a' is a string"),
    ("'x' BETWEEN 1 AND 2", 0, "BETWEEN compares numbers"),
    ("a BETWEEN 1 AND 'b'", 16, "BETWEEN compares numbers"),
    ("a BETWEEN 5 AND 1", 16, "the lower bound must not exceed the upper bound"),
    ("a BETWEEN 1 OR 2", 12, "expected AND between the bounds of BETWEEN"),
    ("a BETWEEN 1", 11, "expected AND between the bounds of BETWEEN after '1'"),
    ("'x' = 1", 4, "cannot compare 'x', a string, with '1', a number"),
    ("TRUE = 'x'", 5, "cannot compare TRUE, a boolean, with 'x', a string"),
    ("a IN ()", 6, "expected a string or a number after '(', but found ')'"),
    ("a IN 'x'", 5, "expected '(' to start the list of IN"),
    ("a IN ('x' 'y')", 10, "expected ',' or ')' in the list of IN"),
    ("a IN ('x',)", 10, "expected a string or a number after ','"),
    ("a IN ('x', 1)", 11, "only strings or only numbers"),
    ("a IN (b)", 6, "holds only strings in quotes or numbers"),
    ("a IN (TRUE)", 6, "holds only strings in quotes or numbers"),
    ("1 IN ('x')", 6, "cannot look for a number in a list of strings"),
    ("a CONTAINS 5", 11, "expected a string in quotes after CONTAINS, but found '5'"),
    ("a STARTSWITH b", 13, "expected a string in quotes after STARTSWITH"),
    ("5 ENDSWITH 'x'", 0, "ENDSWITH tests strings, but this is a number"),
    ("a LIKE 'x%'", 2, "expected an operator"),
    ("a = 1 -- comment", 6, "expected AND, OR or the end of the filter"),
    ("NOT", 3, "expected a condition after NOT"),
    ("a-b = 1", 1, "expected an operator"),
]


@pytest.mark.parametrize(("expression", "position", "fragment"), ERRORS)
def test_illegal_expressions(expression: str, position: int, fragment: str) -> None:
    with pytest.raises(IllegalFilterExpression) as caught:
        compile_filter(FilterKind.SQL, expression)
    message = caught.value.message
    assert message.startswith(f'SQL filter "{expression}" is invalid at position {position}: '), message
    assert fragment in message, message


def test_error_message_matches_the_documented_form() -> None:
    with pytest.raises(IllegalFilterExpression) as caught:
        compile_filter(FilterKind.SQL, "a > ")
    assert str(caught.value) == """SQL filter "a > " is invalid at position 4: expected a value after '>'"""


def test_error_messages_quote_long_expressions_shortly_and_encodably() -> None:
    expression = "x = 1 AND " * 300 + "\ud800"
    with pytest.raises(IllegalFilterExpression) as caught:
        compile_filter(FilterKind.SQL, expression)
    message = caught.value.message
    assert message.startswith('SQL filter "…')
    assert 'AND \\ud800" is invalid at position 3000: unexpected character' in message
    assert len(message) < 400
    message.encode("utf-8")


# -- limits --------------------------------------------------------------------------------------


def test_length_limit() -> None:
    just_fits = "a = '" + "x" * 4090 + "'"
    assert len(just_fits) == 4096
    assert sql(just_fits).matches(None, {"a": "x" * 4090})
    with pytest.raises(IllegalFilterExpression, match="4097 characters long; the limit is 4096"):
        compile_filter(FilterKind.SQL, just_fits + " ")
    with pytest.raises(IllegalFilterExpression, match="the limit is 10"):
        compile_filter(FilterKind.SQL, "a = 'xxxxxx'", chars_max=10)


@pytest.mark.parametrize(
    ("make", "depth_needed"),
    [
        (lambda n: "(" * n + "a = 1" + ")" * n, 1),
        (lambda n: "NOT " * n + "a = 1", 1),
        (lambda n: "(NOT " * n + "a = 1" + ")" * n, 2),
    ],
)
def test_nesting_limit(make: Callable[[int], str], depth_needed: int) -> None:
    deepest = 64 // depth_needed
    assert sql(make(deepest)).matches(None, {"a": "1"})  # an even number of NOTs, if any
    with pytest.raises(IllegalFilterExpression, match="nests deeper than 64 levels"):
        compile_filter(FilterKind.SQL, make(deepest + 1))
    # Far beyond the limit: still the coded error, never RecursionError.
    with pytest.raises(IllegalFilterExpression):
        compile_filter(FilterKind.SQL, make(2000), chars_max=100_000)
    with pytest.raises(IllegalFilterExpression, match=f"nests deeper than {3 * depth_needed} levels"):
        compile_filter(FilterKind.SQL, make(4), depth_max=3 * depth_needed)


def test_nesting_limit_is_bounded_by_the_ceiling() -> None:
    with pytest.raises(ValueError, match="depth_max"):
        compile_filter(FilterKind.SQL, "a = 1", depth_max=10_000)


def test_long_chains_are_flat() -> None:
    # AND/OR chains do not nest, so a long one is within the depth limit and evaluates iteratively.
    chain = " AND ".join(f"p{i} = {i}" for i in range(3000))
    compiled = compile_filter(FilterKind.SQL, chain, chars_max=100_000)
    assert compiled.matches(None, {f"p{i}": str(i) for i in range(3000)})
    assert not compiled.matches(None, {})
    assert compile_filter(FilterKind.SQL, " OR ".join(["a = 1"] * 3000), chars_max=100_000).matches(None, {"a": "1"})


# -- property tests: the reference evaluator -----------------------------------------------------
#
# Generated trees are rendered to text with full parentheses, compiled, and evaluated against
# random property maps; the deliberately naive evaluator below, written from the package
# docstring, gives the expected answer. It reads numbers with Fraction (not Decimal), and spells
# BETWEEN and IN out as the AND and OR of comparisons.

_NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")
Tri = bool | None
Scalar = str | Fraction | bool


@dataclass(frozen=True)
class Lit:
    value: Scalar


@dataclass(frozen=True)
class Prop:
    name: str


Operand = Lit | Prop


@dataclass(frozen=True)
class Cmp:
    left: Operand
    op: str
    right: Operand


@dataclass(frozen=True)
class Btw:
    negated: bool
    value: Operand
    low: Operand
    high: Operand


@dataclass(frozen=True)
class InList:
    negated: bool
    value: Operand
    items: tuple[Lit, ...]


@dataclass(frozen=True)
class Null:
    negated: bool
    value: Operand


@dataclass(frozen=True)
class StrTest:
    negated: bool
    value: Operand
    op: str
    pattern: str


@dataclass(frozen=True)
class Logic:
    op: str  # NOT (one operand), AND, OR
    operands: tuple[Tree, ...]


@dataclass(frozen=True)
class Bool:
    value: bool


Tree = Cmp | Btw | InList | Null | StrTest | Logic | Bool


def ref_number(text: str) -> Fraction | None:
    return Fraction(text) if _NUMBER_TEXT.fullmatch(text) else None


def ref_lookup(operand: Operand, tag: str | None, props: Mapping[str, str]) -> Scalar | None:
    if isinstance(operand, Lit):
        return operand.value
    if operand.name == "TAGS":
        return tag or None
    return props.get(operand.name)


def ref_compare(op: str, left: Scalar | None, right: Scalar | None) -> Tri:
    if left is None or right is None:
        return None
    if op in ("<", "<=", ">", ">="):
        # Numbers only: a string (from a property) must read as one.
        lnum = ref_number(left) if isinstance(left, str) else left
        rnum = ref_number(right) if isinstance(right, str) else right
        if not isinstance(lnum, Fraction) or not isinstance(rnum, Fraction):
            return None
        return {"<": lnum < rnum, "<=": lnum <= rnum, ">": lnum > rnum, ">=": lnum >= rnum}[op]
    # = and <>: a string from a property takes the type of the other side (strings stay strings).
    if isinstance(left, str) and not isinstance(right, str):
        left, right = right, left
    converted: Scalar | None = right
    if isinstance(right, str) and isinstance(left, bool):
        converted = {"true": True, "false": False}.get(right.lower())
    elif isinstance(right, str) and isinstance(left, Fraction):
        converted = ref_number(right)
    if converted is None:
        return None
    return (left == converted) if op == "=" else (left != converted)


def ref_not(value: Tri) -> Tri:
    return None if value is None else not value


def ref_and(left: Tri, right: Tri) -> Tri:
    if left is False or right is False:
        return False
    if left is None or right is None:
        return None
    return True


def ref_or(left: Tri, right: Tri) -> Tri:
    return ref_not(ref_and(ref_not(left), ref_not(right)))


def ref_eval(tree: Tree, tag: str | None, props: Mapping[str, str]) -> Tri:
    def value(operand: Operand) -> Scalar | None:
        return ref_lookup(operand, tag, props)

    def negate_if(negated: bool, result: Tri) -> Tri:
        return ref_not(result) if negated else result

    if isinstance(tree, Bool):
        return tree.value
    if isinstance(tree, Logic):
        results = [ref_eval(operand, tag, props) for operand in tree.operands]
        if tree.op == "NOT":
            return ref_not(results[0])
        return ref_and(*results) if tree.op == "AND" else ref_or(*results)
    if isinstance(tree, Cmp):
        return ref_compare("<>" if tree.op == "!=" else tree.op, value(tree.left), value(tree.right))
    if isinstance(tree, Null):
        return (value(tree.value) is None) != tree.negated
    if isinstance(tree, Btw):
        low = ref_compare(">=", value(tree.value), value(tree.low))
        return negate_if(tree.negated, ref_and(low, ref_compare("<=", value(tree.value), value(tree.high))))
    if isinstance(tree, InList):
        found: Tri = False
        for item in tree.items:
            found = ref_or(found, ref_compare("=", value(tree.value), item.value))
        return negate_if(tree.negated, found)
    text = value(tree.value)
    if text is None:
        return None
    assert isinstance(text, str)
    tests = {"CONTAINS": tree.pattern in text, "STARTSWITH": text.startswith(tree.pattern)}
    return negate_if(tree.negated, tests.get(tree.op, text.endswith(tree.pattern)))


def render_operand(operand: Operand) -> str:
    if isinstance(operand, Prop):
        return operand.name
    if isinstance(operand.value, bool):
        return "TRUE" if operand.value else "FALSE"
    if isinstance(operand.value, Fraction):
        return format(Decimal(operand.value.numerator) / Decimal(operand.value.denominator), "f")
    return "'" + operand.value.replace("'", "''") + "'"


def render_tree(tree: Tree, lower: bool) -> str:
    """Fully parenthesised text, with keywords in upper or lower case."""

    def k(word: str) -> str:
        return word.lower() if lower else word

    def neg(negated: bool) -> str:
        return k("NOT ") if negated else ""

    if isinstance(tree, Bool):
        return k("TRUE" if tree.value else "FALSE")
    if isinstance(tree, Logic):
        if tree.op == "NOT":
            return f"{k('NOT')} ({render_tree(tree.operands[0], lower)})"
        return f" {k(tree.op)} ".join(f"({render_tree(operand, lower)})" for operand in tree.operands)
    if isinstance(tree, Cmp):
        return f"{render_operand(tree.left)} {tree.op} {render_operand(tree.right)}"
    value = render_operand(tree.value)
    if isinstance(tree, Null):
        return f"{value} {k('IS')} {neg(tree.negated)}{k('NULL')}"
    if isinstance(tree, Btw):
        bounds = f"{render_operand(tree.low)} {k('AND')} {render_operand(tree.high)}"
        return f"{value} {neg(tree.negated)}{k('BETWEEN')} {bounds}"
    if isinstance(tree, InList):
        items = ", ".join(render_operand(item) for item in tree.items)
        return f"{value} {neg(tree.negated)}{k('IN')} ({items})"
    pattern = tree.pattern.replace("'", "''")
    return f"{value} {neg(tree.negated)}{k(tree.op)} '{pattern}'"


_NAMES = ["a", "b", "c", "TAGS"]
_strings = st.sampled_from(["", "x", "1", "5.0", "true", "it's", "ab"]) | st.text(max_size=4)
_fractions = st.builds(lambda n, scale: Fraction(n, 10**scale), st.integers(-1000, 1000), st.sampled_from([0, 0, 1, 2]))
_props = st.builds(Prop, st.sampled_from(_NAMES))
_numbers = st.builds(Lit, _fractions)
_string_lits = st.builds(Lit, _strings)
_bool_lits = st.builds(Lit, st.booleans())
_numeric_operands = _props | _numbers


@st.composite
def _comparisons(draw: st.DrawFn) -> Cmp:
    op = draw(st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]))
    if op not in ("=", "<>", "!="):
        return Cmp(draw(_numeric_operands), op, draw(_numeric_operands))
    left = draw(_props | _numbers | _string_lits | _bool_lits)
    if isinstance(left, Prop):
        return Cmp(left, op, draw(_props | _numbers | _string_lits | _bool_lits))
    # Two literals must have the same type.
    if isinstance(left.value, bool):
        return Cmp(left, op, draw(_props | _bool_lits))
    return Cmp(left, op, draw(_props | (_numbers if isinstance(left.value, Fraction) else _string_lits)))


@st.composite
def _betweens(draw: st.DrawFn) -> Btw:
    value, low, high = draw(_numeric_operands), draw(_numeric_operands), draw(_numeric_operands)
    if isinstance(low, Lit) and isinstance(high, Lit):
        assert isinstance(low.value, Fraction) and isinstance(high.value, Fraction)
        low, high = (low, high) if low.value <= high.value else (high, low)
    return Btw(draw(st.booleans()), value, low, high)


@st.composite
def _ins(draw: st.DrawFn) -> InList:
    literals = draw(st.sampled_from([_numbers, _string_lits]))
    return InList(draw(st.booleans()), draw(_props), tuple(draw(st.lists(literals, min_size=1, max_size=4))))


_leaves = st.one_of(
    _comparisons(),
    _betweens(),
    _ins(),
    st.builds(Null, st.booleans(), _props | _numbers),
    st.builds(
        StrTest,
        st.booleans(),
        _props | _string_lits,
        st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
        _strings,
    ),
    st.builds(Bool, st.booleans()),
)
_trees: st.SearchStrategy[Tree] = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.builds(lambda operand: Logic("NOT", (operand,)), inner),
        st.builds(lambda a, b: Logic("AND", (a, b)), inner, inner),
        st.builds(lambda a, b: Logic("OR", (a, b)), inner, inner),
    ),
    max_leaves=8,
)
# Mostly a small pool, so that two properties (or a property and a literal) often collide.
_VALUE_POOL = ["0", "1", "1.0", " 1", "-1", "+1", "-0.5", ".5", "7.", "10", "1e1", "x", "", "true", "FALSE", "True"]
_values = st.sampled_from(_VALUE_POOL) | st.text(max_size=5)
_property_maps = st.dictionaries(st.sampled_from(_NAMES), _values, max_size=4)
_message_tags = st.none() | st.sampled_from(["", "x", "1", "true"])


@settings(max_examples=400, deadline=None)
@given(
    tree=_trees,
    lower=st.booleans(),
    messages=st.lists(st.tuples(_message_tags, _property_maps), min_size=1, max_size=8),
)
def test_generated_expressions_agree_with_the_reference_evaluator(
    tree: Tree, lower: bool, messages: list[tuple[str | None, dict[str, str]]]
) -> None:
    text = render_tree(tree, lower)
    compiled = sql(text)
    renormalised = sql(compiled.expression)
    assert renormalised == compiled
    for tag, props in messages:
        expected = ref_eval(tree, tag, props) is True
        assert compiled.matches(tag, props) is expected, (text, tag, props)
        assert renormalised.matches(tag, props) is expected


_LITERALS = [Lit(Fraction(1)), Lit(Fraction(-1, 2)), Lit(Fraction(10)), Lit("1"), Lit("x"), Lit(""), Lit(True)]


@pytest.mark.parametrize("op", ["=", "<>", "!=", "<", "<=", ">", ">="])
def test_every_comparison_of_pool_values_agrees_with_the_reference_evaluator(op: str) -> None:
    # Exhaustive where the random trees are thin: property against property, and property against
    # each kind of literal, on both sides, for every pair of pool values (and a missing property).
    values: list[str | None] = [*_VALUE_POOL, None]
    ordering = op not in ("=", "<>", "!=")
    others: list[Operand] = [Prop("b")]
    others += [lit for lit in _LITERALS if isinstance(lit.value, Fraction) or not ordering]
    for other in others:
        for tree in (Cmp(Prop("a"), op, other), Cmp(other, op, Prop("a"))):
            compiled = sql(render_tree(tree, lower=False))
            for a in values:
                for b in values:
                    props = {name: v for name, v in (("a", a), ("b", b)) if v is not None}
                    expected = ref_eval(tree, None, props) is True
                    assert compiled.matches(None, props) is expected, (compiled.expression, props)


_TOKENS = [
    "a", "b", "TAGS", "'x'", "'it''s'", "1", "-2.5", ".5", "(", ")", ",", "=", "<>", "!=", "<", "<=", ">",
    ">=", "AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS", "STARTSWITH",
    "ENDSWITH", "'", "-", "+", "!", "\ud800", "é",
]  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(
    text=st.lists(st.sampled_from(_TOKENS), max_size=12).map(" ".join) | st.text(max_size=40),
    props=st.dictionaries(st.text(max_size=3) | st.sampled_from(["a", "b"]), st.text(max_size=5), max_size=3),
    tag=st.none() | st.text(max_size=3),
)
def test_arbitrary_text_only_raises_illegal_filter_expression(
    text: str, props: dict[str, str], tag: str | None
) -> None:
    try:
        compiled = compile_filter(FilterKind.SQL, text)
    except IllegalFilterExpression as error:
        assert "is invalid at position" in error.message
        error.message.encode("utf-8")
        return
    assert isinstance(compiled.matches(tag, props), bool)  # never raises


@settings(max_examples=200, deadline=None)
@given(
    tree=_trees,
    props=st.dictionaries(st.sampled_from(_NAMES) | st.text(max_size=3), st.text(), max_size=5),
    tag=st.none() | st.text(max_size=4),
)
def test_matches_never_raises(tree: Tree, props: dict[str, str], tag: str | None) -> None:
    assert isinstance(sql(render_tree(tree, lower=False)).matches(tag, props), bool)
