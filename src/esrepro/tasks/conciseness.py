"""Conciseness: answer with exactly as many characters as the shortest verifiable answer.

Data live in the package file ``esrepro/tasks/data/conciseness.yaml`` (two
training prompts from the authors' release, the eight held-out prompts of the
paper's v2 Table 6). The prompt is the raw question, no chat template, as in the authors'
script.

Reward (the authors' ``compute_reward``; v2 App. A.2): ``-|len(response) - len(solution)|`` in
characters (the report shows it normalised to [0, 1], :func:`esrepro.report.conciseness.normalise_reward`). ``Score.correct`` is the answer check, not the length check: the
response, stripped of surrounding whitespace and trailing ``.``/``!``, equals
the solution (or an ``accept`` alternative) ignoring case. ``details`` has both
``answer_match`` and ``length_match`` (reward == 0). Option ``correct_by="length"``
makes ``correct`` the length check instead.

Option ``length_includes_prompt=True`` reproduces the authors' code exactly as
released: they decode the whole generated sequence, which for a decoder-only
Hugging Face model starts with the prompt, so their length counts the prompt
too. With it the reward is ``-|len(prompt + response) - len(solution)|`` (the
decoded prompt is taken to equal the prompt text).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from esrepro.tasks.base import Score, Task
from esrepro.tasks.sources import source_kind, write_prepared

TASK = "conciseness"
DATA_FILE = "data/conciseness.yaml"


def load_data() -> dict[str, Any]:
    """The packaged conciseness data: keys ``train``, ``eval`` (lists of prompt/solution)."""
    import yaml

    text = resources.files("esrepro.tasks").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def length_reward(response: str, solution: str) -> float:
    """``-|len(response) - len(solution)|`` in characters."""
    return -float(abs(len(response) - len(solution)))


def _canon(text: str) -> str:
    return text.strip().rstrip(".!").strip().casefold()


def answer_matches(response: str, example: dict) -> bool:
    """Whether the response is the solution (or an accepted alternative), loosely compared."""
    got = _canon(response)
    return any(got == _canon(a) for a in [example["solution"], *example.get("accept", [])])


#: Prepared split -> key of the packaged data.
SPLIT_KEYS = (("train", "train"), ("test", "eval"))


def prepare(out_dir: str | Path, source: dict, seed: int) -> dict[str, Any]:
    """Conciseness (``generated`` = the packaged YAML) -> ``train.jsonl``, ``test.jsonl``."""
    source_kind(TASK, source, ("generated",))
    data = load_data()
    out = {}
    for split, key in SPLIT_KEYS:
        out[split] = [{"id": f"conciseness-{split}-{i}", **item, "source": data["source"]}
                      for i, item in enumerate(data[key])]
    return write_prepared(out_dir, out)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write: the packaged prompts."""
    source_kind(TASK, source, ("generated",))
    data = load_data()
    return {split: len(data[key]) for split, key in SPLIT_KEYS}


class ConcisenessTask(Task):
    """Conciseness; options ``correct_by`` (``"answer"``/``"length"``), ``length_includes_prompt``."""

    name: ClassVar[str] = "conciseness"
    data_module: ClassVar[str | None] = __name__  # prepare() and split_sizes() below


    def prompt(self, example: dict) -> str:
        return example["prompt"]

    def score(self, response: str, example: dict) -> Score:
        counted = response
        if self.options.get("length_includes_prompt", False):
            counted = example["prompt"] + response
        reward = length_reward(counted, example["solution"])
        answer_ok = answer_matches(response, example)
        length_ok = reward == 0.0
        by = self.options.get("correct_by", "answer")
        if by not in ("answer", "length"):
            raise ValueError(f"conciseness option correct_by must be 'answer' or 'length', got {by!r}")
        correct = answer_ok if by == "answer" else length_ok
        return Score(reward, correct, {"answer_match": answer_ok, "length_match": length_ok,
                                       "length": len(counted)})
