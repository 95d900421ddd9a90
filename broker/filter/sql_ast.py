"""The SQL filter syntax tree, and its rendering as normalised text.

Values are literals or properties; conditions are everything that is true, false or unknown.
Invariants the parser guarantees: `And`/`Or` have at least two operands and never directly hold
an operand of their own kind (nested groups are flattened); `In.items` is non-empty and all of one
type (all strings or all numbers); comparison operators are spelled `=`, `<>`, `<`, `<=`, `>`, `>=`.

`render` is the normalised expression: keywords upper-case, single spaces, `!=` written `<>`,
numbers in plain decimal notation, and parentheses only where precedence needs them. Parsing
`render(tree)` gives back `tree`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

# -- values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Literal:
    value: str | Decimal | bool


@dataclass(frozen=True, slots=True)
class Property:
    """A user property by name; the name `TAGS` stands for the message tag."""

    name: str


Value = Literal | Property

# -- conditions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Const:
    """TRUE or FALSE on its own, as a whole condition."""

    value: bool


@dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Value
    right: Value


@dataclass(frozen=True, slots=True)
class Between:
    value: Value
    low: Value
    high: Value
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    value: Value
    items: tuple[Literal, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    value: Value
    negated: bool


@dataclass(frozen=True, slots=True)
class StringTest:
    """CONTAINS, STARTSWITH or ENDSWITH with a string literal pattern."""

    op: str
    value: Value
    pattern: str
    negated: bool


@dataclass(frozen=True, slots=True)
class Not:
    operand: Condition


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Condition, ...]


Condition = Const | Compare | Between | In | IsNull | StringTest | Not | And | Or

# -- rendering ----------------------------------------------------------------------------------


def render_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render_value(value: Value) -> str:
    if isinstance(value, Property):
        return value.name
    literal = value.value
    if isinstance(literal, bool):
        return "TRUE" if literal else "FALSE"
    if isinstance(literal, Decimal):
        return format(literal, "f")  # never scientific notation, which the lexer does not read
    return render_string(literal)


def render(node: Condition) -> str:
    if isinstance(node, Const):
        return "TRUE" if node.value else "FALSE"
    if isinstance(node, Compare):
        return f"{render_value(node.left)} {node.op} {render_value(node.right)}"
    if isinstance(node, Between):
        low, high = render_value(node.low), render_value(node.high)
        return f"{render_value(node.value)} {_not(node.negated)}BETWEEN {low} AND {high}"
    if isinstance(node, In):
        items = ", ".join(render_value(item) for item in node.items)
        return f"{render_value(node.value)} {_not(node.negated)}IN ({items})"
    if isinstance(node, IsNull):
        return f"{render_value(node.value)} IS {_not(node.negated)}NULL"
    if isinstance(node, StringTest):
        return f"{render_value(node.value)} {_not(node.negated)}{node.op} {render_string(node.pattern)}"
    if isinstance(node, Not):
        return "NOT " + _grouped(node.operand, (And, Or))
    if isinstance(node, And):
        return " AND ".join(_grouped(operand, (Or,)) for operand in node.operands)
    return " OR ".join(render(operand) for operand in node.operands)


def _grouped(node: Condition, needs_parentheses: tuple[type[And] | type[Or], ...]) -> str:
    text = render(node)
    return f"({text})" if isinstance(node, needs_parentheses) else text


def _not(negated: bool) -> str:
    return "NOT " if negated else ""
