"""The claims table: each claim's row built from the files its rule declares, the scale gate, and the table written
as CSV (every column), Markdown (a short table read at a glance, then each row's reasons) and LaTeX.

``spec`` (the step's, from :func:`esrepro.planning.specs.claims_spec`) holds the settings the rules read and, under
``claims``, every row id of this configuration with its selectors (:mod:`esrepro.report.claims.evidence`), the jobs
that decide it and their requested GPU-hours (:mod:`esrepro.planning.claim_plan`), and its target file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from esrepro.io import read_jsonl, write_text
from esrepro.report import verdicts as V
from esrepro.report.claims import conciseness as C
from esrepro.report.claims import conciseness_sweep as CS
from esrepro.report.claims import countdown as CD
from esrepro.report.claims import es_variants as EV
from esrepro.report.claims import essa as E
from esrepro.report.claims import essa_convergence as EC
from esrepro.report.claims import math_puzzles as MP
from esrepro.report.claims import rl_grid as RG
from esrepro.report.claims import small_models as SM
from esrepro.report.claims.catalogue import CLAIMS, claim_of
from esrepro.report.claims.evidence import Evals, arm_seeds, load_conciseness, load_essa, load_periodic, pick
from esrepro.report.claims.glance import markdown as glance_markdown
from esrepro.report.claims.rows import NO_NUMBER, NOT_RUN, ClaimRow, fmt, seeds_text
from esrepro.report.verdicts import FAILS, HOLDS, NOT_RESOLVED, UNTESTABLE, Outcome

PathLike = str | os.PathLike

#: Wall-clock evidence (ESSA's times to a target): measured seconds vary between runs of one configuration, so they,
#: and below the paper's scale a rule's outcome on them, stay in this column (`esrepro compare` leaves it out: its
#: name says seconds).
WALL = "This run, wall seconds"
#: The CSV's columns: the short ones, then the long reasons, the rule, the interval, the cost and the target (the
#: Markdown: :mod:`esrepro.report.claims.glance`).
COLUMNS = ("Claim", "Where", "Paper", "This run", "Reproduced", "Verdict", "Seeds", "Why", "Decided by",
           "Rule on this run", "Reproduced, detail", "Interval", "Reason", "Wording", "Rule", "Jobs", "GPU jobs",
           "GPU-h requested", "Target", "Id", WALL)
NOT_PLANNED = "not planned"


def _settings(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"task": spec.get("task", "countdown"), "split": spec.get("split", "test"),
            "reward_cutoff": spec.get("reward_cutoff"), "hacking_margin": spec.get("hacking_margin", 0.2),
            "essa_target": spec.get("essa_target"),
            "essa_grpo_target": spec.get("essa_grpo_target", spec.get("essa_target")),
            "math_model": spec.get("math_model"), "es_variants": spec.get("es_variants") or {},
            "es_controls": spec.get("es_controls") or {}, "small_model": spec.get("small_model")}


def build_row(row: str, files: Mapping[str, list[str]], published: Mapping[str, Any], display: Mapping[str, str],
              settings: Mapping[str, Any], margins: list[dict[str, Any]]) -> ClaimRow:
    """One row from the files its selectors picked (``files`` by kind), with the training seeds they hold."""
    out = _rule_row(row, files, published, display, settings, margins)
    out.seeds = seeds_text(arm_seeds(files)) if claim_of(row).planned else NOT_RUN
    return out


def _rule_row(row: str, files: Mapping[str, list[str]], published: Mapping[str, Any], display: Mapping[str, str],
              settings: Mapping[str, Any], margins: list[dict[str, Any]]) -> ClaimRow:
    """The row its claim's rule builds."""
    claim = claim_of(row)
    key, model = claim.key, (row.split(".", 1)[1] if claim.per_model else None)
    s = settings
    if not claim.planned:
        return ClaimRow(claim, None, claim.title, claim.wording, "not run",
                        V.untestable(f"{NOT_PLANNED}: {claim.rule.removeprefix('Not planned: ')}"), NOT_PLANNED,
                        reproduced="not run")
    if key in ("es_improves_base", "es_beats_rl", "es_improves_math", "es_competitive_math", "es_lifts_sudoku",
               "es_lifts_arc"):
        evals = Evals(files["evals"])
        if key == "es_improves_base":
            out = CD.improves_base(evals, published, display, s["task"], s["split"])
        elif key == "es_beats_rl":
            out = CD.beats_rl(evals, published, display, model, s["task"], s["split"])
        elif key in ("es_improves_math", "es_competitive_math"):
            out = MP.math_rows(evals, published, display, s["math_model"], key)
        else:
            out = MP.puzzle_row(evals, published, display, "sudoku" if key == "es_lifts_sudoku" else "arc")
        margins.extend(evals.margins)
        return out
    if key == "es_small_models_v1":
        evals = Evals(files["evals"])
        out = SM.small_model_row(evals, published, display, s["small_model"], s["task"], s["split"])
        margins.extend(evals.margins)
        return out
    if key == "rl_sensitive_hyperparameters":
        return RG.sensitivity_row(RG.load_grids(files["grids"]), display)
    if key in ("es_kl_stable", "grpo_lr_raises_reward_kl", "grpo_near_base_es_shifts"):
        runs = load_conciseness(files["kl"])
        if key == "es_kl_stable":
            return CS.kl_stability_row(runs, published, s["reward_cutoff"])
        return CS.lr_trend_row(runs) if key == "grpo_lr_raises_reward_kl" else CS.near_base_row(runs)
    if key == "eggroll_matches_es":
        evals = Evals(files["evals"])
        out = EV.matches_row(evals, display, s["es_variants"], s["es_controls"], s["task"], s["split"])
        margins.extend(evals.margins)
        return out
    if key in ("es_ahead_throughout", "es_sample_efficiency_v1"):
        curves = load_periodic(files["periodic"], s["split"])
        return CD.ahead_throughout(curves, display) if key == "es_ahead_throughout" \
            else CD.sample_share_v1(curves, display)
    if key in ("es_pareto", "es_pareto_lr", "grpo_small_beta_hacks", "es_stable_across_runs"):
        runs = load_conciseness(files["kl"])
        if key in ("es_pareto", "es_pareto_lr"):
            return C.pareto_row(runs, published, key)
        if key == "grpo_small_beta_hacks":
            return C.hacking_row(runs, published, s["hacking_margin"])
        return C.stability_row(runs, published, s["reward_cutoff"])
    runs, curves = load_essa(files["runs"])
    if key == "essa_faster_than_grpo":
        return E.faster_row(runs, curves, published, s["essa_grpo_target"], display)
    if key == "essa_data_efficiency":
        return E.data_row(runs, curves, s["essa_grpo_target"], display)
    if key == "essa_time_falls_with_gpus":
        return E.engines_row(runs, curves, published, s["essa_target"], display)
    if key == "essa_moderate_population":
        return E.sweep_row(runs, "population", key, display)
    if key == "essa_rank":
        return E.sweep_row(runs, "rank", key, display)
    if key == "essa_quantised":
        return E.precision_row(runs, display)
    if key == "essa_improves_over_training":
        return E.improves_row(runs, curves, display)
    if key == "essa_fig8_accuracy":
        return EC.fig8_accuracy_row(runs, curves, display)
    if key in EC.SPEED_ROWS:
        return EC.speed_row(runs, curves, key, display)
    raise KeyError(f"no rule builds claim {key!r}")


