"""Atomic file output and JSON-lines helpers: nothing is ever left half-written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it onto ``path``.

    On error the temporary is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    target = tmp if is_dir else tmp / path.name
    try:
        yield target
        if is_dir and path.exists():
            backup = path.with_name(f".{path.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            path.rename(backup)
            target.rename(path)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write one JSON object per line, atomically."""
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON-lines file into a list of dicts."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
