"""The evidence a claim reads: only the files its rule declares (the claims rule's inputs), picked by the claim's
selectors, never found by globbing the results folder.

A claim's selectors (built from the config by :mod:`esrepro.planning.claim_plan`, passed in the step's spec) name runs by
kind:

- ``evals``: ``[task, split, model, method]``, every seed's ``eval/.../metrics.json`` (and ``responses.jsonl``
  beside it, the per-problem outcomes);
- ``kl``: ``[task, model, method]``, every seed's ``kl/.../kl.json`` (and ``samples.jsonl`` beside it);
- ``periodic``: ``[task, model, method]``, every seed's run ``manifest.json``, whose ``periodic_eval.jsonl`` beside
  it holds the test-accuracy curve against training samples;
- ``runs``: ``[task, model, method]``, every seed's run ``manifest.json`` (with ``log.jsonl``): the ESSA study;
- ``grids``: ``[task, model, method]``, every seed's ``selection.json`` of an RL method trained over a hyperparameter
  grid (its cells' logs beside the run, under ``grid/``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from esrepro.io import read_json, read_jsonl

PathLike = str | os.PathLike
KINDS = ("evals", "kl", "periodic", "runs", "grids")


def file_key(results: PathLike, path: PathLike) -> tuple[str, tuple] | None:
    """The kind and selector key of a declared input under ``results`` (None: a file no claim selects)."""
    root = Path(results).parts
    parts = Path(path).parts
    if parts[:len(root)] != root:
        return None
    rel = parts[len(root):]
    name = rel[-1] if rel else ""
    if len(rel) == 7 and rel[0] == "eval" and name == "metrics.json":
        _, task, model, method, _seed, split, _ = rel
        return "evals", (task, split, model, method)
    if len(rel) == 6 and rel[0] == "kl" and name == "kl.json":
        return "kl", tuple(rel[1:4])
    if len(rel) == 6 and rel[0] == "runs" and name == "manifest.json":
        return "runs", tuple(rel[1:4])
    if len(rel) == 6 and rel[0] == "runs" and name == "selection.json":
        return "grids", tuple(rel[1:4])
    return None


def pick(results: PathLike, inputs: Iterable[PathLike], selectors: Mapping[str, Sequence[Sequence[str]]]
         ) -> dict[str, list[str]]:
    """The declared ``inputs`` a claim's ``selectors`` name, by kind (a declared file that does not exist is a run
    not made: left out)."""
    wanted = {kind: {tuple(k) for k in selectors.get(kind, [])} for kind in KINDS}
    out: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for path in dict.fromkeys(map(str, inputs)):
        found = file_key(results, path)
        if found is None or not Path(path).is_file():
            continue
        kind, key = found
        if kind == "runs":
            for k in ("periodic", "runs"):
                if key in wanted[k]:
                    out[k].append(path)
        elif key in wanted[kind]:
            out[kind].append(path)
    return out


#: A run's seed folder (``seed<k>``) and how far above each declared file it lies.
SEED_DIR = re.compile(r"seed(\d+)")
SEED_DEPTH = {"metrics.json": 3, "kl.json": 2, "manifest.json": 2}


def file_seed(path: PathLike) -> tuple[str, str, int] | None:
    """(model, method, seed) of a declared file, from its run's seed folder (None: not a run's file)."""
    parts = Path(path).parts
    depth = SEED_DEPTH.get(parts[-1] if parts else "")
    if depth is None or len(parts) < depth + 2:
        return None
    found = SEED_DIR.fullmatch(parts[-depth])
    return (parts[-depth - 2], parts[-depth - 1], int(found.group(1))) if found else None


def arm_seeds(files: Mapping[str, Sequence[PathLike]]) -> dict[str, list[int]]:
    """The seed counts of a row's trained arms: per method, one count per model it ran on (the base model, never
    trained, is no arm)."""
    seeds: dict[tuple[str, str], set[int]] = {}
    for kind_files in files.values():
        for path in kind_files:
            found = file_seed(path)
            if found is not None and found[1] != "base":
                seeds.setdefault(found[:2], set()).add(found[2])
    out: dict[str, list[int]] = {}
    for (_, method), s in sorted(seeds.items()):
        out.setdefault(method, []).append(len(s))
    return out


class Evals:
    """Evaluations from ``metrics.json`` files: per (task, split, model, method) and seed, the accuracy (%) and each
    problem's correctness (``responses.jsonl`` beside it; absent files give no per-problem data)."""

    def __init__(self, metrics: Iterable[PathLike]) -> None:
        self.acc: dict[tuple, dict[int, float]] = {}
        self.n: dict[tuple, dict[int, int]] = {}
        self.problems: dict[tuple, dict[int, dict[Any, float]]] = {}
        self._pooled: dict[tuple, dict[str, float]] = {}
        #: every margin a rule computed: the margins figure's numbers
        self.margins: list[dict[str, Any]] = []
        for path in sorted(map(Path, metrics)):
            m = read_json(path)
            key = (m["task"], m["split"], m["model"], m["method"])
            seed = int(m["seed"])
            self.acc.setdefault(key, {})[seed] = 100.0 * float(m["accuracy"])
            responses = path.with_name("responses.jsonl")
            rows = read_jsonl(responses) if responses.is_file() else []
            if rows:
                self.problems.setdefault(key, {})[seed] = {str(r["id"]): float(bool(r["correct"])) for r in rows}
            n = m.get("n", len(rows) or None)
            if n:
                self.n.setdefault(key, {})[seed] = int(n)

    @classmethod
    def from_outcomes(cls, outcomes: Mapping[tuple[str, str, str, str], Mapping[int, Sequence[bool]]]) -> Evals:
        """Evaluations held in memory: per (task, split, model, method) and seed, each test problem's correctness
        in problem order (what ``responses.jsonl`` holds; the ids are the positions)."""
        evals = cls(())
        for key, by_seed in outcomes.items():
            for seed, right in by_seed.items():
                right = np.asarray(right, dtype=bool)
                evals.acc.setdefault(key, {})[int(seed)] = 100.0 * float(right.mean())
                evals.n.setdefault(key, {})[int(seed)] = int(right.size)
                evals.problems.setdefault(key, {})[int(seed)] = {str(i): float(c) for i, c in enumerate(right)}
        return evals

    def seeds(self, task: str, split: str, model: str, method: str) -> list[float]:
        return [v for _, v in sorted(self.acc.get((task, split, model, method), {}).items())]

    def mean(self, task: str, split: str, model: str, method: str) -> float:
        vals = self.seeds(task, split, model, method)
        return float(np.mean(vals)) if vals else math.nan

    def problems_count(self, task: str, split: str, model: str, method: str) -> int | None:
        """Test problems per seed (the smallest over seeds; None when unknown)."""
        counts = list(self.n.get((task, split, model, method), {}).values())
        return min(counts) if counts else None

    def per_problem(self, task: str, split: str, model: str, method: str) -> dict[str, float]:
        """Each problem's correctness averaged over the seeds that have per-problem results."""
        key = (task, split, model, method)
        if key not in self._pooled:
            by_seed = list(self.problems.get(key, {}).values())
            ids = set.intersection(*(set(p) for p in by_seed)) if by_seed else set()
            self._pooled[key] = {i: sum(p[i] for p in by_seed) / len(by_seed) for i in sorted(ids)}
        return self._pooled[key]

    def models(self, task: str, split: str, method: str) -> list[str]:
        return sorted({k[2] for k in self.acc if k[0] == task and k[1] == split and k[3] == method})