def row_ids(spec: Mapping[str, Any]) -> list[str]:
    """The rows of this configuration: the spec's planned rows and every claim not planned, in catalogue order."""
    planned = list((spec.get("claims") or {}).keys())
    order = {c.key: i for i, c in enumerate(CLAIMS)}
    ids = planned + [c.key for c in CLAIMS if not c.planned and c.key not in planned]
    return sorted(ids, key=lambda r: (order[claim_of(r).key], r))


def claim_rows(results: PathLike, inputs: Sequence[PathLike], published: Mapping[str, Any],
               display: Mapping[str, str], spec: Mapping[str, Any], only: Sequence[str] | None = None,
               margins_out: list | None = None) -> list[tuple[ClaimRow, Mapping[str, Any]]]:
    """Every row (or the rows ``only`` names) with its spec entry; each row reads only the declared ``inputs`` its
    selectors pick. Every margin computed is appended to ``margins_out`` when given (the figure's numbers)."""
    if "claims" not in spec:
        raise ValueError("claims: the spec has no 'claims' (each row's selectors, esrepro.planning.specs.claims_spec)")
    entries = spec["claims"]
    ids = row_ids(spec)
    if only:
        unknown = [r for r in only if r not in ids]
        if unknown:
            raise ValueError(f"claims: no row {', '.join(map(repr, unknown))} in this configuration (rows: "
                             f"{', '.join(ids)})")
        ids = [r for r in ids if r in only]
    settings, margins, out = _settings(spec), [], []
    for row in ids:
        entry = entries.get(row, {})
        files = pick(results, inputs, entry.get("select", {}))
        out.append((build_row(row, files, published, display, settings, margins), entry))
    if margins_out is not None:
        margins_out.extend(margins)
    return out


