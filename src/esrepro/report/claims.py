"""The papers' claims, tested by a run: one row per claim with the paper's evidence, this run's, an interval and a
verdict computed by a stated rule (:mod:`esrepro.report.verdicts`).

Everything is read from a results folder, the files the other tables read: evaluations
(``eval/{task}/{model}/{method}/seed{s}/{split}/metrics.json`` and the per-problem ``responses.jsonl`` beside it),
the conciseness study's ``kl/{task}/.../kl.json`` and ``samples.jsonl``, training runs' ``periodic_eval.jsonl``
(sample curves), and the ESSA study's run folders (``manifest.json``, ``log.jsonl``). The papers' numbers come from
``config/published.yaml``. Claims and their rules (each rule in :func:`claim_rows`' helpers):

- ES v2 Table 1 / Sec. 4.1: ES improves every base model; ES beats every RL baseline, per model (margins, rule 2).
- ES v2 Fig. 7: ES reaches each RL method's best test accuracy with fewer training samples than that method needed
  to reach it (mean curves over seeds; holds when true for every model and RL method).
- ES v2 Sec. 4.2, Figs. 1 and 4b: every point of GRPO's reward-KL Pareto front is weakly dominated by an ES point
  (KL no higher, reward no lower).
- ES v2 Sec. 4.2: GRPO with a small beta (<= 0.01, the betas the paper marks) hacks the reward and ES does not: a run
  hacks when its share of sampled responses that are not words exceeds the base model's by more than the study's
  hacking margin (:func:`esrepro.report.conciseness.hacked_runs`, Table 2's marks); holds when every small-beta GRPO
  configuration has a hacking run and no ES run hacks.
- ES v2 Table 2 / Sec. 4.2: ES's reward varies less over seeds than GRPO's: GRPO's largest std over ES's smallest
  among the configurations above the reward cut-off (how 15.5 follows from the paper's rows), rule 3.
- ES v2 Fig. 2: ES is competitive with the RL checkpoints on math: the best ES checkpoint's mean accuracy over the
  math benchmarks is at least the weakest RL checkpoint's (rule 2 on that margin, stratified by benchmark).
- ES v2 Table 3: ES lifts Sudoku and ARC-AGI from near zero: the base model at or below 5% and ES's gain over it
  above 0 (rule 2).
- ESSA Fig. 8 / Sec. 5.4: ESSA reaches the study's target held-out accuracy in less training time than GRPO.
- ESSA Fig. 2 / Sec. 5.1: the time to the target falls with every added engine (GPU).
- ESSA Fig. 4: a moderate population is best: the largest population's best accuracy is no higher than a smaller
  one's, and the best is above the smallest's (three or more populations).
- ESSA Fig. 7: the largest LoRA rank reaches a lower best accuracy than a smaller rank (three or more ranks).
- ESSA Fig. 9: INT8 and INT4 reach at least BF16's best accuracy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from esrepro.io import read_json, read_jsonl, write_text
from esrepro.report import verdicts as V
from esrepro.report.verdicts import FAILS, HOLDS, UNTESTABLE, Outcome

PathLike = str | os.PathLike

COLUMNS = ("Claim", "Where", "Paper", "This run", "Uncertainty", "Rule on this run", "Verdict", "Reason")
#: Wall-clock evidence (ESSA's times to a target): measured seconds vary between runs of the same configuration, so
#: they, and a rule's outcome on them below the paper's scale, stay in this column (which `esrepro compare` leaves
#: out: its name says seconds).
WALL = "This run, wall seconds"
ES_PAPER, ESSA_PAPER = "ES v2", "ESSA"
RL_METHODS = ("ppo", "grpo8", "grpo30", "grpov", "drgrpov")
METHOD_LABELS = {"base": "Original", "ppo": "PPO-z", "grpo8": "GRPO-z (8)", "grpo30": "GRPO-z (30)",
                 "grpov": "GRPO-v", "drgrpov": "Dr.GRPO-v", "es": "ES", "esckpt2": "ES (ckpt 2)",
                 "esckpt3": "ES (ckpt 3)"}
#: GRPO's "small" KL penalties: the betas whose rows the ES paper marks as hacked (v2 Table 2, Sec. 4.2: 0 and 0.01).
SMALL_BETA = 0.01
#: "Near zero" for the puzzles' base models (v2 Table 3: 2.5% and 0.2%), in percent.
NEAR_ZERO = 5.0
PUZZLES = {"sudoku": ("puzzles_sudoku", "Sudoku"), "arc": ("puzzles_arc", "ARC-AGI")}
ESSA_REF, ESSA_GRPO = "essa_ref", "essa_grpo"


# --- loading -------------------------------------------------------------------------------------------------------
class Evals:
    """Every evaluation under ``results/eval``: per (task, split, model, method) and seed, the accuracy and each
    problem's correctness (``responses.jsonl``; absent files give no per-problem data)."""

    def __init__(self, results: PathLike) -> None:
        self.acc: dict[tuple, dict[int, float]] = {}
        self.problems: dict[tuple, dict[int, dict[Any, float]]] = {}
        self._pooled: dict[tuple, dict[str, float]] = {}
        #: every margin :func:`compare` computed: the claims figure's numbers
        self.margins: list[dict[str, Any]] = []
        for path in sorted(Path(results, "eval").glob("*/*/*/seed*/*/metrics.json")):
            m = read_json(path)
            key = (m["task"], m["split"], m["model"], m["method"])
            seed = int(m["seed"])
            self.acc.setdefault(key, {})[seed] = 100.0 * float(m["accuracy"])
            responses = path.with_name("responses.jsonl")
            if responses.is_file():
                self.problems.setdefault(key, {})[seed] = {
                    str(r["id"]): float(bool(r["correct"])) for r in read_jsonl(responses)}

    def seeds(self, task: str, split: str, model: str, method: str) -> list[float]:
        return [v for _, v in sorted(self.acc.get((task, split, model, method), {}).items())]

    def mean(self, task: str, split: str, model: str, method: str) -> float:
        vals = self.seeds(task, split, model, method)
        return float(np.mean(vals)) if vals else math.nan

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


