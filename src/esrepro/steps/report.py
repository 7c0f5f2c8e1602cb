"""Steps: tables (csv, md, tex) and figures (png, pdf and the plotted numbers as csv), each with a manifest of what it was made from."""

from __future__ import annotations

import json
from pathlib import Path

from esrepro.steps import kl_inputs, registry_entries, report_manifest, set_threads
from esrepro.steps.train import named_paths

TABLE = (".csv", ".md", ".tex")
FIGURE = (".png", ".pdf", ".csv")  # every figure writes the numbers it plots beside it


def table1(metrics: list[str], published: str, registry: str, models: list[str], out: str, task: str = "countdown",
           split: str = "test", note: list[str] | None = None) -> None:
    """Table 1 (accuracy per model and method, ours beside the paper's) and its headline metrics."""
    from esrepro.config import load_registry
    from esrepro.provenance.manifest import now
    from esrepro.report.tables import build_table1

    started = now()
    reg = load_registry(registry)
    entries = {k: reg[k].model_dump(mode="json") for k in models}
    build_table1(metrics, published, entries, out, notes=note or [], task=task, split=split, include=models)
    report_manifest("table1", out, (*TABLE, ".metrics.json"), started,
                    inputs={**{m: m for m in metrics}, "published": published, "registry": registry},
                    settings={"task": task, "split": split, "models": models, "notes": note or []})


def table2(kl: list[str], registry: str, published: str, out: str, reward_cutoff: float | None = None,
           hacking_margin: float = 0.2, note: list[str] | None = None) -> None:
    """Table 2 (conciseness: normalised reward and KL per configuration, mean +- std over seeds, beside the paper's)."""
    from esrepro.config import load_registry
    from esrepro.provenance.manifest import now
    from esrepro.report.conciseness import build_table2, load_kl

    started = now()
    reg = load_registry(registry)
    display = ", ".join(reg[m].display if m in reg else m for m in sorted(set(load_kl(kl)["model"])))
    build_table2(kl, out, reward_cutoff, notes=note or [], model_display=display, published=published,
                 hacking_margin=hacking_margin, displays={k: reg[k].display for k in reg})
    report_manifest("table2", out, TABLE, started,
                    inputs={**kl_inputs(kl), "registry": registry, "published": published},
                    settings={"reward_cutoff": reward_cutoff, "hacking_margin": hacking_margin, "notes": note or []})


def conciseness_stability(kl: list[str], published: str, out: str, reward_cutoff: float | None = None,
                          note: list[str] | None = None) -> None:
    """Run-to-run stability of the conciseness study: GRPO's reward std over seeds against ES's, beside the paper's."""
    from esrepro.provenance.manifest import now
    from esrepro.report.conciseness import build_conciseness_stability

    started = now()
    build_conciseness_stability(kl, out, reward_cutoff, published, notes=note or [])
    report_manifest("conciseness_stability", out, TABLE, started, inputs={**kl_inputs(kl), "published": published},
                    settings={"reward_cutoff": reward_cutoff, "notes": note or []})


def table3(selection: list[str], registry: str, out: str) -> None:
    """Table 3: each RL method's hyperparameter grid and the cell kept, per model."""
    from esrepro.provenance.manifest import now
    from esrepro.report.tables import build_table3

    started = now()
    build_table3(selection, registry_entries(registry), out)
    report_manifest("table3", out, TABLE, started, inputs={p: p for p in selection} | {"registry": registry},
                    settings={})


def curves(log: list[str], out: str) -> None:
    """Training reward per iteration of each labelled log.jsonl (``LABEL=PATH``), png, pdf and csv."""
    from esrepro.provenance.manifest import now
    from esrepro.report.figures import build_countdown_curves

    started = now()
    logs = named_paths(log, "--log", "LABEL=PATH")
    build_countdown_curves(logs, out)
    report_manifest("curves", out, FIGURE, started, inputs={p: p for p in logs.values()},
                    settings={"labels": list(logs)})


def pareto(kl: list[str], out: str, estimator: str = "k3") -> None:
    """Reward against KL to the base model, with each method's Pareto front (png, pdf and csv)."""
    from esrepro.provenance.manifest import now
    from esrepro.report.figures import pareto_figure

    started = now()
    pareto_figure(kl, out, kl=estimator)
    report_manifest("pareto", out, FIGURE, started, inputs={p: p for p in kl}, settings={"estimator": estimator})


