"""The SQL filter parser: tokens to a syntax tree, by recursive descent, with compile-time type checks.

Grammar (keywords case-insensitive; precedence from loosest: OR, AND, NOT, predicates):

    filter     := or END
    or         := and ( OR and )*
    and        := not ( AND not )*
    not        := NOT not | primary
    primary    := '(' or ')' | TRUE | FALSE | predicate
    predicate  := value ( compare-op value
                        | [NOT] BETWEEN value AND value
                        | [NOT] IN '(' literal ( ',' literal )* ')'
                        | IS [NOT] NULL
                        | [NOT] ( CONTAINS | STARTSWITH | ENDSWITH ) string )
    value      := identifier | string | [sign] number | TRUE | FALSE

Parentheses group conditions, not values. Every `(` and every NOT adds a level of nesting, which
is bounded by `depth_max`, so no input can exhaust the interpreter's stack. Literal operands are
type-checked here, where their positions are known: ordering operators and BETWEEN take numbers,
CONTAINS and friends take strings, and two literals compared must have the same type.
"""

from __future__ import annotations

from decimal import Decimal

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
    Or,
    Property,
    StringTest,
    Value,
    render_value,
)
from broker.filter.sql_lexer import Token, TokenKind, invalid_sql, tokenize
from common.errors import IllegalFilterExpression

_ORDERING = frozenset({"<", "<=", ">", ">="})
_STRING_TESTS = frozenset({"CONTAINS", "STARTSWITH", "ENDSWITH"})
_NEGATABLE = _STRING_TESTS | {"BETWEEN", "IN"}
_OPERATORS_HINT = "=, <>, <, <=, >, >=, BETWEEN, IN, IS NULL, CONTAINS, STARTSWITH or ENDSWITH"


def parse(text: str, depth_max: int) -> Condition:
    """Parse a whole SQL filter; raises IllegalFilterExpression naming the position of the fault."""
    return _Parser(text, depth_max).parse()


def type_name(literal: Literal) -> str:
    value = literal.value
    if isinstance(value, bool):
        return "a boolean"
    return "a number" if isinstance(value, Decimal) else "a string"


