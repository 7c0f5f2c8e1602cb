"""Audit a result: walk its manifests back to datasets, base model, configuration and code.

Every pipeline step writes a manifest recording its inputs' and outputs' sha256
(:func:`esrepro.provenance.manifest.build_manifest`). :func:`audit` finds the manifest that
produced a target file, re-hashes what it recorded, and recurses into the producer
of each input, so a changed or missing file anywhere upstream is named.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esrepro.provenance.manifest import MANIFEST, sha256_tree

SCAN_DIRS = ("data", "results")
SUMMARY_KEYS = ("task", "split", "model", "method", "seed", "hub_id", "revision")


class AuditError(Exception):
    """The audit could not be carried out (no producer for the target, unreadable manifest)."""


@dataclass
class FileCheck:
    """One recorded file or directory, re-hashed: ``actual`` is None when it is missing."""

    path: str
    recorded: str
    actual: str | None
    role: str  # "output" or "input"
    name: str  # its key in the manifest
    manifest: str  # the manifest that recorded it
    depth: int = 0
    source: bool = False  # an input with no producer manifest (config, external data)

    @property
    def ok(self) -> bool:
        return self.actual == self.recorded

    @property
    def status(self) -> str:
        return "ok" if self.ok else ("missing" if self.actual is None else "changed")

    def describe(self) -> str:
        """``<path> changed (recorded <sha>, now <sha>)``, ``<path> is missing`` or ``<path> ok``."""
        if self.actual is None:
            return f"{self.path} is missing"
        if not self.ok:
            return f"{self.path} changed (recorded {self.recorded}, now {self.actual})"
        return f"{self.path} ok"


@dataclass
class Step:
    """One manifest on the chain: what ran, with which settings and code."""

    manifest: str
    kind: str
    summary: dict[str, Any]
    commit: str | None
    dirty: bool | None
    depth: int = 0
    repeat: bool = False  # reached again; its inputs were walked where it first appeared


@dataclass
class AuditReport:
    """The walk from ``target`` back through its producers, in walk order."""

    target: str
    root: str
    entries: list[Step | FileCheck] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        """Each manifest on the chain, once, in walk order."""
        return [e for e in self.entries if isinstance(e, Step) and not e.repeat]

    @property
    def files(self) -> list[FileCheck]:
        """Every file check, in walk order (a path may be checked against several manifests)."""
        return [e for e in self.entries if isinstance(e, FileCheck)]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def first_failure(self) -> FileCheck | None:
        """The first changed or missing file in walk order (target's chain first, depth-first)."""
        return next((f for f in self.files if not f.ok), None)

    def format(self) -> str:
        """A readable text tree: each step, then its outputs and inputs, inputs' producers indented below."""
        lines = [f"audit {self.target} (root {self.root})"]
        for e in self.entries:
            pad = "  " * e.depth
            if isinstance(e, Step):
                code = "code unknown" if not e.commit else (
                    f"code {e.commit[:12]}" + {True: " (dirty)", False: " (clean)"}.get(e.dirty, " (dirty?)"))
                settings = " ".join(f"{k}={v}" for k, v in e.summary.items())
                again = "  [already audited above]" if e.repeat else ""
                lines.append(f"{pad}[{e.kind}] {e.manifest}  {code}  {settings}".rstrip() + again)
            else:
                mark = {"ok": "ok     ", "changed": "CHANGED", "missing": "MISSING"}[e.status]
                sha = e.recorded[:12] if e.ok else (
                    f"recorded {e.recorded[:12]} now {(e.actual or 'missing')[:12]}")
                src = "  (source: no producer manifest)" if e.source else ""
                label = e.path if e.name == e.path else f"{e.name}: {e.path}"
                lines.append(f"{pad}{mark} {e.role:<6} {label}  {sha}{src}")
        n_bad = sum(not f.ok for f in self.files)
        lines.append(f"{len(self.steps)} steps, {len(self.files)} file checks, "
                     + ("all ok" if not n_bad else f"{n_bad} failed"))
        return "\n".join(lines)


def _norm(path: str | os.PathLike, root: Path) -> str:
    """``path`` as a normalised posix path relative to ``root`` (absolute paths outside root stay absolute)."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(root.resolve())
        except ValueError:
            return posixpath.normpath(p.as_posix())
    return posixpath.normpath(p.as_posix())


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AuditError(f"manifest {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise AuditError(f"manifest {path} is not a JSON object")
    return data


def index_manifests(root: str | Path = ".") -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Read every ``manifest.json`` / ``*.manifest.json`` under root/data and root/results.

    Returns (manifests by relative path, manifest paths recording each normalised output path).
    Hidden paths (atomic-write temporaries) and RO-Crate exports (folders holding an
    ``ro-crate-metadata.json``: copies of the manifests, not producers) are skipped.
    """
    root = Path(root)
    manifests: dict[str, dict[str, Any]] = {}
    producers: dict[str, list[str]] = {}
    for top in SCAN_DIRS:
        if not (root / top).is_dir():
            continue
        crates = [c.parent for c in (root / top).rglob("ro-crate-metadata.json")]
        for p in sorted((root / top).rglob("*manifest.json")):
            rel = p.relative_to(root)
            if any(c in p.parents for c in crates):
                continue
            if not p.is_file() or any(part.startswith(".") for part in rel.parts[:-1]) or not (
                    p.name == MANIFEST or (p.name.endswith("." + MANIFEST) and len(p.name) > len(MANIFEST) + 1)):
                continue
            key = rel.as_posix()
            manifests[key] = m = _read_manifest(p)
            for rec in (m.get("outputs") or {}).values():
                producers.setdefault(_norm(rec["path"], root), []).append(key)
    return manifests, producers


def _producer(path: str, producers: dict[str, list[str]]) -> tuple[str, str] | None:
    """(manifest, recorded output path) for ``path``: an exact record, else the deepest recorded directory holding it."""
    candidates, probe = [path], path
    while (parent := posixpath.dirname(probe)) and parent != probe:
        candidates.append(parent)
        probe = parent
    for c in candidates:
        found = sorted(set(producers.get(c, ())))
        if len(found) > 1:
            raise AuditError(f"{c} is recorded as an output by several manifests: {', '.join(found)}")
        if found:
            return found[0], c
    return None


def audit(target: str | Path, root: str | Path = ".") -> AuditReport:
    """Check ``target`` and everything it was computed from against the recorded sha256.

    ``target`` is a table, figure or any recorded output (a file inside a recorded output
    directory counts), or a manifest itself; a relative path is taken relative to ``root``.
    Raises :class:`AuditError` when no manifest records the target or a manifest is not valid JSON.
    """
    root = Path(root)
    manifests, producers = index_manifests(root)
    tgt = _norm(target, root)
    report = AuditReport(target=tgt, root=str(root))
    hashes: dict[str, str | None] = {}
    visited: set[str] = set()

    def actual(path: str) -> str | None:
        if path not in hashes:
            try:
                hashes[path] = sha256_tree(root / path)
            except FileNotFoundError:
                hashes[path] = None
        return hashes[path]

    def check(rec: dict[str, Any], role: str, name: str, mkey: str, depth: int) -> FileCheck:
        path = _norm(rec["path"], root)
        fc = FileCheck(path, rec.get("sha256", ""), actual(path), role, name, mkey, depth)
        report.entries.append(fc)
        return fc

    def walk(mkey: str, needed: set[str] | None, depth: int) -> None:
        m = manifests[mkey]
        settings = m.get("settings") or {}
        summary = {k: settings[k] for k in SUMMARY_KEYS
                   if k in settings and isinstance(settings[k], (str, int, float, bool))}
        if "seed" in m and "seed" not in summary:
            summary["seed"] = m["seed"]
        code = m.get("code") or {}
        repeat = mkey in visited
        visited.add(mkey)
        report.entries.append(Step(mkey, str(m.get("kind", "?")), summary, code.get("git_commit"),
                                   code.get("dirty"), depth, repeat))
        for name, rec in (m.get("outputs") or {}).items():
            if needed is None or _norm(rec["path"], root) in needed:
                check(rec, "output", name, mkey, depth + 1)
        if repeat:
            return
        for name, rec in (m.get("inputs") or {}).items():
            fc = check(rec, "input", name, mkey, depth + 1)
            found = _producer(fc.path, producers)
            if found is None:
                fc.source = True
            else:
                walk(found[0], {found[1]}, depth + 2)

    if tgt in manifests:
        walk(tgt, None, 0)
    else:
        found = _producer(tgt, producers)
        if found is None:
            raise AuditError(f"no manifest records {tgt} as an output; was it produced by the pipeline? "
                             f"(searched {', '.join(str(root / d) for d in SCAN_DIRS)})")
        walk(found[0], {found[1]}, 0)
    return report
