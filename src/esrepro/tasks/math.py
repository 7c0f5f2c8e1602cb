"""Math reasoning tasks (MATH500, Minerva, OlympiadBench, AIME24, AMC23) graded with math-verify.

Follows the authors' ``es_at_scale`` math setup (``template_function/apply_template.py``
and ``reward_function/math_grader.py``):

* prompt: the Qwen2.5-Math chat template, system message "Please reason step by
  step, and put your final answer within \\boxed{}.";
* answer: the content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``); a response
  whose last box is unterminated has no answer;
* reward: 1.0 if correct else 0.0, no format component (the authors give none
  "to avoid hacking"); a list of gold answers counts as correct if any matches.

Grading, in order:

1. no answer, or one longer than ``max_answer_chars``: wrong, without further work;
2. normalised string equality (spaces, ``\\left``/``\\right``, ``\\dfrac``, ``\\text{}``,
   degrees, percent and dollar signs, thousands separators, case): correct;
3. prediction and every gold plain decimal numbers: decided by exact ``Decimal`` equality;
4. otherwise math-verify ``parse`` on ``$<answer>$`` for both sides (after the
   rewrites in :func:`_mv_text`) and ``verify(gold, pred)``,
   run in a worker process under a hard timeout (:mod:`esrepro.tasks.timeout`) with
   math-verify's own signal-based timeouts disabled, so it works off the main thread.
   A time-out counts as wrong and is reported in ``Score.details["timed_out"]``.

Differences from the authors: their grader also runs a sympy-based comparison
(``grade_answer_sympy`` from the PRM800K grader) and the ``mathd`` normaliser with a
long unit list before math-verify; here math-verify replaces the sympy step and a
smaller normaliser replaces theirs. Their brace scanner counts ``\\{`` as a brace;
this one skips escaped characters.
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Sequence

from esrepro.tasks.base import Score, Task
from esrepro.tasks.math_answer import clean_answer
from esrepro.tasks.timeout import DEFAULT_TIMEOUT_S, DEFAULT_WORKERS, GradingPool, shared_pool

QWEN_MATH_TEMPLATE = (
    "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    "<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n"
)
#: Extracted answers longer than this are graded wrong without parsing.
MAX_ANSWER_CHARS = 1000
#: Modules the grading forkserver imports once (the last one warms math-verify up).
GRADER_PRELOAD = ("esrepro.tasks.math", "math_verify", "esrepro.tasks.math_warm")


def qwen_math_prompt(problem: str) -> str:
    """The authors' ``qwen_math_template``: a Qwen2.5-Math chat prompt for ``problem``."""
    return QWEN_MATH_TEMPLATE.format(problem=problem)


# ---------------------------------------------------------------- extraction


