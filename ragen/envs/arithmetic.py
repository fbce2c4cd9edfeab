"""A safe arithmetic parser for Countdown answers: integers, + - * /, parentheses. Never `eval`.

Grammar (left-associative, usual precedence; no unary signs, no other tokens):
    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"
Values are exact `Fraction`s, so 6 / 4 * 2 == 3 exactly.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_DIGITS = 6
TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


class ExpressionError(ValueError):
    """The text is not an arithmetic expression of the Countdown grammar."""


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        match = TOKEN.match(text, pos)
        if match is None:
            raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r} at position {pos}")
        number, op = match.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise ExpressionError(f"number {number[:10]}... has more than {MAX_DIGITS} digits")
        tokens.append(number if number is not None else op)
        pos = match.end()
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos, self.numbers = tokens, 0, []
        self.divided_by_zero = False

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("expression ends too early")
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.factor()
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                self.divided_by_zero = True  # keep parsing so the numbers used are still known
            else:
                value = value / rhs
        return value

    def factor(self) -> Fraction:
        token = self.take()
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(f"expected a number or '(', got {token!r}")


def evaluate(text: str) -> tuple[Fraction | None, list[int]]:
    """Parse and evaluate `text`; returns (value, integers used in order). The value is None on division by zero.

    Raises ExpressionError for anything outside the grammar (names, calls, `**`, decimals, unary signs, ...).
    """
    parser = _Parser(tokenize(text))
    value = parser.expr()
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after a complete expression")
    return (None if parser.divided_by_zero else value), parser.numbers
