"""SQL filter evaluation: the syntax tree compiled once into nested closures, evaluated per message.

Each condition becomes a `Predicate`, a function of (tag, properties) returning True, False or
None (SQL's unknown). Conversions that depend only on the expression (operator choice, literal
types, constant sub-expressions, the set behind an IN list) happen at compile time, so evaluation
does a dictionary lookup, at most one conversion of the property value, and one comparison per
predicate. AND and OR are n-ary loops rather than nested pairs, so a long chain cannot deepen the
call stack; the nesting depth is bounded by the parser.

Evaluation never raises for properties mapping str to str: a value that cannot be converted to
the type it is compared with gives None, never an exception.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from broker.filter.api import EXPRESSION_CHARS_MAX, NESTING_DEPTH_MAX, FilterKind, MessageFilter
from broker.filter.sql_ast import (
    And,
    Between,
    Compare,
    Condition,
    Const,
    In,
    IsNull,
    Literal,
    Not,
    Property,
    StringTest,
    Value,
    render,
)
from broker.filter.sql_lexer import invalid_sql
from broker.filter.sql_parser import parse

Predicate = Callable[[str | None, Mapping[str, str]], bool | None]
_Getter = Callable[[str | None, Mapping[str, str]], str | None]
_Scalar = str | Decimal | bool
_Converter = Callable[[str], _Scalar | None]

TAGS_PROPERTY = "TAGS"

# The same number grammar as the lexer's, with an optional sign: nothing else (no whitespace,
# underscores, exponents, Unicode digits, inf or NaN) reads as a number.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_BOOLEANS = {"true": True, "false": False}
# Operands are the same type (two Decimals, two strings or two booleans) whenever these run.
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": operator.contains,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def as_number(text: str) -> Decimal | None:
    """A property value as a number, or None when it is not one."""
    return Decimal(text) if _NUMBER.fullmatch(text) else None


def as_boolean(text: str) -> bool | None:
    """A property value as a boolean (`true` or `false`, any case), or None."""
    return _BOOLEANS.get(text.lower()) if len(text) <= 5 else None


def _as_string(text: str) -> str:
    return text


class SqlFilter(MessageFilter):
    __slots__ = ("_predicate",)

    def __init__(self, expression: str, predicate: Predicate) -> None:
        super().__init__(FilterKind.SQL, expression, None)
        self._predicate = predicate

    def matches(self, tag: str | None, properties: Mapping[str, str]) -> bool:
        # An empty tag is no tag (as in broker.tags): TAGS is NULL for both.
        return self._predicate(tag or None, properties) is True


def compile_sql_filter(
    text: str, *, chars_max: int = EXPRESSION_CHARS_MAX, depth_max: int = NESTING_DEPTH_MAX
) -> SqlFilter:
    """Parse, check and compile an SQL filter; raises IllegalFilterExpression naming the position."""
    if len(text) > chars_max:
        raise invalid_sql(text, chars_max, f"the filter is {len(text)} characters long; the limit is {chars_max}")
    tree = parse(text, depth_max)
    return SqlFilter(render(tree), compile_condition(tree))


def compile_condition(node: Condition) -> Predicate:
    if isinstance(node, Const):
        return _constant(node.value)
    if isinstance(node, Compare):
        return _compare(node.op, node.left, node.right)
    if isinstance(node, Between):
        low = Compare(">=", node.value, node.low)
        high = Compare("<=", node.value, node.high)
        between = compile_condition(And((low, high)))
        return _negate(between) if node.negated else between
    if isinstance(node, In):
        return _maybe_negated(_in(node), node.negated)
    if isinstance(node, IsNull):
        return _is_null(node)
    if isinstance(node, StringTest):
        return _maybe_negated(_string_test(node), node.negated)
    if isinstance(node, Not):
        return _negate(compile_condition(node.operand))
    if isinstance(node, And):
        return _all(tuple(compile_condition(operand) for operand in node.operands))
    return _any(tuple(compile_condition(operand) for operand in node.operands))


# -- predicates ---------------------------------------------------------------------------------


def _compare(op: str, left: Value, right: Value) -> Predicate:
    if isinstance(left, Literal) and isinstance(right, Property):
        op, left, right = _MIRRORED[op], right, left
    compare = _OPERATORS[op]
    if isinstance(left, Literal):
        assert isinstance(right, Literal)
        return _constant(compare(left.value, right.value))
    get_left = _getter(left)
    if isinstance(right, Property):
        # Two property values: strings for = and <>, numbers for the ordering operators.
        convert: _Converter = _as_string if op in ("=", "<>") else as_number
        get_right = _getter(right)

        def both(tag: str | None, properties: Mapping[str, str]) -> bool | None:
            lv, rv = get_left(tag, properties), get_right(tag, properties)
            if lv is None or rv is None:
                return None
            lx, rx = convert(lv), convert(rv)
            return None if lx is None or rx is None else compare(lx, rx)

        return both

    literal = right.value
    convert = _converter_for(literal)

    def one(tag: str | None, properties: Mapping[str, str]) -> bool | None:
        value = get_left(tag, properties)
        if value is None:
            return None
        converted = convert(value)
        return None if converted is None else compare(converted, literal)

    return one


def _in(node: In) -> Predicate:
    items = frozenset(item.value for item in node.items)
    if isinstance(node.value, Literal):
        return _constant(node.value.value in items)
    get = _getter(node.value)
    convert = _converter_for(node.items[0].value)

    def member(tag: str | None, properties: Mapping[str, str]) -> bool | None:
        value = get(tag, properties)
        if value is None:
            return None
        converted = convert(value)
        return None if converted is None else converted in items

    return member


def _is_null(node: IsNull) -> Predicate:
    if isinstance(node.value, Literal):
        return _constant(node.negated)
    get, negated = _getter(node.value), node.negated

    def is_null(tag: str | None, properties: Mapping[str, str]) -> bool:
        return (get(tag, properties) is None) is not negated

    return is_null


def _string_test(node: StringTest) -> Predicate:
    test, pattern = _STRING_TESTS[node.op], node.pattern
    if isinstance(node.value, Literal):
        assert isinstance(node.value.value, str)
        return _constant(test(node.value.value, pattern))
    get = _getter(node.value)

    def string_test(tag: str | None, properties: Mapping[str, str]) -> bool | None:
        value = get(tag, properties)
        return None if value is None else test(value, pattern)

    return string_test


# -- logic (three-valued) -----------------------------------------------------------------------


def _negate(inner: Predicate) -> Predicate:
    def negated(tag: str | None, properties: Mapping[str, str]) -> bool | None:
        result = inner(tag, properties)
        return None if result is None else not result

    return negated


def _maybe_negated(inner: Predicate, negated: bool) -> Predicate:
    return _negate(inner) if negated else inner


def _all(operands: tuple[Predicate, ...]) -> Predicate:
    def all_of(tag: str | None, properties: Mapping[str, str]) -> bool | None:
        result: bool | None = True
        for operand in operands:
            value = operand(tag, properties)
            if value is False:
                return False  # FALSE AND anything is FALSE, even unknown
            if value is None:
                result = None
        return result

    return all_of


def _any(operands: tuple[Predicate, ...]) -> Predicate:
    def any_of(tag: str | None, properties: Mapping[str, str]) -> bool | None:
        result: bool | None = False
        for operand in operands:
            value = operand(tag, properties)
            if value is True:
                return True  # TRUE OR anything is TRUE, even unknown
            if value is None:
                result = None
        return result

    return any_of


def _constant(value: bool) -> Predicate:
    def constant(tag: str | None, properties: Mapping[str, str]) -> bool:
        return value

    return constant


# -- values -------------------------------------------------------------------------------------


def _getter(prop: Property) -> _Getter:
    if prop.name == TAGS_PROPERTY:
        return _tag
    name = prop.name

    def get(tag: str | None, properties: Mapping[str, str]) -> str | None:
        return properties.get(name)

    return get


def _tag(tag: str | None, properties: Mapping[str, str]) -> str | None:
    return tag


def _converter_for(literal: _Scalar) -> _Converter:
    """How a property value is read to compare it with this literal."""
    if isinstance(literal, bool):
        return as_boolean
    if isinstance(literal, Decimal):
        return as_number
    return _as_string
