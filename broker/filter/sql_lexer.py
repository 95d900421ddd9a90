"""The SQL filter lexer: expression text to a list of tokens, each with its character position.

Token grammar (positions are 0-based character offsets into the expression):

    identifier  [A-Za-z_$][A-Za-z0-9_$.]*        case-sensitive, unless it spells a keyword
    keyword     an identifier spelling one of KEYWORDS, in any case
    string      '...' with '' standing for one quote; any character, newlines included
    number      [0-9]+ ( . [0-9]* )?  |  . [0-9]+   (no sign, no exponent; the parser applies signs)
    operator    = <> != < <= > >=  (!= is read as <>)
    sign        + -
    punctuation ( ) ,
    whitespace  space, tab, CR, LF, FF: separates tokens and is otherwise ignored

The token list always ends with one END token positioned at the end of the text. Anything else
raises IllegalFilterExpression via `invalid_sql`, naming the position.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import Enum

from broker.filter.api import display_text
from common.errors import IllegalFilterExpression

KEYWORDS = frozenset(
    {
        "AND",
        "BETWEEN",
        "CONTAINS",
        "ENDSWITH",
        "FALSE",
        "IN",
        "IS",
        "NOT",
        "NULL",
        "OR",
        "STARTSWITH",
        "TRUE",
    }
)

_WHITESPACE = frozenset(" \t\r\n\f")
_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_$")
_DIGITS = frozenset("0123456789")
_IDENT_PART = _IDENT_START | _DIGITS | {"."}
_OPERATORS = ("<>", "!=", "<=", ">=", "=", "<", ">")  # two-character operators first
_PUNCTUATION = {"(": "LPAREN", ")": "RPAREN", ",": "COMMA", "+": "SIGN", "-": "SIGN"}


class TokenKind(Enum):
    IDENT = "identifier"
    KEYWORD = "keyword"
    STRING = "string"
    NUMBER = "number"
    OP = "operator"
    SIGN = "sign"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    END = "end"


@dataclass(frozen=True, slots=True)
class Token:
    """`text` is the token as written; `value` is its meaning: the upper-cased keyword, the decoded
    string, the number, the operator (`!=` as `<>`), or the identifier itself."""

    kind: TokenKind
    text: str
    value: str | Decimal
    pos: int

    def describe(self) -> str:
        """The token as an error message names it."""
        if self.kind is TokenKind.END:
            return "the end of the filter"
        if self.kind is TokenKind.KEYWORD:
            return str(self.value)
        if self.kind is TokenKind.STRING:
            return display_text(self.text, 40)  # already in quotes
        return f"'{display_text(self.text, 40)}'"


_QUOTED_CHARS_MAX = 200  # of the expression, in an error message


def invalid_sql(text: str, pos: int, what: str) -> IllegalFilterExpression:
    """The error for a malformed SQL filter, naming the position and what was wrong there.

    A long expression is quoted as an excerpt around the position, marked with `…` where cut.
    """
    quoted = text
    if len(text) > _QUOTED_CHARS_MAX:
        start = max(0, min(pos - _QUOTED_CHARS_MAX // 2, len(text) - _QUOTED_CHARS_MAX))
        stop = start + _QUOTED_CHARS_MAX
        quoted = ("…" if start else "") + text[start:stop] + ("…" if stop < len(text) else "")
    return IllegalFilterExpression(
        f'SQL filter "{display_text(quoted, _QUOTED_CHARS_MAX + 2)}" is invalid at position {pos}: {what}'
    )


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos, end = 0, len(text)
    while pos < end:
        char = text[pos]
        if char in _WHITESPACE:
            pos += 1
        elif char in _IDENT_START:
            pos = _word(text, pos, tokens)
        elif char in _DIGITS or (char == "." and text[pos + 1 : pos + 2] in _DIGITS):
            pos = _number(text, pos, tokens)
        elif char == "'":
            pos = _string(text, pos, tokens)
        elif char in _PUNCTUATION:
            tokens.append(Token(TokenKind[_PUNCTUATION[char]], char, char, pos))
            pos += 1
        else:
            pos = _operator(text, pos, tokens)
    tokens.append(Token(TokenKind.END, "", "", end))
    return tokens


def _word(text: str, start: int, tokens: list[Token]) -> int:
    pos = start + 1
    while pos < len(text) and text[pos] in _IDENT_PART:
        pos += 1
    word = text[start:pos]
    upper = word.upper()
    if upper in KEYWORDS:
        tokens.append(Token(TokenKind.KEYWORD, word, upper, start))
    else:
        tokens.append(Token(TokenKind.IDENT, word, word, start))
    return pos


def _number(text: str, start: int, tokens: list[Token]) -> int:
    pos = start
    while pos < len(text) and text[pos] in _DIGITS:
        pos += 1
    if pos < len(text) and text[pos] == ".":
        pos += 1
        while pos < len(text) and text[pos] in _DIGITS:
            pos += 1
    if pos < len(text) and text[pos] in _IDENT_PART:
        # `5abc`, `1.2.3`, `1e5`: reject the whole word here rather than as two puzzling tokens later.
        while pos < len(text) and text[pos] in _IDENT_PART:
            pos += 1
        raise invalid_sql(
            text,
            start,
            f"'{display_text(text[start:pos], 40)}' is not a number "
            "(write digits with at most one decimal point; exponents are not supported)",
        )
    literal = text[start:pos]
    tokens.append(Token(TokenKind.NUMBER, literal, Decimal(literal), start))
    return pos


def _string(text: str, start: int, tokens: list[Token]) -> int:
    pieces: list[str] = []
    pos = start + 1
    while True:
        close = text.find("'", pos)
        if close < 0:
            raise invalid_sql(text, start, "the string starting here has no closing quote (')")
        pieces.append(text[pos:close])
        if text[close + 1 : close + 2] != "'":
            pos = close + 1
            break
        pieces.append("'")  # '' inside a string is one quote
        pos = close + 2
    tokens.append(Token(TokenKind.STRING, text[start:pos], "".join(pieces), start))
    return pos


def _operator(text: str, start: int, tokens: list[Token]) -> int:
    for op in _OPERATORS:
        if text.startswith(op, start):
            tokens.append(Token(TokenKind.OP, op, "<>" if op == "!=" else op, start))
            return start + len(op)
    char = display_text(text[start])
    hint = "; strings are written in single quotes" if char == '"' else ""
    raise invalid_sql(text, start, f"unexpected character '{char}'{hint}")