def paired_differences(a: Mapping[str, float], b: Mapping[str, float]) -> np.ndarray:
    """Per-problem correctness of A minus B's on the problems both have."""
    ids = sorted(set(a) & set(b))
    return np.array([a[i] - b[i] for i in ids], dtype=float)


def compare(evals: Evals, strata: Sequence[tuple[str, str]], model_a: str, method_a: str, model_b: str,
            method_b: str, label: str) -> tuple[Outcome, str]:
    """Rule 2 on the margin A - B over test sets ``strata`` ((task, split) pairs): the outcome and the interval's
    text. Not testable when a side has no evaluation, or no per-problem results on a set."""
    for task, split in strata:
        for model, method in ((model_a, method_a), (model_b, method_b)):
            if not evals.seeds(task, split, model, method):
                return V.untestable(f"{label}: {METHOD_LABELS.get(method, method)} of {model} not evaluated on "
                                    f"{task}/{split}"), ""
    diffs = [paired_differences(evals.per_problem(t, s, model_a, method_a), evals.per_problem(t, s, model_b, method_b))
             for t, s in strata]
    if any(d.size == 0 for d in diffs):
        return V.untestable(f"{label}: no per-problem results (responses.jsonl) to pair"), ""
    boot = V.bootstrap_margin(diffs)
    seeds = None
    if len(strata) == 1:
        (t, s), = strata
        seeds = V.seed_interval(evals.seeds(t, s, model_a, method_a), evals.seeds(t, s, model_b, method_b))
    text = f"{boot.text()} (problems)" + (f"; {seeds.text()} (seeds)" if seeds else "")
    outcome = V.margin_outcome(label, boot, seeds)
    evals.margins.append({"comparison": label, "estimate": boot.estimate, "problems_lo": boot.lo,
                          "problems_hi": boot.hi, "seeds_lo": seeds.lo if seeds else math.nan,
                          "seeds_hi": seeds.hi if seeds else math.nan, "rule": outcome.verdict})
    return outcome, text


