"""The Task seam: every task loads prepared examples, builds prompts and scores responses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from esrepro.io import read_jsonl

if TYPE_CHECKING:
    from esrepro.tasks.sources import HubClient


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
    an ``id``. The classmethod ``prepare`` writes those files from a configured
    source and ``split_sizes`` says how many rows it will write.
    """

    name: ClassVar[str] = ""
    #: Modules its grading or data import when a job runs (checked before any job: esrepro.planning.preflight).
    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        self.options = options

    #: The module holding this task's data functions ``prepare(out_dir, source, seed[, hub=])`` and
    #: ``split_sizes(source)`` (often the task's own: ``data_module = __name__``); None: the task has none.
    data_module: ClassVar[str | None] = None

    @classmethod
    def _data_function(cls, name: str) -> Any:
        import importlib

        fn = getattr(importlib.import_module(cls.data_module), name, None) if cls.data_module else None
        if fn is None:
            what = "has no data preparation" if name == "prepare" else "cannot tell its split sizes"
            raise NotImplementedError(f"task {cls.name!r} ({cls.__name__}) {what}")
        return fn

    @classmethod
    def prepare(cls, out_dir: str | Path, source: dict, seed: int, *, hub: HubClient | None = None) -> dict[str, Any]:
        """Write ``out_dir/{split}.jsonl`` from ``source`` (a config ``data.<task>.source``).

        Returns ``{"splits": {split: {"n", "sha256"}}, "provenance": {...} or {}}``;
        ``hub`` replaces the Hugging Face client for hub sources (tests).
        """
        fn = cls._data_function("prepare")
        return fn(out_dir, source, seed) if hub is None else fn(out_dir, source, seed, hub=hub)

    @classmethod
    def split_sizes(cls, source: dict) -> dict[str, int | None]:
        """Rows per split that ``prepare`` will write from ``source``, without preparing;
        None where only the data can tell (local and hub sources)."""
        return cls._data_function("split_sizes")(source)

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

    def score_many(self, responses: Sequence[str], examples: Sequence[dict]) -> list[Score]:
        """Grade a batch, in order (a task whose grading runs programs scores them side by side)."""
        return [self.score(r, e) for r, e in zip(responses, examples, strict=True)]
