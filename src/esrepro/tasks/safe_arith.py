"""Safe evaluation of arithmetic written by a model.

The reference graders (the ES authors' Countdown grader and TinyZero's) call
``eval`` on model text after a character whitelist. This module gives the same
value for the arithmetic those whitelists are meant to admit, without ``eval``:
the text is parsed with ``ast.parse(mode="eval")`` and the tree is walked by hand.

Accepted: integer literals (decimal literals too with ``allow_decimal=True``),
binary ``+ - * /``, unary ``-`` and ``+``, parentheses and the whitespace Python
itself accepts. Everything else -- names, calls, attributes, ``**``, ``//``,
``%``, comparisons, strings, subscripts, tuples, lambdas -- is refused by raising
:class:`UnsafeExpression`, as are texts or values beyond the bounds below.

For accepted input the result is exactly what Python computes (the same
operators are applied to the same Python numbers in the same order: ``int`` stays
``int`` under ``+ - *`` and ``/`` is true division giving ``float``).
Like ``eval`` on a string, leading spaces and tabs are ignored.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Callable, Union

Number = Union[int, float]

MAX_EXPRESSION_CHARS: int = 1024
"""Longest accepted text, in characters; checked before anything is parsed.

Generous on purpose: whitespace-padded answers still evaluate as ``eval`` would,
and parsing 1 KB costs microseconds."""

MAX_AST_DEPTH: int = 32
"""Deepest accepted nesting of operations and literals (the whole expression is
level 1). Parentheses add no depth; chains of unary minus or of binary operators do."""

MAX_LITERAL_DIGITS: int = 12
"""A literal must be below ``10 ** MAX_LITERAL_DIGITS`` in magnitude, i.e. have at
most this many digits before any decimal point (leading zeros aside)."""

MAX_MAGNITUDE: float = 1e12
"""Largest accepted absolute value of any literal or intermediate result. Bounding
every operand keeps each operation cheap and every float finite."""

_WHITESPACE = " \t\n\r\x0c"  # the whitespace Python's tokenizer accepts; others are syntax errors
_INT_CHARS = frozenset("0123456789+-*/()" + _WHITESPACE)
_DECIMAL_CHARS = _INT_CHARS | {"."}

_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type, Callable[[Number], Number]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class UnsafeExpression(ValueError):
    """The text is not accepted arithmetic; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def safe_eval(expr: str, *, allow_decimal: bool = False) -> Number:
    """Evaluate ``expr`` as Python would, or raise :class:`UnsafeExpression`.

    ``allow_decimal`` admits literals such as ``1.5``, ``1.`` and ``.5`` (TinyZero's
    whitelist allows ``.``; the ES authors' does not).
    """
    tree = _parse(expr, allow_decimal)
    return _evaluate(tree.body, allow_decimal, depth=1)


def try_safe_eval(expr: str, *, allow_decimal: bool = False) -> float | None:
    """``float(safe_eval(expr))``, or ``None`` when the expression is refused."""
    try:
        return float(safe_eval(expr, allow_decimal=allow_decimal))
    except UnsafeExpression:
        return None


def _parse(expr: str, allow_decimal: bool) -> ast.Expression:
    """Bound, filter and parse ``expr``."""
    if not isinstance(expr, str):
        raise TypeError(f"expected str, got {type(expr).__name__}")
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise UnsafeExpression(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    allowed = _DECIMAL_CHARS if allow_decimal else _INT_CHARS
    bad = next((c for c in expr if c not in allowed), None)
    if bad is not None:
        raise UnsafeExpression(f"character {bad!r} not allowed")
    text = expr.lstrip(" \t")  # eval() on a str strips these before compiling
    try:  # with these characters only, the parser emits no warnings
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UnsafeExpression(f"not a valid expression: {type(exc).__name__}") from None


def _evaluate(node: ast.AST, allow_decimal: bool, depth: int) -> Number:
    """Walk the tree, refusing every node kind not listed and any node deeper than
    MAX_AST_DEPTH (checked before descending, so recursion stays shallow)."""
    if depth > MAX_AST_DEPTH:
        raise UnsafeExpression(f"expression nested deeper than {MAX_AST_DEPTH}")
    if isinstance(node, ast.Constant):
        return _literal(node.value, allow_decimal)
    if isinstance(node, ast.BinOp):
        op = _BINARY.get(type(node.op))
        if op is None:
            raise UnsafeExpression(f"operator {type(node.op).__name__} not allowed")
        left = _evaluate(node.left, allow_decimal, depth + 1)
        right = _evaluate(node.right, allow_decimal, depth + 1)
        if isinstance(node.op, ast.Div) and right == 0:
            raise UnsafeExpression("division by zero")
        return _bounded(op(left, right))
    if isinstance(node, ast.UnaryOp):
        uop = _UNARY.get(type(node.op))
        if uop is None:
            raise UnsafeExpression(f"operator {type(node.op).__name__} not allowed")
        return uop(_evaluate(node.operand, allow_decimal, depth + 1))
    raise UnsafeExpression(f"{type(node).__name__} not allowed")


def _literal(value: object, allow_decimal: bool) -> Number:
    """Accept an int literal (or a finite float one when allowed) within bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsafeExpression(f"literal of type {type(value).__name__} not allowed")
    if isinstance(value, float) and not (allow_decimal and math.isfinite(value)):
        raise UnsafeExpression(f"decimal literal {value!r} not allowed")
    if abs(value) >= 10**MAX_LITERAL_DIGITS:
        raise UnsafeExpression(f"literal longer than {MAX_LITERAL_DIGITS} digits")
    return value


def _bounded(value: Number) -> Number:
    """Refuse values beyond MAX_MAGNITUDE."""
    if abs(value) > MAX_MAGNITUDE:
        raise UnsafeExpression(f"value beyond {MAX_MAGNITUDE:g} in magnitude")
    return value