def load_conciseness(kl_files: Sequence[PathLike]) -> pd.DataFrame:
    """The conciseness runs of the declared ``kl.json`` files (:func:`esrepro.report.conciseness.load_kl`)."""
    from esrepro.report.conciseness import load_kl

    return load_kl(sorted(kl_files)) if kl_files else pd.DataFrame()


def load_periodic(manifests: Sequence[PathLike], split: str = "test") -> pd.DataFrame:
    """Mean test-accuracy curves over seeds (model, method, samples, accuracy, accuracy_std, seeds, n) from the
    ``periodic_eval.jsonl`` beside each declared run manifest (:func:`esrepro.report.sample_curves.curves_table`)."""
    from esrepro.report.sample_curves import curves_table, read_periodic_eval, run_key_from_path

    logs, sizes = {}, {}
    for manifest in sorted(map(Path, manifests)):
        path = manifest.with_name("periodic_eval.jsonl")
        if not path.is_file():
            continue
        rows = [r for r in read_periodic_eval(path) if r["split"] == split]
        if rows:
            key = run_key_from_path(path)
            logs[key] = rows
            sizes.setdefault((key[1], key[2]), []).extend(int(r["n"]) for r in rows if r.get("n"))
    if not logs:
        return pd.DataFrame(columns=["model", "method", "samples", "accuracy", "seeds", "n"])
    table = curves_table(logs)
    table["n"] = [min(sizes.get((m, meth), [0])) or math.nan
                  for m, meth in zip(table["model"], table["method"], strict=True)]
    return table


def load_essa(manifests: Sequence[PathLike]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ESSA study's runs and curves of the declared run manifests (:func:`esrepro.report.essa.load_runs`,
    ``load_curves``)."""
    from esrepro.report.essa import load_curves, load_runs

    dirs = [Path(m).parent for m in sorted(manifests)]
    if not dirs:
        return pd.DataFrame(), pd.DataFrame()
    return load_runs(dirs), load_curves(dirs)