def reward_distribution(kl: list[str], out: str) -> None:
    """Per-response reward distributions of the base model and every ES and GRPO configuration (png, pdf, csv)."""
    from esrepro.provenance.manifest import now
    from esrepro.report.figures import reward_distribution_figure

    started = now()
    reward_distribution_figure(kl, out)
    report_manifest("reward_distribution", out, FIGURE, started, inputs=kl_inputs(kl), settings={})


# --- the analysis report and the evaluation summary --------------------------------------------------------
def main_report_notebook(notebook: str, out_ipynb: str, out_html: str, tables_dir: str, figures_dir: str,
                         eval_dir: str, published: str, registry: str, timeout: int = 600,
                         show_code: bool = False) -> None:
    """Execute the analysis notebook (papermill) and render it to HTML."""
    from esrepro.report.notebook import execute_report

    execute_report(notebook, out_ipynb, out_html,
                   {"tables_dir": tables_dir, "figures_dir": figures_dir, "eval_dir": eval_dir,
                    "published": published, "registry": registry},
                   timeout=timeout, show_code=show_code)


def main_eval_summary(metrics: list[str], out: str) -> dict:
    """Write ``{task: {model: {method: accuracy_percent}}}`` of evaluation metrics (for dvc metrics)."""
    from esrepro.io import write_json
    from esrepro.report.notebook import eval_summary, load_eval_metrics

    summary = eval_summary(load_eval_metrics(metrics))
    write_json(out, summary)
    return summary


# --- the ESSA study (ESSA paper Figures 2, 4, 7, 8, 9 and a summary table) ---------------------------


def essa_report(runs: list[str], metrics: list[str], published: str, registry: str, spec: dict) -> None:
    """The ESSA study's summary table and figures from its run directories and their evaluations.

    ``spec``: ``target_accuracy``, ``task`` (the study's), ``scaling`` (``task``, ``near_optimal``, or null),
    ``sweeps`` ({populations|ranks|engines|precisions: [methods]}), ``stems`` ({table, populations, ranks,
    engines, precisions, wallclock, scaling: output path stem}); a figure is written when its stem is given.
    The sweeps, Fig. 8 and the table read the study task's runs, Fig. 6 the scaling task's.
    """
    from esrepro.config import load_registry, load_yaml
    from esrepro.provenance.manifest import now
    from esrepro.report import essa as R

    started = now()
    reg = load_registry(registry)
    display = {k: v.display for k, v in reg.items()}
    all_curves, all_runs = R.load_curves(runs), R.load_runs(runs, metrics)
    task, scaling = spec.get("task"), spec.get("scaling")
    curves, table = (all_curves, all_runs) if task is None else \
        (all_curves[all_curves["task"] == task], all_runs[all_runs["task"] == task])
    pub = load_yaml(published)
    notes, published_target = R.published_notes(pub, list(dict.fromkeys(all_runs["model"])))
    target = float(spec["target_accuracy"])
    stems, sweeps = spec["stems"], spec.get("sweeps", {})
    inputs = {**{f"{r}/log.jsonl": f"{r}/log.jsonl" for r in runs}, **{m: m for m in metrics},
              "published": published, "registry": registry}

    def scaling_figure(stem: str) -> list:
        on = all_runs[all_runs["task"] == scaling["task"]]
        lines, _ = R.published_notes(pub, list(dict.fromkeys(on["model"])), scaling["task"])
        return R.scaling_figure(on, all_curves[all_curves["task"] == scaling["task"]], stem,
                                float(scaling["near_optimal"]), display, lines)

    makers = {
        "populations": lambda stem: R.population_figure(table, curves, sweeps["populations"], stem, display),
        "ranks": lambda stem: R.rank_figure(table, curves, sweeps["ranks"], stem, display),
        "engines": lambda stem: R.engines_figure(table, curves, sweeps["engines"], target, stem, display,
                                                 published_target),
        "precisions": lambda stem: R.precision_figure(table, curves, sweeps["precisions"], stem, display),
        "wallclock": lambda stem: R.wallclock_figure(table, curves, stem, target, display, notes),
        "scaling": scaling_figure,
    }
    for key, make in makers.items():
        if stems.get(key):
            make(stems[key])
            report_manifest(f"essa_{key}", stems[key], FIGURE, started, inputs,
                            settings={"target_accuracy": target, "sweep": sweeps.get(key),
                                      **({"scaling": scaling} if key == "scaling" else {})})
    R.summary_table(all_runs, R.base_accuracy(metrics), stems["table"], target, all_curves, notes, display, task)
    report_manifest("essa_summary", stems["table"], (".csv", ".md"), started, inputs,
                    settings={"target_accuracy": target, "sweeps": sweeps})


