"""The written form of a math answer, shared by the math grader (:mod:`esrepro.tasks.math`) and the data
loaders that store gold answers (:mod:`esrepro.tasks.math_data`, :mod:`esrepro.tasks.math_train`)."""

from __future__ import annotations

from typing import Any


def clean_answer(answer: Any) -> str:
    """A gold or predicted answer as one LaTeX-ish string without math delimiters.

    Integral floats become integers (``142.0`` -> ``142``, the AMC23 copy stores
    floats); surrounding whitespace, ``$``/``\\(``/``\\)`` delimiters and a final
    period are dropped; an escaped ``\\$`` (currency) is kept.
    """
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    s = str(answer).strip()
    s = "\\$".join(part.replace("$", "") for part in s.split("\\$"))  # no placeholder a response could forge
    s = s.replace("\\(", "").replace("\\)", "").strip()
    while s.endswith("."):
        s = s[:-1].rstrip()
    return s