def decided_by(entry: Mapping[str, Any]) -> str:
    """The jobs that decide a row and their requested GPU-hours, in a few words."""
    if not entry:
        return "no planned job"
    gpu_h = float(entry.get("gpu_hours", 0.0))
    return f"{entry.get('jobs', 0)} jobs, {gpu_h:,.0f} GPU-h" if gpu_h >= 1 or gpu_h == 0 else \
        f"{entry.get('jobs', 0)} jobs, {gpu_h:.2f} GPU-h"


def claims_table(rows: Sequence[tuple[ClaimRow, Mapping[str, Any]]], scale: str) -> pd.DataFrame:
    """The rows with the scale gate applied (:func:`esrepro.report.verdicts.gate`): Verdict, Why and the rule's
    outcome on this run's numbers; below the paper's scale Reproduced is not compared either."""
    records = []
    why_scale = V.SCALE_REASONS.get(scale, f"scale {scale!r} is not the paper's")
    for r, entry in rows:
        wall, outcome, why = r.wall, r.outcome, r.why
        reproduced, rep_detail = r.reproduced, r.reproduced_detail
        if scale != "paper" and outcome.verdict != UNTESTABLE:
            why = f"{scale} scale (the rule here: {outcome.verdict})"
            if wall:
                wall = f"{wall}; the rule on these times: {outcome.verdict} ({outcome.reason})"
                final = Outcome(UNTESTABLE, f"{why_scale}; the rule's outcome on this run's wall-clock times: in "
                                            f"'{WALL}'")
                measured = f"in '{WALL}'"
                why = f"{scale} scale (the rule here: in '{WALL}')"
            else:
                final, measured = V.gate(outcome, scale)
        else:
            final, measured = outcome, outcome.verdict
        if scale != "paper" and reproduced not in (NOT_RUN, NO_NUMBER):
            reproduced, rep_detail = f"not compared ({scale} scale)", ""
        records.append({"Claim": r.title, "Where": r.claim.where, "Paper": r.paper, "This run": r.ours,
                        "Reproduced": reproduced, "Verdict": final.verdict, "Seeds": r.seeds, "Why": why,
                        "Decided by": decided_by(entry), "Rule on this run": measured,
                        "Reproduced, detail": rep_detail, "Interval": r.interval, "Reason": final.reason,
                        "Wording": r.claim.wording, "Rule": r.claim.rule, "Jobs": entry.get("jobs", 0),
                        "GPU jobs": entry.get("gpu_jobs", 0), "GPU-h requested": entry.get("gpu_hours", 0.0),
                        "Target": entry.get("target", ""), "Id": r.id, WALL: wall})
    return pd.DataFrame(records, columns=list(COLUMNS))


