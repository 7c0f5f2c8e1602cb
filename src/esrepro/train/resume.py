"""Resume states of the iterative trainers (ES, ESSA): one folder, written atomically, refused when stale.

A state folder holds ``state.json`` (the completed steps, the key of settings it was written with, and
whatever else the trainer records), ``log.jsonl`` (the per-step rows so far), any named lists of extra
rows (``<name>.jsonl``) and the trainer's own payload (the ES engines' weights, the CMA-ES state).
Everything is written into a temporary sibling and renamed into place, so an interrupted write leaves the
previous state whole. A state whose key differs from the resuming run's settings is refused with
:class:`ResumeMismatch`, which says what to delete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

from esrepro.io import atomic_path, read_json, read_jsonl, write_json

STATE = "state.json"
LOG = "log.jsonl"


class ResumeMismatch(RuntimeError):
    """A resume state exists but was written by a run with different settings."""


def state_key(settings: Any, seed: int, not_in_state: Iterable[str], extra: dict | None = None) -> dict:
    """What a resume state must have been written with: the settings that shape the run (all but
    ``not_in_state``), the seed, and ``extra`` (e.g. the hash of an input the run builds on)."""
    shaped = settings.model_dump(mode="json", exclude=set(not_in_state))
    if "start_from" in shaped and shaped["start_from"] is None:  # unset: the key states had before the option
        del shaped["start_from"]
    return {**shaped, "seed": seed, **(extra or {})}


def has_state(state_dir: str | Path) -> bool:
    """Whether ``state_dir`` holds a resume state to continue from."""
    return (Path(state_dir) / STATE).exists()


def _rows(rows: list[dict]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def write_state(state_dir: str | Path, meta: dict, log: list[dict], payload: Callable[[Path], None],
                extra: dict[str, list[dict]] | None = None) -> None:
    """Replace the state in ``state_dir`` atomically: ``meta`` as state.json (with its ``config`` key), the log,
    each ``extra`` list of rows, and what ``payload(folder)`` writes into the new folder."""
    with atomic_path(state_dir, is_dir=True) as tmp:
        payload(tmp)
        (tmp / LOG).write_text(_rows(log))
        for name, rows in (extra or {}).items():
            (tmp / f"{name}.jsonl").write_text(_rows(rows))
        write_json(tmp / STATE, meta)


def read_state(state_dir: str | Path, key: dict, extra: dict[str, list[dict]] | None = None
               ) -> tuple[dict, list[dict]]:
    """(state.json, log) of the state in ``state_dir``, refused unless it was written with ``key``. Each ``extra``
    list is replaced, in place, by the rows the state holds for it."""
    state_dir = Path(state_dir)
    meta = read_json(state_dir / STATE)
    if meta.get("config") != key:
        raise ResumeMismatch(f"{state_dir} was written with settings {meta.get('config')}, not {key}; "
                             f"delete {state_dir} to start this run afresh")
    for name, rows in (extra or {}).items():
        path = state_dir / f"{name}.jsonl"
        rows[:] = read_jsonl(path) if path.exists() else []
    return meta, read_jsonl(state_dir / LOG)


def announce_resume(method: str, state: str | Path, done: int, total: int, unit: str = "step") -> None:
    """Say in the run's log (stdout) that it continues from a resume state: which state, and the ``unit``s of the
    run's ``total`` it holds done."""
    print(f"{method}: resuming from the state in {state}: {done} of {total} {unit}s done, continuing with {unit} "
          f"{done}", flush=True)


def clear_state(state_dir: str | Path) -> None:
    """Remove a finished run's resume state."""
    shutil.rmtree(state_dir, ignore_errors=True)
