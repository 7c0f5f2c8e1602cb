"""GSM8K: grade-school word problems with an integer answer.

The prompt is the authors' Qwen2.5-Math template (their ``train.py`` feeds the
GSM8K ``problem`` field through ``qwen_math_template``). The answer a response
commits to is, in order of preference:

1. the content of its last ``\\boxed{...}`` (what the prompt asks for);
2. the number after its last ``####`` (GSM8K's own solution format);
3. its last number (commas between digit groups allowed).

Grading is :func:`esrepro.tasks.math.verify_answer` against the gold number;
reward 1.0 if correct else 0.0. The authors' grader (``boxed_reward_fn``) has no
fallbacks: a response without a box scores 0. Option ``boxed_only=True`` does the
same here.
"""

from __future__ import annotations

from typing import ClassVar

from esrepro.tasks.base import Score
from esrepro.tasks.math import MAX_ANSWER_CHARS, MathTask, _preview, last_boxed, verify_answer
from esrepro.tasks.timeout import DEFAULT_TIMEOUT_S

_DIGITS = frozenset("0123456789")
_NUMBER_CHARS = _DIGITS | {",", "."}


def gold_from_solution(answer: str) -> str:
    """GSM8K's gold answer: the text after the last ``####`` (the whole field if none),
    with thousands separators removed."""
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    return answer.strip().replace(",", "")


def _number_at(text: str, end: int, max_chars: int) -> tuple[int, int] | None:
    """Span of the number whose last digit is ``text[end - 1]``; None past ``max_chars``."""
    start = end
    while start > 0 and text[start - 1] in _NUMBER_CHARS:
        start -= 1
        if end - start > max_chars:
            return None
    while start < end and text[start] in ",.":
        start += 1
    if start > 0 and text[start - 1] == "-":
        start -= 1
    return (start, end) if start < end else None


def last_number(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """The last number in ``text`` (``-1,234.5`` style), or None; linear time.

    A number longer than ``max_chars`` gives None.
    """
    end = len(text)
    while end > 0 and text[end - 1] not in _DIGITS:
        end -= 1
    if end == 0:
        return None
    span = _number_at(text, end, max_chars)
    if span is None:
        return None
    return text[span[0] : span[1]].rstrip(".,")


def after_hashes(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """The number right after the last ``####`` in ``text``, or None."""
    idx = text.rfind("####")
    if idx < 0:
        return None
    i = idx + 4
    while i < len(text) and text[i] in " \t$":
        i += 1
    j = i + (1 if i < len(text) and text[i] == "-" else 0)
    while j < len(text) and (text[j] in _NUMBER_CHARS) and j - i <= max_chars:
        j += 1
    token = text[i:j].rstrip(".,")
    if not any(c in _DIGITS for c in token) or j - i > max_chars:
        return None
    return token


def extract_gsm8k_answer(text: str, max_chars: int = MAX_ANSWER_CHARS) -> tuple[str | None, str]:
    """(answer, how): ``how`` is ``"boxed"``, ``"hashes"``, ``"last_number"`` or ``"none"``."""
    for how, fn in (("boxed", last_boxed), ("hashes", after_hashes), ("last_number", last_number)):
        got = fn(text, max_chars)
        if got is not None:
            return got, how
    return None, "none"


class GSM8KTask(MathTask):
    """GSM8K with the Qwen math prompt; options as :class:`~esrepro.tasks.math.MathTask`
    plus ``boxed_only`` (default False: use the ``####`` and last-number fallbacks)."""

    name: ClassVar[str] = "gsm8k"
    data_module: ClassVar[str | None] = "esrepro.tasks.gsm8k_data"

    def score(self, response: str, example: dict) -> Score:
        max_chars = int(self.options.get("max_answer_chars", MAX_ANSWER_CHARS))
        if self.options.get("boxed_only", False):
            pred = last_boxed(response, max_chars)
            how = "boxed" if pred is not None else "none"
        else:
            pred, how = extract_gsm8k_answer(response, max_chars)
        correct, details = verify_answer(
            pred,
            [gold_from_solution(str(example["answer"]))],
            timeout_s=float(self.options.get("grading_timeout_s", DEFAULT_TIMEOUT_S)),
            max_answer_chars=max_chars,
            pool=self._pool(),
        )
        details = {"extracted": _preview(pred), "extracted_by": how, "formatted": how == "boxed", **details}
        return Score(reward=1.0 if correct else 0.0, correct=correct, details=details)