def _braced(text: str, start: int, max_chars: int) -> tuple[str, int] | None:
    """Content of the group opening at ``text[start] == "{"`` and the index after it.

    Escaped characters (``\\{``, ``\\}``, ``\\\\``) do not count as braces. Returns None
    when the group is unterminated or its content exceeds ``max_chars``.
    """
    depth = 0
    i = start
    end = min(len(text), start + max_chars + 2)
    while i < end:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def last_boxed(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` in ``text``, or None.

    None when there is no box, when the last box is unterminated, or when its
    content is longer than ``max_chars``. ``\\boxed 5`` (no braces) gives ``5``.
    Runs in time linear in ``len(text)``.
    """
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    after = idx + (6 if text.startswith("\\boxed", idx) else 5)
    i = after
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        got = _braced(text, i, max_chars)
        return None if got is None else got[0].strip()
    if i > after:  # "\boxed 5": up to whitespace or "$"
        j = i
        while j < len(text) and j - i <= max_chars and not text[j].isspace() and text[j] != "$":
            j += 1
        token = text[i:j]
        return token if token and j - i <= max_chars else None
    return None


# ---------------------------------------------------------------- normalisation

_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d{1,4})?", re.IGNORECASE)
_TEXT_CMDS = ("\\text", "\\textbf", "\\mathrm", "\\mathbf", "\\mbox", "\\textup")
_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\displaystyle",
           "^{\\circ}", "^\\circ", "\\circ", "\\%", "%", "\\$")


def _unwrap_text(s: str) -> str:
    """Replace ``\\text{x}`` (and similar commands) by ``x``; bounded by ``len(s)`` passes."""
    for cmd in _TEXT_CMDS:
        start = 0
        while True:
            i = s.find(cmd + "{", start)
            if i < 0:
                break
            got = _braced(s, i + len(cmd), len(s))
            if got is None:
                break
            inner, end = got
            s = s[:i] + inner + s[end:]
            start = i
    return s


def normalize_answer(s: str) -> str:
    """String normal form used for the cheap equality check (lower-cased, no spaces)."""
    s = clean_answer(s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in _REMOVE:
        s = s.replace(token, "")
    s = _unwrap_text(s)
    s = "".join(s.split()).lower()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    while s.endswith("."):
        s = s[:-1]
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _braced(s, 0, len(s)) == (s[1:-1], len(s)):
        s = s[1:-1]
    return s


def as_number(s: str) -> Decimal | None:
    """``s`` as a Decimal if its normal form is a plain decimal number, else None."""
    s = normalize_answer(s)
    if len(s) > 200 or not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


# ---------------------------------------------------------------- math-verify (in a worker)


# latex2sympy2_extended (math-verify's parser) rejects E_/e_ with a subscript and
# commands inside subscripts (L_{\odot}, m_{\max}); rewritten identically on both sides.
_E_SUBSCRIPT = re.compile(r"(?<![A-Za-z\\])[Ee]_")
_SUBSCRIPT_CMD = re.compile(r"_(?:\{\s*\\([A-Za-z]+)\s*\}|\\([A-Za-z]+))")
# A short assignment "N = ...": the left side is a letter, optionally subscripted, or a command.
_ASSIGNMENT = re.compile(r"\s*(?:[A-Za-z](?:_\{[^{}=]{1,20}\}|_[A-Za-z0-9])?|\\[A-Za-z]+)\s*=")


def _mv_text(s: str) -> str:
    """What math-verify parses for an answer: ``$...$`` around a cleaned string.

    Besides :func:`clean_answer`: drops ``\\$`` and ``\\!``; rewrites the subscripts
    latex2sympy cannot read (see above); and keeps only the right side of a short
    assignment (``N=n`` -> ``n``), as the authors' ``mathd`` normaliser does for
    ``k = ...``. Without the last step ``N=n`` is read as ``Eq(n, n)`` (latex2sympy
    lower-cases single letters) and math-verify accepts ``N=n+1`` for it.
    """
    s = clean_answer(s).replace("\\$", "").replace("\\!", "")
    s = _E_SUBSCRIPT.sub(lambda m: "\\mathcal{E}_", s)
    s = _SUBSCRIPT_CMD.sub(lambda m: "_{" + (m.group(1) or m.group(2)) + "}", s)
    if s.count("=") == 1 and (m := _ASSIGNMENT.match(s)) and s[m.end():].strip():
        s = s[m.end():].strip()
    return f"${s}$"


def math_verify_match(golds: Sequence[str], pred: str) -> bool:
    """math-verify's verdict: does ``pred`` equal any of ``golds``?

    Calls ``parse``/``verify`` with their signal-based timeouts disabled
    (``parsing_timeout=None``, ``timeout_seconds=None``): run it through
    :func:`verify_answer` (or another hard timeout), never bare on untrusted input.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    config = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

    def _parse(s: str) -> list:
        return parse(_mv_text(s), extraction_config=config, fallback_mode="no_fallback",
                     extraction_mode="first_match", parsing_timeout=None)

    parsed_pred = _parse(pred)
    if not parsed_pred:
        return False
    for gold in golds:
        parsed_gold = _parse(gold)
        if parsed_gold and verify(parsed_gold, parsed_pred, timeout_seconds=None):
            return True
    return False


#: Answers whose first parse and verify load the parts of sympy that math answers reach (fractions, equations,
#: intervals, constants, trigonometric and exponential functions, powers of ten, roots), each 0.03-0.16 s on its
#: first use in a process, nothing after: paid in :func:`warm_math_verify`, not inside a graded answer's 1-s limit,
#: where a busy machine could push it over and turn a wrong answer into a time-out.
WARM_ANSWERS = ("x=\\frac{1}{2}", "(1,2]", "[1, 2)", "14\\pi", "3x^{2} \\sin x + x^{3} \\cos x", "2e^{3t}",
                "1.5 \\times 10^{9}", "\\sqrt{2}", "\\{1, 2\\}")


def warm_math_verify() -> None:
    """Exercise parse/verify on :data:`WARM_ANSWERS` so a new worker pays sympy's lazy imports up front."""
    for answer in WARM_ANSWERS:
        math_verify_match([answer], "0.5")


def grading_pool(n_workers: int = DEFAULT_WORKERS) -> GradingPool:
    """The shared worker pool used for math grading (its forkserver preloads math-verify)."""
    return shared_pool(n_workers=n_workers, preload=GRADER_PRELOAD)


def verify_answer(
    pred: str | None,
    golds: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    use_math_verify: bool = True,
    use_string_match: bool = True,
    pool: GradingPool | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Grade one extracted answer against gold answers; returns (correct, details).

    ``details["method"]`` says which step decided: ``"none"`` (no answer),
    ``"too_long"``, ``"string"``, ``"number"``, ``"math_verify"``, ``"timeout"``
    or ``"error"``.
    """
    golds = [clean_answer(g) for g in golds]
    if pred is None:
        return False, {"method": "none"}
    if len(pred) > max_answer_chars:
        return False, {"method": "too_long"}
    if use_string_match:
        norm = normalize_answer(pred)
        if norm and any(norm == normalize_answer(g) for g in golds):
            return True, {"method": "string"}
        pred_num = as_number(pred)
        gold_nums = [as_number(g) for g in golds]
        if pred_num is not None and all(g is not None for g in gold_nums):
            return pred_num in gold_nums, {"method": "number"}
    if not use_math_verify:
        return False, {"method": "string"}
    result = (pool or grading_pool()).call(math_verify_match, golds, pred, timeout_s=timeout_s)
    if result.timed_out:
        return False, {"method": "timeout", "timed_out": True}
    if not result.ok:
        return False, {"method": "error", "error": result.error}
    return bool(result.value), {"method": "math_verify"}


def gold_answers(example: dict) -> list[str]:
    """An example's accepted gold answers: ``answers`` (a list) or else ``answer``."""
    answers = example.get("answers")
    if answers is None:
        answers = [example["answer"]]
    elif isinstance(answers, str):
        answers = [answers]
    return [clean_answer(a) for a in answers]


def _preview(text: str | None, limit: int = 200) -> str | None:
    """``text`` cut to ``limit`` characters for ``Score.details``."""
    return text if text is None or len(text) <= limit else text[:limit] + "..."


class MathTask(Task):
    """A boxed-answer math benchmark; options: ``grading_timeout_s``, ``max_answer_chars``,
    ``grading_workers`` (processes in the grading pool, default 2)."""

    name: ClassVar[str] = "math"
    requires: ClassVar[tuple[str, ...]] = ("math_verify",)  # grading (verify_answer)

    @classmethod
    def _data_function(cls, name: str) -> Any:
        """The five math sets share :mod:`esrepro.tasks.math_data` (keyed by the set's name); a math-format
        task with data of its own (GSM8K) names its module in ``data_module``."""
        if cls.data_module:
            return super()._data_function(name)
        import functools

        from esrepro.tasks import math_data

        return functools.partial(getattr(math_data, name), cls.name)

    def prompt(self, example: dict) -> str:
        return qwen_math_prompt(example["problem"])

    def _pool(self) -> GradingPool:
        return grading_pool(int(self.options.get("grading_workers", DEFAULT_WORKERS)))

    def extract(self, response: str) -> str | None:
        """The answer a response commits to (its last box)."""
        return last_boxed(response, max_chars=int(self.options.get("max_answer_chars", MAX_ANSWER_CHARS)))
    def score(self, response: str, example: dict) -> Score:
        pred = self.extract(response)
        correct, details = verify_answer(
            pred,
            gold_answers(example),
            timeout_s=float(self.options.get("grading_timeout_s", DEFAULT_TIMEOUT_S)),
            max_answer_chars=int(self.options.get("max_answer_chars", MAX_ANSWER_CHARS)),
            pool=self._pool(),
        )
        details = {"extracted": _preview(pred), "formatted": pred is not None, **details}
        return Score(reward=1.0 if correct else 0.0, correct=correct, details=details)


class Math500Task(MathTask):
    """MATH500 (HuggingFaceH4/MATH-500)."""

    name: ClassVar[str] = "math500"


class MinervaTask(MathTask):
    """Minerva Math (OCWCourses); gold may list several accepted forms."""

    name: ClassVar[str] = "minerva"


class OlympiadBenchTask(MathTask):
    """OlympiadBench (English, text-only, open-ended maths subset)."""

    name: ClassVar[str] = "olympiad_bench"


class Aime24Task(MathTask):
    """AIME 2024."""

    name: ClassVar[str] = "aime24"


class Amc23Task(MathTask):
    """AMC 2023."""

    name: ClassVar[str] = "amc23"