class _Parser:
    def __init__(self, text: str, depth_max: int) -> None:
        self.text = text
        self.depth_max = depth_max
        self.tokens = tokenize(text)
        self.index = 0

    # -- token access ---------------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind is not TokenKind.END:
            self.index += 1
        return token

    def at_keyword(self, *words: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind is TokenKind.KEYWORD and token.value in words

    def error(self, token: Token, what: str) -> IllegalFilterExpression:
        return invalid_sql(self.text, token.pos, what)

    def expected(self, what: str, after: bool = True) -> IllegalFilterExpression:
        """`expected <what> after <previous token>`, and what was found instead if anything."""
        token = self.peek()
        previous = f" after {self.tokens[self.index - 1].describe()}" if after and self.index else ""
        found = "" if token.kind is TokenKind.END else f", but found {token.describe()}"
        return self.error(token, f"expected {what}{previous}{found}")

    def enter(self, depth: int) -> int:
        if depth >= self.depth_max:
            raise self.error(self.peek(), f"the filter nests deeper than {self.depth_max} levels")
        return depth + 1

    # -- conditions -----------------------------------------------------------------------------

    def parse(self) -> Condition:
        if self.peek().kind is TokenKind.END:
            raise self.error(self.peek(), "the filter is empty; expected a condition such as a = 'x'")
        condition = self.parse_or(0)
        if self.peek().kind is not TokenKind.END:
            raise self.expected("AND, OR or the end of the filter")
        return condition

    def parse_or(self, depth: int) -> Condition:
        operands = [self.parse_and(depth)]
        while self.at_keyword("OR"):
            self.advance()
            operands.append(self.parse_and(depth))
        return _flatten(Or, operands)

    def parse_and(self, depth: int) -> Condition:
        operands = [self.parse_not(depth)]
        while self.at_keyword("AND"):
            self.advance()
            operands.append(self.parse_not(depth))
        return _flatten(And, operands)

    def parse_not(self, depth: int) -> Condition:
        if self.at_keyword("NOT"):
            depth = self.enter(depth)
            self.advance()
            return Not(self.parse_not(depth))
        return self.parse_primary(depth)

    def parse_primary(self, depth: int) -> Condition:
        token = self.peek()
        if token.kind is TokenKind.LPAREN:
            depth = self.enter(depth)
            self.advance()
            condition = self.parse_or(depth)
            if self.peek().kind is not TokenKind.RPAREN:
                raise self.expected(f"')' to close the '(' at position {token.pos}", after=False)
            self.advance()
            return condition
        if self.at_keyword("TRUE", "FALSE") and not self.at_predicate_operator(ahead=1):
            self.advance()
            return Const(token.value == "TRUE")
        return self.parse_predicate(token, self.parse_value("a condition"))

    def at_predicate_operator(self, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind is TokenKind.OP or self.at_keyword("IS", "NOT", *_NEGATABLE, ahead=ahead)

    # -- predicates -----------------------------------------------------------------------------

    def parse_predicate(self, left_token: Token, left: Value) -> Condition:
        """The rest of a predicate whose left value, starting at `left_token`, was just parsed."""
        if self.peek().kind is TokenKind.OP:
            return self.parse_comparison(left_token, left)
        if self.at_keyword("IS"):
            return self.parse_is_null(left)
        negated = self.at_keyword("NOT") and self.at_keyword(*_NEGATABLE, ahead=1)
        if negated:
            self.advance()
        if self.at_keyword("BETWEEN"):
            return self.parse_between(left_token, left, negated)
        if self.at_keyword("IN"):
            return self.parse_in(left, negated)
        if self.at_keyword(*_STRING_TESTS):
            return self.parse_string_test(left_token, left, negated)
        if self.at_keyword("NOT"):
            self.advance()
            raise self.expected("BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH")
        if isinstance(left, Literal):
            raise self.error(
                left_token, f"{left_token.describe()} is a value, not a condition; compare it with {_OPERATORS_HINT}"
            )
        raise self.expected(f"an operator ({_OPERATORS_HINT})")

    def parse_comparison(self, left_token: Token, left: Value) -> Condition:
        op = self.advance()
        right_token = self.peek()
        right = self.parse_value("a value")
        if op.value in _ORDERING:
            self.check_numeric(f"'{op.text}'", left_token, left)
            self.check_numeric(f"'{op.text}'", right_token, right)
        elif isinstance(left, Literal) and isinstance(right, Literal) and type_name(left) != type_name(right):
            raise self.error(
                op,
                f"cannot compare {left_token.describe()}, {type_name(left)}, "
                f"with {right_token.describe()}, {type_name(right)}",
            )
        return Compare(str(op.value), left, right)

    def parse_is_null(self, left: Value) -> Condition:
        self.advance()
        negated = self.at_keyword("NOT")
        if negated:
            self.advance()
        if not self.at_keyword("NULL"):
            raise self.expected("NULL")
        self.advance()
        return IsNull(left, negated)

    def parse_between(self, left_token: Token, left: Value, negated: bool) -> Condition:
        self.advance()
        low_token = self.peek()
        low = self.parse_value("a value")
        if not self.at_keyword("AND"):
            raise self.expected("AND between the bounds of BETWEEN")
        self.advance()
        high_token = self.peek()
        high = self.parse_value("a value")
        for token, operand in ((left_token, left), (low_token, low), (high_token, high)):
            self.check_numeric("BETWEEN", token, operand)
        if isinstance(low, Literal) and isinstance(high, Literal):
            assert isinstance(low.value, Decimal) and isinstance(high.value, Decimal)
            if low.value > high.value:
                raise self.error(
                    high_token,
                    f"BETWEEN {render_value(low)} AND {render_value(high)} can never hold: "
                    "the lower bound must not exceed the upper bound",
                )
        return Between(left, low, high, negated)

    def parse_in(self, left: Value, negated: bool) -> Condition:
        self.advance()
        if self.peek().kind is not TokenKind.LPAREN:
            raise self.expected("'(' to start the list of IN")
        self.advance()
        items = [self.parse_in_item(left, None)]
        while self.peek().kind is TokenKind.COMMA:
            self.advance()
            items.append(self.parse_in_item(left, items[0]))
        if self.peek().kind is not TokenKind.RPAREN:
            raise self.expected("',' or ')' in the list of IN")
        self.advance()
        return In(left, tuple(items), negated)

    def parse_in_item(self, left: Value, first: Literal | None) -> Literal:
        token = self.peek()
        item = self.parse_value("a string or a number")
        if not isinstance(item, Literal) or isinstance(item.value, bool):
            raise self.error(token, "the list of IN holds only strings in quotes or numbers")
        if first is not None and type_name(item) != type_name(first):
            raise self.error(token, "the list of IN must hold only strings or only numbers, not both")
        if isinstance(left, Literal) and type_name(left) != type_name(item):
            raise self.error(token, f"cannot look for {type_name(left)} in a list of {type_name(item)[2:]}s")
        return item

    def parse_string_test(self, left_token: Token, left: Value, negated: bool) -> Condition:
        keyword = self.advance()
        if isinstance(left, Literal) and not isinstance(left.value, str):
            raise self.error(left_token, f"{keyword.value} tests strings, but this is {type_name(left)}")
        token = self.peek()
        if token.kind is not TokenKind.STRING:
            raise self.expected("a string in quotes")
        self.advance()
        assert isinstance(token.value, str)
        return StringTest(str(keyword.value), left, token.value, negated)

    # -- values and their types -----------------------------------------------------------------

    def parse_value(self, what: str) -> Value:
        token = self.peek()
        if token.kind is TokenKind.IDENT:
            self.advance()
            return Property(token.text)
        if token.kind is TokenKind.STRING:
            self.advance()
            assert isinstance(token.value, str)
            return Literal(token.value)
        if token.kind is TokenKind.NUMBER:
            self.advance()
            return Literal(token.value)
        if token.kind is TokenKind.SIGN:
            self.advance()
            number = self.peek()
            if number.kind is not TokenKind.NUMBER:
                raise self.expected("a number")
            self.advance()
            # From the text, not by negating: Decimal arithmetic would round to 28 digits.
            return Literal(Decimal(token.text + number.text))
        if self.at_keyword("TRUE", "FALSE"):
            self.advance()
            return Literal(token.value == "TRUE")
        if self.at_keyword("NULL"):
            raise self.error(token, "NULL can only be tested with IS NULL or IS NOT NULL")
        raise self.expected(what)

    def check_numeric(self, operator: str, token: Token, operand: Value) -> None:
        """Ordering operators and BETWEEN take numbers; a literal of another type is an error."""
        if isinstance(operand, Literal) and not isinstance(operand.value, Decimal):
            raise self.error(
                token,
                f"{operator} compares numbers, but {token.describe()} is {type_name(operand)} "
                "(strings and booleans can only be compared with = and <>)",
            )


def _flatten(kind: type[And] | type[Or], operands: list[Condition]) -> Condition:
    if len(operands) == 1:
        return operands[0]
    flat: list[Condition] = []
    for operand in operands:
        flat.extend(operand.operands if isinstance(operand, kind) else (operand,))
    return kind(tuple(flat))
