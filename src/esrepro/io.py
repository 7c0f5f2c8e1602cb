"""Atomic file output, JSON-lines helpers and file hashing: nothing is ever left half-written."""

from __future__ import annotations

import contextlib
import hashlib
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
    """Read a JSON file; ValueError naming the file and line when it is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text at byte {exc.start}") from None


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write one JSON object per line, atomically."""
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON-lines file into a list of dicts; ValueError naming the file and line of a broken one."""
    rows = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
                if line.strip():
                    rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text at column {exc.start + 1}") from None
    return rows


@contextlib.contextmanager
def reading(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Re-raise a failure to parse ``path`` (a corrupt safetensors header, say) as one ValueError naming it.

    OSError (missing, unreadable) passes through unchanged: it names the file already.
    """
    try:
        yield
    except OSError:
        raise
    except ValueError as exc:
        if str(path) in str(exc):
            raise
        raise ValueError(f"{path}: cannot read{' ' + what if what else ''}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # e.g. safetensors' SafetensorError, a torch or pickle error
        raise ValueError(f"{path}: cannot read{' ' + what if what else ''}: {type(exc).__name__}: {exc}") from exc


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