# --- Figures 3, 5-9 and the per-task, math, puzzle and stability tables (report.extras) ----------------------
def _label(task: str) -> str:
    from esrepro.report.task_tables import TASK_LABELS

    return TASK_LABELS.get(task, task)


# --- figures ------------------------------------------------------------------------------------------------------
def gains(metrics: list[str], registry: str, models: list[str], out: str, task: str = "countdown",
          split: str = "test", kind: str = "points") -> None:
    """Figure 6: accuracy improvement of every method over its base model, per model."""
    from esrepro.provenance.manifest import now
    from esrepro.report.gains import GAIN_METHODS, build_gains
    from esrepro.report.tables import load_metrics

    started = now()
    reg = registry_entries(registry)
    present = set(load_metrics(metrics)["method"]) - {"base"}
    methods = [m for m in GAIN_METHODS if m in present] + sorted(present - set(GAIN_METHODS))
    build_gains(metrics, out, task=task, split=split, kind=kind, methods=methods, models=models,
                display={k: v["display"] for k, v in reg.items()})
    report_manifest("gains", out, FIGURE, started, inputs={**{m: m for m in metrics}, "registry": registry},
                    settings={"task": task, "split": split, "kind": kind, "models": models, "methods": methods})


def sample_curves(periodic: list[str], registry: str, out: str, task: str = "countdown") -> None:
    """Figure 7: test accuracy against training-sample evaluations, from every run's periodic_eval.jsonl."""
    from esrepro.provenance.manifest import now
    from esrepro.report.sample_curves import build_sample_curves

    started = now()
    reg = registry_entries(registry)
    build_sample_curves(periodic, out, split="test",
                        title=f"{_label(task)}: test accuracy against training-sample evaluations",
                        display={k: v["display"] for k, v in reg.items()})
    report_manifest("sample_curves", out, FIGURE, started, inputs={**{p: p for p in periodic}, "registry": registry},
                    settings={"task": task})


def param_shift_histogram(task: str, model: str, method: str, model_dir: str, base_dir: str, run_dir: str, out: str,
                          seed: int = 0, threads: int = 1, device: str = "auto") -> dict:
    """|theta_final - theta_base| of one ES run, counted against ES's random walk (alpha, N and the run's z's)."""
    from esrepro import paths as P
    from esrepro.io import write_json
    from esrepro.provenance.manifest import build_manifest, now
    from esrepro.report.param_shift import Bins, RandomWalk, build_shift_histogram, read_shift_histogram
    from esrepro.runtime.devices import pick_device

    set_threads(threads)
    started = now()
    device = pick_device(device)
    walk = RandomWalk.from_run(run_dir)
    root = Path(out)
    bins = None
    if walk.scale == 0:  # no iteration had differing rewards: bins sized to the walk of an informative run
        bins = Bins.for_scale(RandomWalk.es(walk.alpha, walk.population, max(1, walk.steps)).scale)
    path = build_shift_histogram(base_dir, model_dir, root / "histogram.json", walk,
                                 label=f"{model} / {method} / seed{seed}", bins=bins, device=device)
    _, hist, _ = read_shift_histogram(path)
    summary = {"n_params": hist.n_params, "walk_scale": walk.scale, "unchanged": hist.zero,
               "rms_over_walk_scale": hist.rms / walk.scale if walk.scale > 0 else None}
    write_json(root / P.MANIFEST, build_manifest(
        "param_shift_histogram", inputs={"base_model": base_dir, "checkpoint": model_dir,
                                         "run_manifest": Path(run_dir) / P.MANIFEST,
                                         "run_log": Path(run_dir) / P.TRAIN_LOG},
        settings={"task": task, "model": model, "method": method, "seed": seed}, started=started,
        outputs={"histogram": path}, extra={"device": device, "summary": summary}))
    print(json.dumps(summary))
    return summary