# --- notes ----------------------------------------------------------------------------------------------------------
def movement_note(evals_files: Sequence[PathLike], results: PathLike, task: str = "countdown",
                  split: str = "test") -> str | None:
    """Whether ES training moved this run's numbers beyond the spread between seeds: ES's test accuracy against
    the base model's and its std over seeds, and the training reward's change from the first to the last iteration
    of each seed against the spread of the first iteration's reward over seeds."""
    evals = Evals(evals_files)
    parts = []
    for model in evals.models(task, split, "es"):
        es = evals.seeds(task, split, model, "es")
        base = evals.mean(task, split, model, "base")
        sd = float(np.std(es, ddof=1)) if len(es) > 1 else math.nan
        parts.append(f"{model}: test accuracy {fmt(base)} (base) -> {fmt(float(np.mean(es)))} (ES, "
                     f"{len(es)} seeds, std {fmt(sd)})")
        first, last = [], []
        for seed in sorted(evals.acc.get((task, split, model, "es"), {})):
            log = Path(results, "runs", task, model, "es", f"seed{seed}", "log.jsonl")
            rec = read_jsonl(log) if log.is_file() else []
            if rec:
                first.append(float(rec[0]["reward_mean"]))
                last.append(float(rec[-1]["reward_mean"]))
        if first:
            change = [b - a for a, b in zip(first, last, strict=True)]
            spread = float(np.std(first, ddof=1)) if len(first) > 1 else math.nan
            parts.append("population mean training reward, first -> last iteration: "
                         + ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(first, last, strict=True))
                         + f" (change {np.mean(change):+.3f}; spread over seeds at the start {fmt(spread, 3)})")
    if not parts:
        return None
    return "Does ES training move this run's Countdown numbers? " + "; ".join(parts) + "."


def rule_notes(df: pd.DataFrame, scale: str) -> list[str]:
    counts = df["Verdict"].value_counts()
    return [
        f"Scale: {scale} (the configuration's scale). Verdicts: {counts.get(HOLDS, 0)} hold, "
        f"{counts.get(NOT_RESOLVED, 0)} not resolved, {counts.get(FAILS, 0)} do not hold, "
        f"{counts.get(UNTESTABLE, 0)} not testable.",
        "Verdicts are computed (esrepro.report.verdicts; docs/claims.md): a claim holds when its 95% interval clears "
        "the claim's null (paired bootstrap over test problems, 2,000 resamples, and Welch's t over seeds where both "
        "methods have 2+ seeds; an F interval for a ratio of spreads), does not hold when the interval lies wholly "
        "on the other side, and is not resolved when the interval includes the null. Orders, times and counts are "
        "applied to point estimates as each rule states. Not testable: a run not made, fewer than 2 seeds for a "
        "spread, a claim not planned, or a scale other than the paper's (then 'Rule on this run' keeps the rule's "
        "outcome on this run's own numbers).",
        "Reproduced: whether this run's numbers agree with the paper's (accuracies within 95% of two binomial "
        "estimates on the same test set, means over seeds within 95% of their difference, stated tolerances for "
        "times). Decided by: the jobs the row's rule reads and their requested GPU-hours (esrepro claim-costs).",
        "Paper: config/published.yaml (ES paper arXiv 2509.24372v2, v1 where marked; ESSA arXiv 2507.04453, its "
        "full text v1, v3 where marked).",
    ]


# --- the margins figure ---------------------------------------------------------------------------------------------
MARGIN_COLUMNS = ("comparison", "estimate", "problems_lo", "problems_hi", "seeds_lo", "seeds_hi", "null", "rule")


