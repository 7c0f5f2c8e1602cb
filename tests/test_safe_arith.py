"""Tests of the safe arithmetic evaluator."""

from __future__ import annotations

import json
import random
import re
import time
import warnings
from pathlib import Path

import pytest

from esrepro.tasks.safe_arith import (
    MAX_AST_DEPTH,
    MAX_EXPRESSION_CHARS,
    MAX_LITERAL_DIGITS,
    MAX_MAGNITUDE,
    UnsafeExpression,
    safe_eval,
    try_safe_eval,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "es-at-scale"
AUTHORS_JSON = SHARED / "countdown.json"
AUTHORS_ALLOWED = re.compile(r"^[0-9+\-*/() ]+$")


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1+2", 3),
        ("2*3-4", 2),
        ("2-3*4", -10),
        ("7/2", 3.5),
        ("6/3", 2.0),
        ("(1 + 2) / 3", 1.0),
        (" (1 + 2) / 3 ", 1.0),  # eval() ignores leading spaces; so do we
        ("\t1+2", 3),
        ("1+2\n", 3),
        ("(1+\n2)", 3),
        ("-(-3)", 3),
        ("+5", 5),
        ("--5", 5),
        ("1 - -2", 3),
        ("((44 + 19) + 35)", 98),
        ("00", 0),
        ("(((((((((1)))))))))", 1),
    ],
)
def test_values_and_types_match_python(expr: str, value: float) -> None:
    got = safe_eval(expr)
    assert got == value
    assert type(got) is type(value)


def test_decimal_literals_only_when_allowed() -> None:
    assert safe_eval("1.5*2", allow_decimal=True) == 3.0
    assert safe_eval(".5+1.", allow_decimal=True) == 1.5
    with pytest.raises(UnsafeExpression):
        safe_eval("1.5*2")


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "x",
        "abs(1)",
        "(1).real",
        "().__class__",
        "2**3",
        "9**9**9**9",
        "7//2",
        "7%2",
        "1<2",
        "1==1",
        "'a'",
        "[1][0]",
        "lambda: 1",
        "()",
        "(1)(2)",
        "1,2",
        "True",
        "1j",
        "0x10",
        "1_000",
        "1e3",
        "1/0",
        "1/(2-2)",
        "(1+2",
        "1+2)",
        "",
        "   ",
        "1 2",
        "05",
        "1+2\x00",
        "1+\x0b2",
        "٤٤",
        "1" + "0" * MAX_LITERAL_DIGITS,
        "1000000*1000001",
        "-" * 100 + "1",
        "9" * 10_000,
        "(" * 10_000 + "1" + ")" * 10_000,
        "1+" * 50_000 + "1",
    ],
)
def test_refusals(expr: str) -> None:
    start = time.perf_counter()
    with pytest.raises(UnsafeExpression) as info:
        safe_eval(expr)
    assert time.perf_counter() - start < 1.0
    assert isinstance(info.value, ValueError) and info.value.reason
    assert try_safe_eval(expr) is None


def test_bounds_are_inclusive_where_documented() -> None:
    assert safe_eval("-" * (MAX_AST_DEPTH - 1) + "1") == -1
    with pytest.raises(UnsafeExpression, match="deeper"):
        safe_eval("-" * MAX_AST_DEPTH + "1")
    assert safe_eval("1" + " " * (MAX_EXPRESSION_CHARS - 1)) == 1
    with pytest.raises(UnsafeExpression, match="longer"):
        safe_eval("1" + " " * MAX_EXPRESSION_CHARS)
    assert safe_eval("9" * MAX_LITERAL_DIGITS) == 10**MAX_LITERAL_DIGITS - 1
    assert safe_eval("1000000*1000000") == MAX_MAGNITUDE


def test_try_safe_eval_returns_float() -> None:
    assert try_safe_eval("2*3") == 6.0 and isinstance(try_safe_eval("2*3"), float)


def test_non_string_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        safe_eval(3)  # type: ignore[arg-type]


def _mutations(solution: str, rng: random.Random, count: int) -> list[str]:
    """Single-character corruptions of a trusted solution, kept only when they pass the
    authors' whitelist and contain no ``**``/``//`` (which we refuse on purpose)."""
    alphabet = "0123456789+-*/() "
    out = []
    for _ in range(count):
        i = rng.randrange(len(solution) + 1)
        kind = rng.randrange(3)
        if kind == 0:
            s = solution[:i] + rng.choice(alphabet) + solution[i:]
        elif kind == 1:
            s = solution[:i] + solution[i + 1 :]
        else:
            s = solution[:i] + rng.choice(alphabet) + solution[i + 1 :]
        if AUTHORS_ALLOWED.match(s) and "**" not in s and "//" not in s:
            out.append(s)
    return out


@pytest.mark.skipif(not AUTHORS_JSON.exists(), reason="shared data not present")
def test_agrees_with_eval_on_authors_solutions_and_corruptions() -> None:
    """eval is used here only on the authors' own solutions and whitelisted corruptions."""
    solutions = [e["solution"] for e in json.loads(AUTHORS_JSON.read_text()) if e["solution"]]
    rng = random.Random(0)
    checked = 0
    for solution in solutions:
        for expr in [solution, *_mutations(solution, rng, 4)]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    expected = eval(expr, {"__builtins__": None}, {})  # noqa: S307 - trusted, whitelisted
                except Exception:
                    expected = None
            if not isinstance(expected, (int, float)):
                assert try_safe_eval(expr) is None, expr
                continue
            try:
                got = safe_eval(expr)
            except UnsafeExpression as exc:  # only the documented magnitude bound may differ
                assert "beyond" in exc.reason, expr
                continue
            assert got == expected and type(got) is type(expected), expr
            checked += 1
    assert checked > len(solutions)