def param_shift(histogram: list[str], out: str, task: str = "countdown", sampled_coords: int = 0, seed: int = 0
                ) -> None:
    """Figures 8-10: each ES run's histogram of parameter shifts against its random walk, and their difference."""
    from esrepro.provenance.manifest import now
    from esrepro.report.param_shift import build_param_shift

    started = now()
    build_param_shift(histogram, out, sampled_coords=sampled_coords or None, seed=seed,
                      title=f"{_label(task)}: parameter shifts |θ_final − θ_base| of ES against its random walk")
    report_manifest("param_shift", out, FIGURE, started, inputs={p: p for p in histogram},
                    settings={"task": task, "sampled_coords": sampled_coords, "seed": seed})


def lr_sweep(kl: list[str], out: str, estimator: str = "k3") -> None:
    """Figure 4 (v2): GRPO's final models over learning rates and betas, and the ES and GRPO Pareto fronts."""
    from esrepro.provenance.manifest import now
    from esrepro.report.lr_sweep import build_lr_sweep

    started = now()
    build_lr_sweep(kl, out, kl=estimator)
    report_manifest("lr_sweep", out, FIGURE, started, inputs={p: p for p in kl}, settings={"estimator": estimator})


def lr_distributions(kl: list[str], out: str) -> None:
    """Figure 5 (v2): reward distributions of sampled responses, one panel per GRPO learning rate (ES and base in each)."""
    from esrepro.provenance.manifest import now
    from esrepro.report.lr_sweep import build_lr_distributions

    started = now()
    build_lr_distributions(kl, out)
    report_manifest("lr_distributions", out, FIGURE, started, inputs=kl_inputs(kl), settings={})


# --- tables -------------------------------------------------------------------------------------------------------
def _table(kind: str, build, metrics: list[str], registry: str, out: str, note: list[str] | None,
           published: str | None = None, **settings) -> None:
    """Write one per-task table (``build(registry entries, notes)`` writes its files) and its manifest: the metrics, the
    registry and, for tables set beside the paper's numbers, the published numbers."""
    from esrepro.provenance.manifest import now

    started = now()
    notes = note or []
    build(registry_entries(registry), notes)
    inputs = {**{m: m for m in metrics}, **({"published": published} if published else {}), "registry": registry}
    report_manifest(kind, out, TABLE, started, inputs=inputs, settings={**settings, "notes": notes})


def not_run_cells(items: list[str] | None) -> dict[tuple[str, str, str], str]:
    """``{(test set, model, method): text}`` from repeated ``--not-run TEST_SET:MODEL:METHOD=TEXT`` arguments (runs
    a machine could not do, whose table cells say so); a malformed one names the flag."""
    out = {}
    for item in items or []:
        key, _, text = item.partition("=")
        parts = tuple(key.split(":"))
        if len(parts) != 3 or not all(parts) or not text:
            raise ValueError(f"--not-run expects TEST_SET:MODEL:METHOD=TEXT, got {item!r}")
        out[parts] = text
    return out


def _not_run_setting(cells: dict[tuple[str, str, str], str]) -> dict[str, dict[str, str]]:
    """The manifest's record of the runs left out (none: nothing, so a full run's manifest is unchanged)."""
    return {"not_run": {":".join(k): v for k, v in cells.items()}} if cells else {}


def train_tasks_table(metrics: list[str], published: str, registry: str, sets: list[str], out: str,
                      note: list[str] | None = None, not_run: list[str] | None = None) -> None:
    """Accuracy of every training task's runs on each of its test sets, beside the paper's where published."""
    from esrepro.report.task_tables import build_train_tasks_table

    mapping = named_paths(sets, "--set", "TEST_SET=TRAIN_TASK")
    cells = not_run_cells(not_run)
    _table("train_tasks_table",
           lambda entries, notes: build_train_tasks_table(metrics, published, entries, mapping, out, notes=notes,
                                                          not_run=cells),
           metrics, registry, out, note, published, sets=mapping, **_not_run_setting(cells))


