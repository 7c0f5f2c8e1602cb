"""The Task seam: every task loads prepared examples, builds prompts and scores responses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from esrepro.io import read_jsonl


@dataclass(frozen=True)
class Score:
    """The grade of one response.

    ``reward`` is what training optimises; ``correct`` is what accuracy counts;
    ``details`` holds the components (for example format and answer rewards).
    """

    reward: float
    correct: bool
    details: dict[str, Any] = field(default_factory=dict)


class Task:
    """Base class of a task.

    Subclasses set ``name`` and implement ``prompt`` and ``score``. Examples are
    plain dicts read from ``data/prepared/{task}/{split}.jsonl``; every example has
    an ``id``. ``prepare`` (a module-level function per task) writes those files.
    """

    name: ClassVar[str] = ""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def load(self, split: str, data_dir: str | Path) -> list[dict]:
        """Read the prepared examples of ``split`` from ``data_dir/{split}.jsonl``."""
        path = Path(data_dir) / f"{split}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"task {self.name!r}: no prepared split {split!r} at {path}")
        return read_jsonl(path)

    def prompt(self, example: dict) -> str:
        """The text given to the model for ``example``."""
        raise NotImplementedError

    def score(self, response: str, example: dict) -> Score:
        """Grade ``response`` (the generated continuation only) against ``example``."""
        raise NotImplementedError