def _fmt(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _tables(published: Mapping[str, Any]) -> Mapping[str, Any]:
    return (published or {}).get("tables", {}) or {}


def _row(claim: str, where: str, paper: str, ours: str, uncertainty: str, outcome: Outcome,
         wall: str = "") -> dict[str, Any]:
    return {"Claim": claim, "Where": where, "Paper": paper, "This run": ours, "Uncertainty": uncertainty,
            "outcome": outcome, WALL: wall}


# --- ES paper: Table 1 --------------------------------------------------------------------------------------------
def table1_claims(evals: Evals, published: Mapping[str, Any], display: Mapping[str, str], task: str = "countdown",
                  split: str = "test") -> list[dict[str, Any]]:
    """ES improves every base model (one row), and ES beats every RL baseline (one row per model run with ES)."""
    paper = (_tables(published).get("table1_countdown", {}) or {}).get("models", {}) or {}
    name = lambda m: display.get(m, m)  # noqa: E731
    models = evals.models(task, split, "es")
    where = "ES v2 Table 1, Sec. 4.1"
    # ES over the base model
    cases, ours, unc = [], [], []
    for m in models:
        out, text = compare(evals, [(task, split)], m, "es", m, "base", f"ES - Original on {name(m)}")
        cases.append((name(m), out))
        ours.append(f"{name(m)}: {_fmt(evals.mean(task, split, m, 'base'))} -> "
                    f"{_fmt(evals.mean(task, split, m, 'es'))}")
        unc.append(f"{name(m)}: {text}" if text else "")
    paper_text = "; ".join(f"{name(m)} {v.get('base')} -> {v.get('es')}" for m, v in paper.items()
                           if v.get("base") is not None and v.get("es") is not None)
    rows = [_row("ES improves every base model", where, paper_text or "not in published.yaml",
                 "; ".join(ours) or "no ES evaluation", "; ".join(u for u in unc if u),
                 V.combine(cases) if cases else V.untestable(f"no ES evaluation on {task}/{split}"))]
    # ES over each RL baseline, per model
    for m in models or list(paper)[:0]:
        cases, ours, unc = [], [f"ES {_fmt(evals.mean(task, split, m, 'es'))}"], []
        for rl in RL_METHODS:
            label = f"ES - {METHOD_LABELS[rl]} on {name(m)}"
            if not evals.seeds(task, split, m, rl):
                cases.append((METHOD_LABELS[rl], V.untestable(f"{METHOD_LABELS[rl]} not run")))
                continue
            out, text = compare(evals, [(task, split)], m, "es", m, rl, label)
            cases.append((METHOD_LABELS[rl], out))
            ours.append(f"{METHOD_LABELS[rl]} {_fmt(evals.mean(task, split, m, rl))}")
            unc.append(f"{label}: {text}")
        p = paper.get(m) or {}
        rl_paper = {k: p[k] for k in RL_METHODS if p.get(k) is not None}
        if p.get("es") is not None and rl_paper:
            best = max(rl_paper, key=rl_paper.get)
            paper_text = (f"ES {p['es']}; best RL {METHOD_LABELS[best]} {rl_paper[best]} "
                          f"(margin {p['es'] - rl_paper[best]:+.1f})")
        else:
            paper_text = f"{name(m)} not in the paper's Table 1"
        outcome = V.combine(cases)
        if outcome.verdict == FAILS:
            outcome = Outcome(FAILS, f"{name(m)}: {outcome.reason}")
        rows.append(_row(f"ES beats every RL baseline: {name(m)}", where, paper_text, ", ".join(ours),
                         "; ".join(unc), outcome))
    return rows


# --- ES paper: Fig. 7, sample efficiency ----------------------------------------------------------------------------
def load_periodic(results: PathLike, task: str, split: str = "test") -> pd.DataFrame:
    """Mean sample curves over seeds of ``task``'s runs: the numbers the sample-curves figure plots
    (``figures/sample_curves_{task}.csv``) where it exists, else :func:`esrepro.report.sample_curves.curves_table` of
    the runs' ``periodic_eval.jsonl``."""
    from esrepro.report.sample_curves import curves_table, read_periodic_eval, run_key_from_path

    plotted = Path(results, "figures", f"sample_curves_{task}.csv")
    if plotted.is_file():
        return pd.read_csv(plotted)
    logs = {}
    for path in sorted(Path(results, "runs", task).glob("*/*/seed*/periodic_eval.jsonl")):
        rows = [r for r in read_periodic_eval(path) if r["split"] == split]
        if rows:
            logs[run_key_from_path(path)] = rows
    return curves_table(logs) if logs else pd.DataFrame(columns=["model", "method", "samples", "accuracy", "seeds"])


def first_reaching(curve: pd.DataFrame, level: float) -> float | None:
    """Samples at the first point of a (samples, accuracy) curve at or above ``level`` (None: never)."""
    hit = curve[curve["accuracy"] >= level - 1e-9].sort_values("samples")
    return None if hit.empty else float(hit["samples"].iloc[0])


def sample_efficiency_claim(curves: pd.DataFrame, display: Mapping[str, str]) -> dict[str, Any]:
    """ES reaches each RL method's best accuracy with fewer samples than that method needed to reach it."""
    cases, ours = [], []
    for model in sorted(set(curves[curves["method"] == "es"]["model"])):
        es = curves[(curves["model"] == model) & (curves["method"] == "es")]
        for rl in RL_METHODS:
            c = curves[(curves["model"] == model) & (curves["method"] == rl)]
            key = f"{display.get(model, model)} {METHOD_LABELS[rl]}"
            if c.empty:
                continue
            best = float(c["accuracy"].max())
            s_rl = first_reaching(c, best)
            s_es = first_reaching(es, best)
            if s_rl is not None and s_rl <= float(c["samples"].min()):
                ours.append(f"{key}: best {best:.1f} at its start")
                cases.append((key, V.untestable(f"{key} never improves on its start ({best:.1f})")))
                continue
            ours.append(f"{key}: best {best:.1f} at {s_rl:g} samples, ES " +
                        (f"at {s_es:g}" if s_es is not None else "never"))
            if s_es is not None and s_es < s_rl:
                cases.append((key, Outcome(HOLDS, "fewer samples")))
            elif s_es is None:
                cases.append((key, Outcome(FAILS, f"ES never reaches {best:.1f}")))
            else:
                cases.append((key, Outcome(FAILS, f"ES needs {s_es:g} samples, the RL method {s_rl:g}")))
    outcome = V.combine(cases) if cases else V.untestable("no sample curves of ES and an RL method "
                                                          "(periodic evaluation not run)")
    seeds = sorted(set(int(s) for s in curves.get("seeds", pd.Series(dtype=int)).dropna()))
    return _row("ES needs fewer training samples than RL to reach RL's best accuracy",
                "ES v2 Fig. 7 (v1 Sec. 4.1, Fig. 6)",
                "stated in the text (v1: under 20% of RL's samples in most cases); the curves' numbers are not "
                "published", "; ".join(ours) or "no curves",
                f"mean curves over seeds ({', '.join(map(str, seeds)) or 'none'} seeds per method); no interval",
                outcome)


# --- ES paper: conciseness (Sec. 4.2, Table 2, Figs. 1 and 4b) ---------------------------------------------------
def load_conciseness(results: PathLike, task: str = "conciseness") -> pd.DataFrame:
    from esrepro.report.conciseness import load_kl

    paths = sorted(Path(results, "kl", task).glob("*/*/seed*/kl.json"))
    return load_kl(paths) if paths else pd.DataFrame()


def dominated_share(es: Sequence[tuple[float, float]], front: Sequence[tuple[float, float]]) -> float:
    """Share of ``front`` points (kl, reward) weakly dominated by an ``es`` point (KL no higher, reward no lower)."""
    if not front:
        return math.nan
    hit = sum(any(k <= fk + 1e-12 and r >= fr - 1e-12 for k, r in es) for fk, fr in front)
    return hit / len(front)


def pareto_outcome(es: Sequence[tuple[float, float]], grpo: Sequence[tuple[float, float]]) -> tuple[Outcome, str]:
    from esrepro.report.conciseness import pareto_front

    if not es or not grpo:
        return V.untestable("ES or GRPO not run in the conciseness study"), ""
    idx = pareto_front([k for k, _ in grpo], [r for _, r in grpo])
    front = [grpo[i] for i in idx]
    share = dominated_share(es, front)
    text = f"{share:.0%} of GRPO's {len(front)} front points dominated by an ES point"
    return (Outcome(HOLDS, text) if share == 1.0 else Outcome(FAILS, text)), text


def conciseness_claims(runs: pd.DataFrame, published: Mapping[str, Any], reward_cutoff: float | None,
                       hacking_margin: float) -> list[dict[str, Any]]:
    from esrepro.report.conciseness import checkpoint_points, hacked_runs, paper_rows

    prow = paper_rows(published)
    block = _tables(published).get("table2_conciseness", {}) or {}
    rows = []
    # Pareto dominance
    p_es = [(r["kl"], r["reward"]) for r in prow if r["algorithm"] == "es"]
    p_grpo = [(r["kl"], r["reward"]) for r in prow if r["algorithm"] == "grpo"]
    p_out, p_text = pareto_outcome(p_es, p_grpo)
    if runs.empty:
        outcome, ours = V.untestable("the conciseness study was not run"), "not run"
    else:
        # each configuration's kept checkpoints, KL and reward averaged over its seeds per iteration
        pts = checkpoint_points(runs).groupby(["algorithm", "method", "iteration"], as_index=False)[
            ["kl", "reward"]].mean()
        es = list(zip(pts[pts["algorithm"] == "es"]["kl"], pts[pts["algorithm"] == "es"]["reward"]))
        grpo = list(zip(pts[pts["algorithm"] == "grpo"]["kl"], pts[pts["algorithm"] == "grpo"]["reward"]))
        outcome, ours = pareto_outcome(es, grpo)
        ours = (f"{len(es)} ES and {len(grpo)} GRPO points (a configuration's checkpoint, mean over seeds); {ours}"
                if ours else "ES or GRPO not run")
    rows.append(_row("ES's reward-KL Pareto front dominates GRPO's", "ES v2 Sec. 4.2, Figs. 1 and 4b",
                     f"Table 2 rows (mean over 4 seeds): {p_text} ({p_out.verdict} by the same rule)" if p_text
                     else "not in published.yaml",
                     ours,
                     "means over seeds of each checkpoint's estimates (reward: sampled responses; KL k3); no interval",
                     outcome))
    # Reward hacking
    paper_text = ("hacked (marked *): " + ", ".join(f"GRPO beta {r['beta']:g}" for r in prow
                                                    if r.get("hacked")) or "none") if prow else "not in published.yaml"
    if prow:
        paper_text += "; ES rows unmarked" if not any(r.get("hacked") for r in prow if r["algorithm"] == "es") \
            else "; an ES row marked"
    if runs.empty:
        outcome, ours = V.untestable("the conciseness study was not run"), "not run"
    else:
        runs = runs.assign(hacked=hacked_runs(runs, hacking_margin))
        base = runs[runs["algorithm"] == "base"]["nonword"]
        small = runs[(runs["algorithm"] == "grpo") & (runs["beta"].astype(float) <= SMALL_BETA)]
        es = runs[runs["algorithm"] == "es"]
        ours = (f"non-word share: base {_fmt(float(base.mean()), 3) if len(base) else 'n/a'}; " +
                "; ".join(f"{m} {float(g['nonword'].mean()):.3f} (hacked {int(g['hacked'].sum())}/{len(g)})"
                          for m, g in pd.concat([small, es]).groupby("method", sort=True)))
        if base.empty or base.isna().all():
            outcome = V.untestable("no base-model samples to compare the non-word share with")
        elif small.empty or es.empty:
            outcome = V.untestable("no GRPO run with beta <= 0.01" if small.empty else "no ES run")
        else:
            not_hacking = [m for m, g in small.groupby("method") if not g["hacked"].any()]
            es_hacking = sorted(set(es[es["hacked"]]["method"]))
            if not not_hacking and not es_hacking:
                outcome = Outcome(HOLDS, "every small-beta GRPO configuration has a hacking run; no ES run hacks")
            else:
                outcome = Outcome(FAILS, "; ".join(
                    ([f"no hacking run: {', '.join(not_hacking)}"] if not_hacking else []) +
                    ([f"ES hacks: {', '.join(es_hacking)}"] if es_hacking else [])))
    rows.append(_row("GRPO with small beta hacks the reward; ES does not", "ES v2 Sec. 4.2, Table 2",
                     paper_text, ours,
                     f"rule: non-word share above the base model's by more than {hacking_margin:g} "
                     "(Table 2's hacking mark); per run, no interval", outcome))
    # Run-to-run stability
    stated = block.get("std_ratio")
    p_es_rows = [r for r in prow if r["algorithm"] == "es"]
    p_grpo_rows = [r for r in prow if r["algorithm"] == "grpo"]
    paper_text = "not in published.yaml"
    if p_es_rows and p_grpo_rows:
        g = max(p_grpo_rows, key=lambda r: r["reward_std"])
        e = min(p_es_rows, key=lambda r: r["reward_std"])
        iv = V.std_ratio_interval(g["reward_std"], 4, e["reward_std"], 4)
        paper_text = (f"stated {stated}x; GRPO max std {g['reward_std']} / ES min std {e['reward_std']}"
                      + (f" = {iv.estimate:.1f}x [{iv.lo:.1f}, {iv.hi:.1f}] (4 seeds each)" if iv else ""))
    if runs.empty:
        outcome, ours, unc = V.untestable("the conciseness study was not run"), "not run", ""
    else:
        per = []
        for (algo, method), g in runs[runs["algorithm"].isin(["es", "grpo"])].groupby(["algorithm", "method"]):
            r = g["reward_norm"].astype(float)
            per.append({"algo": algo, "method": method, "mean": float(r.mean()), "n": len(r),
                        "std": float(r.std()) if len(r) > 1 else math.nan})
        kept = [p for p in per if reward_cutoff is None or p["mean"] > reward_cutoff]
        es_k = [p for p in kept if p["algo"] == "es" and p["n"] > 1]
        gr_k = [p for p in kept if p["algo"] == "grpo" and p["n"] > 1]
        ours = "; ".join(f"{p['method']} std {_fmt(p['std'], 3)} ({p['n']} seeds, mean {p['mean']:.3f})"
                         for p in per)
        unc = ""
        if any(p["n"] < 2 for p in per) and not (es_k and gr_k):
            outcome = V.untestable("fewer than 2 seeds per configuration")
        elif not (es_k and gr_k):
            outcome = V.untestable(f"no ES or no GRPO configuration above the reward cut-off {reward_cutoff}")
        else:
            g = max(gr_k, key=lambda p: p["std"])
            e = min(es_k, key=lambda p: p["std"])
            iv = V.std_ratio_interval(g["std"], g["n"], e["std"], e["n"])
            if iv is None:
                outcome = V.untestable("ES's smallest std is 0: no ratio")
            else:
                outcome = V.ratio_outcome(f"GRPO {g['method']} std / ES {e['method']} std", iv)
                unc = f"{iv.estimate:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}] ({iv.method})"
    rows.append(_row("ES's reward varies less over seeds than GRPO's", "ES v2 Table 2, Sec. 4.2", paper_text, ours,
                     unc or "F interval of the std ratio (needs 2+ seeds)", outcome))
    return rows


# --- ES paper: math (Fig. 2) and puzzles (Table 3) --------------------------------------------------------------
def math_claim(evals: Evals, published: Mapping[str, Any], display: Mapping[str, str]) -> dict[str, Any]:
    block = _tables(published).get("math_v2", {}) or {}
    bars = (block.get("figure") or {}).get("bars", []) or []
    benches = list(block.get("benchmarks", []) or [])
    rl = [(b["model"], b.get("method", "base"), b["label"]) for b in bars if b.get("model")]
    es_methods = [b["method"] for b in bars if not b.get("model") and b.get("method") != "base"]
    es_models = sorted({k[2] for k in evals.acc if k[0] in benches and k[3] in es_methods})
    paper = ("bars not assigned to models (only their sorted values survive, config/published.yaml math_v2): "
             "the figure's numbers do not decide it")
    if not benches or not bars:
        return _row("ES is competitive with the RL checkpoints on math", "ES v2 Fig. 2, Sec. 4.3", paper,
                    "not run", "", V.untestable("no math benchmarks in published.yaml"))
    sets = [(b, "test") for b in benches]

    def avg(model: str, method: str) -> float:
        vals = [evals.mean(b, "test", model, method) for b in benches]
        return float(np.mean(vals)) if not any(math.isnan(v) for v in vals) else math.nan

    ran_rl = [(m, meth, lab) for m, meth, lab in rl if not math.isnan(avg(m, meth))]
    ran_es = [(m, meth) for m in es_models for meth in es_methods if not math.isnan(avg(m, meth))]
    if not ran_es or not ran_rl:
        missing = "the RL checkpoints not evaluated" if not ran_rl else "no ES checkpoint evaluated on every benchmark"
        ours = "; ".join(f"{display.get(m, m)} {METHOD_LABELS.get(meth, meth)} {avg(m, meth):.1f}"
                         for m, meth in ran_es)
        return _row("ES is competitive with the RL checkpoints on math", "ES v2 Fig. 2, Sec. 4.3", paper,
                    (f"mean over {len(benches)} benchmarks: {ours}" if ours else "not run"), "",
                    V.untestable(missing))
    best_es = max(ran_es, key=lambda x: avg(*x))
    weak_rl = min(ran_rl, key=lambda x: avg(x[0], x[1]))
    out, text = compare(evals, sets, best_es[0], best_es[1], weak_rl[0], weak_rl[1],
                        f"best ES checkpoint - weakest RL checkpoint ({weak_rl[2]})")
    ours = "; ".join([f"{METHOD_LABELS.get(m, m)} {avg(best_es[0], m):.1f}" for _, m in ran_es] +
                     [f"{lab} {avg(m, meth):.1f}" for m, meth, lab in ran_rl])
    return _row("ES is competitive with the RL checkpoints on math", "ES v2 Fig. 2, Sec. 4.3", paper,
                f"mean over {len(benches)} benchmarks: {ours}", text + " (stratified by benchmark)", out)


def puzzle_claims(evals: Evals, published: Mapping[str, Any], display: Mapping[str, str]) -> list[dict[str, Any]]:
    rows = []
    for task, (key, label) in PUZZLES.items():
        block = _tables(published).get(key, {}) or {}
        paper = "; ".join(f"{display.get(m, m)} {v.get('base')} -> {v.get('es')}"
                          for m, v in (block.get("models") or {}).items()) or "not in published.yaml"
        cases, ours, unc = [], [], []
        for m in evals.models(task, "test", "es"):
            base = evals.mean(task, "test", m, "base")
            ours.append(f"{display.get(m, m)} {_fmt(base)} -> {_fmt(evals.mean(task, 'test', m, 'es'))}")
            out, text = compare(evals, [(task, "test")], m, "es", m, "base",
                                f"ES - Original on {display.get(m, m)}, {label}")
            unc.append(text)
            if out.verdict != UNTESTABLE and base > NEAR_ZERO:
                out = Outcome(FAILS, f"the base model is not near zero ({base:.1f}% > {NEAR_ZERO:g}%)")
            cases.append((display.get(m, m), out))
        outcome = V.combine(cases) if cases else V.untestable(f"no ES run on {label}")
        rows.append(_row(f"ES lifts {label} from near zero", "ES v2 Table 3 (App. A.8, A.9)", paper,
                         "; ".join(ours) or "not run", "; ".join(u for u in unc if u), outcome))
    return rows


# --- ESSA ------------------------------------------------------------------------------------------------------------
def load_essa(results: PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ESSA study's runs and curves (:func:`esrepro.report.essa.load_runs`, ``load_curves``): every run folder
    whose manifest records an ESSA run or its GRPO baseline, with its evaluation where there is one."""
    from esrepro.report.essa import load_curves, load_runs

    dirs = []
    for m in sorted(Path(results, "runs").glob("*/*/*/seed*/manifest.json")):
        man = read_json(m)
        if "essa" in man or "essa_baseline" in man:
            dirs.append(m.parent)
    metrics = sorted(str(p) for p in Path(results, "eval").glob("*/*/*/seed*/*/metrics.json"))
    if not dirs:
        return pd.DataFrame(), pd.DataFrame()
    return load_runs(dirs, metrics), load_curves(dirs)


def heldout_time(runs: pd.DataFrame, curves: pd.DataFrame, target: float) -> float | None:
    """Training seconds at which the held-out accuracy (mean over the runs' seeds, per logged iteration) first
    reaches ``target`` (None: never)."""
    c = curves[curves["run_dir"].isin(runs["run_dir"]) & curves["val_reward"].notna()]
    if c.empty:
        return None
    mean = c.groupby("iteration")[["elapsed_seconds", "val_reward"]].mean().sort_index()
    hit = mean[mean["val_reward"] >= target - 1e-12]
    return None if hit.empty else float(hit["elapsed_seconds"].iloc[0])


def _same(a: Any, b: Any) -> bool:
    """Two settings are the same (missing equals missing; 8 equals 8.0)."""
    if pd.isna(a) or pd.isna(b):
        return bool(pd.isna(a) and pd.isna(b))
    return str(a) == str(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b))


def _sweep(runs: pd.DataFrame, setting: str) -> pd.DataFrame:
    """The reference run and the ESSA runs that differ from it only in ``setting`` (same task and model)."""
    if runs.empty or not (runs["method"] == ESSA_REF).any():
        return pd.DataFrame()
    keys = [k for k in ("population", "rank", "engines", "precision", "problems_per_generation", "covariance")
            if k != setting]
    out = []
    for _, ref in runs[runs["method"] == ESSA_REF].drop_duplicates(["task", "model"]).iterrows():
        same = runs[(runs["algorithm"] == "essa") & (runs["task"] == ref["task"]) & (runs["model"] == ref["model"])]
        for k in keys:
            same = same[[_same(v, ref[k]) for v in same[k]]]
        out.append(same)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _essa_paper(published: Mapping[str, Any], where: str) -> str:
    texts = [c["text"] for b in ("essa_gsm8k",) for c in ((_tables(published).get(b) or {}).get("claims") or [])
             if where in c.get("where", "")]
    return "; ".join(texts) or "stated in the text; no number in published.yaml"


def essa_claims(runs: pd.DataFrame, curves: pd.DataFrame, published: Mapping[str, Any], target: float | None,
                display: Mapping[str, str]) -> list[dict[str, Any]]:
    rows = []
    empty = runs.empty
    # Fig. 8: ESSA against GRPO in wall-clock time
    cases, ours = [], []
    if not empty and target is not None:
        pairs = runs[runs["method"] == ESSA_REF][["task", "model"]].drop_duplicates().itertuples(index=False)
        for task, model in sorted(pairs):
            sub = runs[(runs["task"] == task) & (runs["model"] == model)]
            essa, grpo = sub[sub["method"] == ESSA_REF], sub[sub["method"] == ESSA_GRPO]
            name = f"{display.get(model, model)} on {task}"
            if essa.empty or grpo.empty:
                cases.append((name, V.untestable("ESSA reference or GRPO baseline not run")))
                continue
            t_e, t_g = heldout_time(essa, curves, target), heldout_time(grpo, curves, target)
            ours.append(f"{name}: to {target:g}, ESSA " + (f"{t_e:.0f} s" if t_e is not None else "never") +
                        ", GRPO " + (f"{t_g:.0f} s" if t_g is not None else "never"))
            if t_e is None:
                cases.append((name, Outcome(FAILS, "ESSA does not reach the target") if t_g is not None else
                               V.untestable(f"neither reaches {target:g}")))
            else:
                cases.append((name, Outcome(HOLDS, "sooner") if t_g is None or t_e < t_g
                              else Outcome(FAILS, f"ESSA {t_e:.0f} s, GRPO {t_g:.0f} s")))
    outcome = V.combine(cases) if cases else V.untestable("the ESSA study (reference and GRPO baseline) not run")
    rows.append(_row("ESSA reaches the target accuracy sooner than GRPO (wall clock)", "ESSA Fig. 8, Sec. 5.4",
                     _essa_paper(published, "Fig. 8"),
                     f"training seconds to held-out accuracy {target:g}: in '{WALL}'" if ours else "not run",
                     "held-out accuracy's mean curve over seeds; training seconds as logged; no interval", outcome,
                     wall="; ".join(ours)))
    # Fig. 2: time to target against engines
    sw = _sweep(runs, "engines")
    cases, ours = [], []
    if not sw.empty and target is not None:
        for (task, model), g in sw.groupby(["task", "model"]):
            times = {int(e): heldout_time(gg, curves, target) for e, gg in g.groupby("engines")}
            name = f"{display.get(model, model)} on {task}"
            ours.append(f"{name}: " + ", ".join(f"{e} engines " + (f"{t:.1f} s" if t is not None else "never")
                                                for e, t in sorted(times.items())))
            reached = [(e, t) for e, t in sorted(times.items()) if t is not None]
            if len(times) < 2:
                cases.append((name, V.untestable("one engine count")))
            elif len(reached) < 2:
                cases.append((name, V.untestable(f"fewer than two engine counts reach {target:g}")))
            elif all(b[1] < a[1] for a, b in zip(reached, reached[1:])) and len(reached) == len(times):
                cases.append((name, Outcome(HOLDS, "falls with every added engine count")))
            else:
                cases.append((name, Outcome(FAILS, "does not fall with every added engine count")))
    outcome = V.combine(cases) if cases else V.untestable("no engine sweep run")
    rows.append(_row("ESSA's time to the target falls as engines (GPUs) are added", "ESSA Fig. 2, Sec. 5.1",
                     _essa_paper(published, "Sec. 5.1"),
                     f"training seconds to held-out accuracy {target:g} per engine count: in '{WALL}'" if ours
                     else "not run", "held-out accuracy's mean curve over seeds; no interval", outcome,
                     wall="; ".join(ours)))
    # Figs. 4 and 7: population and rank
    for setting, fig, claim, rule in (
            ("population", "ESSA Fig. 4, Sec. 5.2", "A moderate ESSA population is best (larger gives no gain)",
             "moderate"),
            ("rank", "ESSA Fig. 7, Sec. 5.3", "ESSA's largest LoRA rank reaches a lower accuracy than a smaller rank",
             "largest_lower")):
        sw = _sweep(runs, setting)
        cases, ours = [], []
        if not sw.empty:
            for (task, model), g in sw.groupby(["task", "model"]):
                best = g.groupby(setting)["val_max"].mean().sort_index()
                name = f"{display.get(model, model)} on {task}"
                ours.append(f"{name}: best held-out " + ", ".join(f"{setting} {int(k)}: {v:.3f}"
                                                                   for k, v in best.items()))
                if len(best) < 3:
                    cases.append((name, V.untestable(f"{len(best)} {setting} value(s); the claim needs small, "
                                                     "moderate and large")))
                    continue
                vals = list(best.values)
                if rule == "moderate":
                    ok = vals[-1] <= max(vals[:-1]) and max(vals) > vals[0]
                else:
                    ok = vals[-1] < max(vals[:-1])
                cases.append((name, Outcome(HOLDS if ok else FAILS,
                                            f"best at {setting} {int(best.idxmax())}, largest {vals[-1]:.3f}")))
        outcome = V.combine(cases) if cases else V.untestable(f"no {setting} sweep run")
        rows.append(_row(claim, fig, "stated in the text and caption; no number in published.yaml",
                         "; ".join(ours) or "not run", "best held-out accuracy, mean over seeds; no interval",
                         outcome))
    # Fig. 9: precision
    sw = _sweep(runs, "precision")
    cases, ours = [], []
    if not sw.empty:
        for (task, model), g in sw.groupby(["task", "model"]):
            best = g.groupby("precision")["val_max"].mean()
            name = f"{display.get(model, model)} on {task}"
            ours.append(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in best.items()))
            quant = [k for k in ("int8", "int4") if k in best]
            if "native" not in best or not quant:
                cases.append((name, V.untestable("BF16 and a quantised precision are not both run")))
                continue
            low = [k for k in quant if best[k] < best["native"]]
            cases.append((name, Outcome(FAILS, f"{', '.join(low)} below BF16") if low
                          else Outcome(HOLDS, f"{', '.join(quant)} at or above BF16")))
    outcome = V.combine(cases) if cases else V.untestable("no INT8 or INT4 run (the quantised engines need a CUDA "
                                                          "GPU)")
    rows.append(_row("ESSA with INT8 and INT4 inference does at least as well as BF16", "ESSA Fig. 9, Sec. 5.5",
                     "stated in the text; no number in published.yaml", "; ".join(ours) or "not run",
                     "best held-out accuracy, mean over seeds; no interval", outcome))
    return rows


# --- the table -----------------------------------------------------------------------------------------------------
def claim_rows(results: PathLike, published: Mapping[str, Any], display: Mapping[str, str], *,
               task: str = "countdown", split: str = "test", conciseness_task: str = "conciseness",
               reward_cutoff: float | None = None, hacking_margin: float = 0.2,
               essa_target: float | None = None, margins_out: list | None = None) -> list[dict[str, Any]]:
    """Every claim's row (with its rule's :class:`Outcome` under ``outcome``), from the results folder; every margin
    computed is appended to ``margins_out`` when given (the figure's numbers)."""
    evals = Evals(results)
    rows = table1_claims(evals, published, display, task, split)
    margins = evals.margins
    rows.append(sample_efficiency_claim(load_periodic(results, task, split), display))
    rows += conciseness_claims(load_conciseness(results, conciseness_task), published, reward_cutoff,
                               hacking_margin)
    rows.append(math_claim(evals, published, display))
    rows += puzzle_claims(evals, published, display)
    runs, curves = load_essa(results)
    rows += essa_claims(runs, curves, published, essa_target, display)
    if margins_out is not None:
        margins_out.extend(margins)
    return rows


def claims_table(rows: Sequence[Mapping[str, Any]], scale: str) -> pd.DataFrame:
    """The rows with the scale gate applied (:func:`esrepro.report.verdicts.gate`): Verdict, Reason and the rule's
    outcome on this run's numbers."""
    records = []
    for r in rows:
        wall = r.get(WALL, "")
        outcome = r["outcome"]
        if wall and scale != "paper" and outcome.verdict != UNTESTABLE:
            # a rule on measured seconds: its outcome moves with the machine, so it stays beside the seconds
            wall = f"{wall}; the rule on these times: {outcome.verdict} ({outcome.reason})"
            why = V.SCALE_REASONS.get(scale, f"scale {scale!r} is not the paper's")
            final = Outcome(UNTESTABLE, f"{why}; the rule's outcome on this run's wall-clock times: in '{WALL}'")
            measured = f"in '{WALL}'"
        else:
            final, measured = V.gate(outcome, scale)
        records.append({**{k: r[k] for k in COLUMNS[:5]}, "Rule on this run": measured, "Verdict": final.verdict,
                        "Reason": final.reason, WALL: wall})
    return pd.DataFrame(records, columns=[*COLUMNS, WALL])


def movement_note(results: PathLike, task: str = "countdown", split: str = "test") -> str | None:
    """Whether ES training moved this run's numbers beyond the spread between seeds: ES's test accuracy against
    the base model's and its std over seeds, and the training reward's change from the first to the last iteration
    of each seed against the spread of the first iteration's reward over seeds."""
    evals = Evals(results)
    parts = []
    for model in evals.models(task, split, "es"):
        es = evals.seeds(task, split, model, "es")
        base = evals.mean(task, split, model, "base")
        sd = float(np.std(es, ddof=1)) if len(es) > 1 else math.nan
        parts.append(f"{model}: test accuracy {_fmt(base)} (base) -> {_fmt(float(np.mean(es)))} (ES, "
                     f"{len(es)} seeds, std {_fmt(sd)})")
        first, last = [], []
        for log in sorted(Path(results, "runs", task, model, "es").glob("seed*/log.jsonl")):
            rec = read_jsonl(log)
            if rec:
                first.append(float(rec[0]["reward_mean"]))
                last.append(float(rec[-1]["reward_mean"]))
        if first:
            change = [b - a for a, b in zip(first, last)]
            spread = float(np.std(first, ddof=1)) if len(first) > 1 else math.nan
            parts.append(f"population mean training reward, first -> last iteration: "
                         + ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(first, last))
                         + f" (change {np.mean(change):+.3f}; spread over seeds at the start {_fmt(spread, 3)})")
    if not parts:
        return None
    return "Does ES training move this run's Countdown numbers? " + "; ".join(parts) + "."


def margins_figure(margins: pd.DataFrame, out_stem: PathLike, scale: str) -> list[Path]:
    """Every margin the claims compute (accuracy points, A - B): the estimate, its bootstrap interval over test
    problems (thick) and its interval over seeds where there is one (thin), a line at 0; ``{out_stem}.png``, ``.pdf``
    and the plotted numbers as ``.csv``."""
    from matplotlib.figure import Figure

    from esrepro.report.figures import save_figure, write_frame_csv

    n = max(1, len(margins))
    height = 1.5 + 0.32 * n
    fig = Figure(figsize=(10.0, height))
    ax = fig.add_subplot(1, 1, 1)
    colors = {HOLDS: "C2", FAILS: "C3"}
    for i, r in enumerate(margins.itertuples(index=False)):
        y = n - 1 - i
        if not math.isnan(r.seeds_lo):
            ax.plot([r.seeds_lo, r.seeds_hi], [y, y], color="grey", linewidth=1)
        ax.plot([r.problems_lo, r.problems_hi], [y, y], color=colors.get(r.rule, "C0"), linewidth=3)
        ax.plot([r.estimate], [y], marker="o", color="black", markersize=4)
    ax.axvline(0.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_yticks([n - 1 - i for i in range(len(margins))])
    ax.set_yticklabels(list(margins["comparison"]), fontsize=7)
    ax.set_xlabel("margin (accuracy points), 95% intervals: bootstrap over test problems (thick), over seeds (thin)",
                  fontsize=8)
    ax.set_title(f"The claims' margins at the {scale} scale\n(green: the margin rule holds on these numbers; red: it "
                 "does not)", fontsize=9)
    fig.subplots_adjust(left=0.47, right=0.98, top=1 - 0.6 / height, bottom=0.6 / height)
    paths = save_figure(fig, out_stem)
    return [*paths, write_frame_csv(margins, f"{out_stem}.csv")]


MARGIN_COLUMNS = ("comparison", "estimate", "problems_lo", "problems_hi", "seeds_lo", "seeds_hi", "rule")


def build_claims(results: PathLike, published_path: PathLike, out_stem: PathLike, scale: str,
                 display: Mapping[str, str], notes: Sequence[str] = (), figure_stem: PathLike | None = None,
                 **settings: Any) -> pd.DataFrame:
    """Read the results folder, build the claims table and write ``{out_stem}.csv``, ``.md`` and ``.tex`` (and the
    margins figure at ``figure_stem``, when given)."""
    from esrepro.report.tables import load_published, write_table

    published = load_published(published_path)
    margins: list[dict[str, Any]] = []
    df = claims_table(claim_rows(results, published, display, margins_out=margins, **settings), scale)
    if figure_stem is not None:
        margins_figure(pd.DataFrame(margins, columns=list(MARGIN_COLUMNS)), figure_stem, scale)
    counts = df["Verdict"].value_counts()
    rule_notes = [
        f"Scale: {scale} (the configuration's scale). Verdicts: {counts.get(HOLDS, 0)} hold, "
        f"{counts.get(FAILS, 0)} do not hold, {counts.get(UNTESTABLE, 0)} not testable.",
        "Verdicts are computed (esrepro.report.verdicts; docs/claims.md): a margin holds when the lower end of its 95% "
        "interval is above 0 (paired bootstrap over test problems, 2,000 resamples; and Welch's t over seeds where "
        "both methods have 2+ seeds); a ratio of spreads holds when its interval's lower end is above 1; orders, "
        "dominance and times to a target are applied to point estimates as each row states. Not testable: a method, "
        "model or sweep not run, fewer than 2 seeds for a spread, or a scale other than the paper's (then 'Rule on "
        "this run' is the rule's outcome on this run's own numbers).",
        "Paper: the numbers of config/published.yaml (ES paper arXiv 2509.24372v2; ESSA arXiv 2507.04453).",
    ]
    move = movement_note(results, settings.get("task", "countdown"), settings.get("split", "test"))
    if move:
        rule_notes.append(move)
    caption = "The papers' claims, tested by this run"
    write_table(df, out_stem, caption, [*rule_notes, *notes])
    write_text(Path(f"{out_stem}.tex"), claims_latex(df, caption, [*rule_notes, *notes]))
    return df


#: The LaTeX table's columns and their widths (the CSV and Markdown have every column).
LATEX_COLUMNS = {"Claim": "3.2cm", "Where": "2.2cm", "Paper": "3.4cm", "This run": "3.4cm",
                 "Rule on this run": "1.6cm", "Verdict": "1.6cm", "Reason": "5.2cm"}


def claims_latex(df: pd.DataFrame, caption: str, notes: Sequence[str] = ()) -> str:
    """The claims table as a LaTeX ``longtable`` of wrapped paragraph columns (:data:`LATEX_COLUMNS`; the interval
    text is in the Markdown and CSV), small type, landscape-width."""
    from esrepro.report.tables import latex_escape

    cols = [c for c in LATEX_COLUMNS if c in df.columns]
    spec = "".join(f"p{{{LATEX_COLUMNS[c]}}}" for c in cols)
    head = " & ".join(rf"\textbf{{{latex_escape(c)}}}" for c in cols) + r" \\"
    lines = [r"{\footnotesize", rf"\begin{{longtable}}{{{spec}}}", rf"\caption{{{latex_escape(caption)}}}\\",
             r"\toprule", head, r"\midrule", r"\endhead"]
    for _, row in df.iterrows():
        lines.append(" & ".join(latex_escape("" if pd.isna(row[c]) else row[c]) for c in cols) + r" \\")
    lines += [r"\bottomrule", r"\end{longtable}"]
    lines += [latex_escape(n) + r"\par" for n in notes]
    lines.append("}")
    return "\n".join(lines) + "\n"