def math_table(metrics: list[str], published: str, registry: str, out: str, note: list[str] | None = None) -> None:
    """The math table: base and ES (ours) on the five math sets, beside the published RL baselines."""
    from esrepro.report.task_tables import build_math_table

    _table("math_table", lambda entries, notes: build_math_table(metrics, published, entries, out, notes=notes),
           metrics, registry, out, note, published)


def math_figure(metrics: list[str], published: str, registry: str, model: str, out: str, title: str = "") -> None:
    """v2 Figure 2: pass@1 of the base model, the RL checkpoints and the ES checkpoints per math benchmark, beside
    the paper's values (config/published.yaml, math_v2.figure)."""
    from esrepro.provenance.manifest import now
    from esrepro.report.math_figure import build_fig2

    started = now()
    display = (registry_entries(registry).get(model) or {}).get("display")
    build_fig2(metrics, published, model, out, title=title, display=display)
    report_manifest("math_figure", out, FIGURE, started,
                    inputs={**{m: m for m in metrics}, "published": published, "registry": registry},
                    settings={"model": model, "title": title})


def puzzle_table(metrics: list[str], published: str, registry: str, out: str, note: list[str] | None = None,
                 not_run: list[str] | None = None) -> None:
    """The puzzle table: Sudoku and ARC-AGI accuracy before and after fine-tuning, beside the paper's."""
    from esrepro.report.task_tables import build_puzzle_table

    cells = not_run_cells(not_run)
    _table("puzzle_table",
           lambda entries, notes: build_puzzle_table(metrics, published, entries, out, notes=notes, not_run=cells),
           metrics, registry, out, note, published, **_not_run_setting(cells))


def stability_table(metrics: list[str], registry: str, out: str, note: list[str] | None = None) -> None:
    """Cross-run stability: accuracy mean, std, min and max over seeds per model and method."""
    from esrepro.report.task_tables import build_stability_table

    _table("stability_table", lambda entries, notes: build_stability_table(metrics, entries, out, notes=notes),
           metrics, registry, out, note)


def es_variants_table(metrics: list[str], registry: str, spec: dict, out: str, note: list[str] | None = None) -> None:
    """Beyond the papers: low-rank ES (EGGROLL) beside full-rank ES on Table 1's task at equal sample budgets."""
    from esrepro.report.es_variants import build_es_variants_table

    _table("es_variants_table",
           lambda entries, notes: build_es_variants_table(metrics, spec, entries, out, notes=notes),
           metrics, registry, out, note, spec=spec)


# --- the papers' claims, tested by the run -----------------------------------------------------------------------
def claims(results: str, published: str, registry: str, spec: dict, out: str, inputs: list[str] | None = None,
           note: list[str] | None = None, figure: str | None = None, only: list[str] | None = None) -> None:
    """The claims table: each claim of the papers, its evidence in the paper and in this run, whether this run
    reproduces the paper's numbers, an interval and a computed verdict (esrepro.report.claims). Each row reads only
    the ``inputs`` its selectors in ``spec`` pick (``spec``: :func:`esrepro.planning.specs.claims_spec`). ``only``: the rows
    to build (a claim's own table); ``figure``: the stem of the margins figure (png, pdf, csv), when wanted."""
    from esrepro.provenance.manifest import now
    from esrepro.report.claims.table import build_claims
    from esrepro.report.tables import load_published

    started = now()
    for key in ("scale", "claims"):
        if key not in spec:
            raise ValueError(f"claims: --spec needs {key!r} (esrepro.planning.specs.claims_spec: the config's scale and each "
                             "row's selectors)")
    display = {k: v["display"] for k, v in registry_entries(registry).items()}
    build_claims(results, inputs or [], load_published(published), spec, display, out, notes=note or [],
                 figure_stem=figure, only=only)
    ins = {**{p: p for p in inputs or []}, "published": published, "registry": registry}
    report_manifest("claims", out, TABLE, started, inputs=ins, settings={**spec, "notes": note or []})
    if figure:
        report_manifest("claims_margins", figure, FIGURE, started, inputs=ins, settings={"scale": spec["scale"]})