def margins_figure(margins: pd.DataFrame, out_stem: PathLike, scale: str) -> list[Path]:
    """Every margin the claims compute (accuracy points, A - B): the estimate, its bootstrap interval over test
    problems (thick) and over seeds where there is one (thin), the claim's null (0, or -d for non-inferiority);
    ``{out_stem}.png``, ``.pdf`` and the plotted numbers as ``.csv``."""
    from matplotlib.figure import Figure

    from esrepro.report.figures import save_figure, write_frame_csv

    n = max(1, len(margins))
    height = 1.5 + 0.32 * n
    fig = Figure(figsize=(10.0, height))
    ax = fig.add_subplot(1, 1, 1)
    colors = {HOLDS: "C2", FAILS: "C3", NOT_RESOLVED: "C1"}
    for i, r in enumerate(margins.itertuples(index=False)):
        y = n - 1 - i
        if not math.isnan(r.seeds_lo):
            ax.plot([r.seeds_lo, r.seeds_hi], [y, y], color="grey", linewidth=1)
        ax.plot([r.problems_lo, r.problems_hi], [y, y], color=colors.get(r.rule, "C0"), linewidth=3)
        ax.plot([r.estimate], [y], marker="o", color="black", markersize=4)
        if r.null:
            ax.plot([r.null], [y], marker="|", color="black", markersize=10)
    ax.axvline(0.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_yticks([n - 1 - i for i in range(len(margins))])
    ax.set_yticklabels(list(margins["comparison"]), fontsize=7)
    ax.set_xlabel("margin (accuracy points), 95% intervals: bootstrap over test problems (thick), over seeds (thin); "
                  "| marks a non-inferiority null", fontsize=8)
    ax.set_title(f"The claims' margins at the {scale} scale\n(green: clears the null; orange: includes it; red: "
                 "below it)", fontsize=9)
    fig.subplots_adjust(left=0.47, right=0.98, top=1 - 0.6 / height, bottom=0.6 / height)
    paths = save_figure(fig, out_stem)
    return [*paths, write_frame_csv(margins, f"{out_stem}.csv")]


# --- writing --------------------------------------------------------------------------------------------------------
def _markdown(df: pd.DataFrame, caption: str, notes: Sequence[str]) -> str:
    """The short table, then each row's reasons (:mod:`esrepro.report.claims.glance`)."""
    return glance_markdown(df.to_dict("records"), caption, notes)


#: The LaTeX table's columns and their widths.
LATEX_COLUMNS = {"Claim": "3.4cm", "Where": "2.2cm", "Paper": "3.4cm", "This run": "3.6cm", "Reproduced": "1.6cm",
                 "Verdict": "1.6cm", "Seeds": "2.0cm", "Why": "3.4cm", "Decided by": "2.0cm"}


def claims_latex(df: pd.DataFrame, caption: str, notes: Sequence[str] = ()) -> str:
    """The claims table as a LaTeX ``longtable`` of wrapped paragraph columns (:data:`LATEX_COLUMNS`; the long
    reasons are in the CSV), small type, landscape-width."""
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


def build_claims(results: PathLike, inputs: Sequence[PathLike], published: Mapping[str, Any], spec: Mapping[str, Any],
                 display: Mapping[str, str], out_stem: PathLike, notes: Sequence[str] = (),
                 figure_stem: PathLike | None = None, only: Sequence[str] | None = None) -> pd.DataFrame:
    """Build the claims table from the declared ``inputs`` and write ``{out_stem}.csv``, ``.md`` and ``.tex`` (and
    the margins figure at ``figure_stem``, when given)."""
    from esrepro.report.figures import write_frame_csv

    scale = spec["scale"]
    margins: list[dict[str, Any]] = []
    df = claims_table(claim_rows(results, inputs, published, display, spec, only, margins), scale)
    if figure_stem is not None:
        margins_figure(pd.DataFrame(margins, columns=list(MARGIN_COLUMNS)), figure_stem, scale)
    all_notes = rule_notes(df, scale)
    base_entry = (spec.get("claims") or {}).get("es_improves_base")
    if not only and base_entry:
        evals = pick(results, inputs, base_entry.get("select", {}))["evals"]
        move = movement_note(evals, results, spec.get("task", "countdown"), spec.get("split", "test"))
        if move:
            all_notes.append(move)
    caption = "The papers' claims, tested by this run"
    write_frame_csv(df, f"{out_stem}.csv")
    write_text(Path(f"{out_stem}.md"), _markdown(df, caption, [*all_notes, *notes]))
    write_text(Path(f"{out_stem}.tex"), claims_latex(df, caption, [*all_notes, *notes]))
    return df
