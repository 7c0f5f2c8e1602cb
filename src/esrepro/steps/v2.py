"""Steps of the v2 outputs (issue 13): Figures 3, 5-9 and the math, puzzle, per-task and stability tables.

Each function reads its inputs, calls the report library (:mod:`esrepro.report.gains`,
:mod:`~esrepro.report.sample_curves`, :mod:`~esrepro.report.param_shift`,
:mod:`~esrepro.report.lr_sweep`, :mod:`~esrepro.report.v2_tables`) and writes its outputs with
a manifest of what they were made from.
"""

from __future__ import annotations

import json
from pathlib import Path

from esrepro.steps import kl_inputs, registry_entries, report_manifest, set_threads
from esrepro.steps.report import TABLE

FIGURE = (".png", ".pdf", ".csv")


def _label(task: str) -> str:
    from esrepro.report.v2_tables import TASK_LABELS

    return TASK_LABELS.get(task, task)


# --- figures ------------------------------------------------------------------------------------------------------
def gains(metrics: list[str], registry: str, models: list[str], out: str, task: str = "countdown",
          split: str = "test", kind: str = "points") -> None:
    """Figure 5: accuracy improvement of every method over its base model, per model."""
    from esrepro.provenance import now
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
    """Figure 6: test accuracy against training-sample evaluations, from every run's periodic_eval.jsonl."""
    from esrepro.provenance import now
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
    from esrepro.devices import pick_device
    from esrepro.io import write_json
    from esrepro.provenance import build_manifest, now
    from esrepro.report.param_shift import Bins, RandomWalk, build_shift_histogram, read_shift_histogram

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
    """Figures 7-9: each ES run's histogram of parameter shifts against its random walk, and their difference."""
    from esrepro.provenance import now
    from esrepro.report.param_shift import build_param_shift

    started = now()
    build_param_shift(histogram, out, sampled_coords=sampled_coords or None, seed=seed,
                      title=f"{_label(task)}: parameter shifts |θ_final − θ_base| of ES against its random walk")
    report_manifest("param_shift", out, FIGURE, started, inputs={p: p for p in histogram},
                    settings={"task": task, "sampled_coords": sampled_coords, "seed": seed})


def lr_sweep(kl: list[str], out: str, estimator: str = "exact") -> None:
    """Figure 3: GRPO's final models over learning rates and betas, and the ES and GRPO Pareto fronts."""
    from esrepro.provenance import now
    from esrepro.report.lr_sweep import build_lr_sweep

    started = now()
    build_lr_sweep(kl, out, kl=estimator)
    report_manifest("lr_sweep", out, FIGURE, started, inputs={p: p for p in kl}, settings={"estimator": estimator})


def lr_distributions(kl: list[str], out: str) -> None:
    """Figure 4: reward distributions of sampled responses, one panel per GRPO learning rate (ES and base in each)."""
    from esrepro.provenance import now
    from esrepro.report.lr_sweep import build_lr_distributions

    started = now()
    build_lr_distributions(kl, out)
    report_manifest("lr_distributions", out, FIGURE, started, inputs=kl_inputs(kl), settings={})


# --- tables -------------------------------------------------------------------------------------------------------
def _table(kind: str, build, metrics: list[str], registry: str, out: str, note: list[str] | None,
           published: str | None = None, **settings) -> None:
    """Write one v2 table (``build(registry entries, notes)`` writes its files) and its manifest: the metrics, the
    registry and, for tables set beside the paper's numbers, the published numbers."""
    from esrepro.provenance import now

    started = now()
    notes = note or []
    build(registry_entries(registry), notes)
    inputs = {**{m: m for m in metrics}, **({"published": published} if published else {}), "registry": registry}
    report_manifest(kind, out, TABLE, started, inputs=inputs, settings={**settings, "notes": notes})


def train_tasks_table(metrics: list[str], published: str, registry: str, sets: list[str], out: str,
                      note: list[str] | None = None) -> None:
    """Accuracy of every training task's runs on each of its test sets, beside the paper's where published."""
    from esrepro.report.v2_tables import build_train_tasks_table
    from esrepro.steps.train import named_paths

    mapping = named_paths(sets, "--set", "TEST_SET=TRAIN_TASK")
    _table("train_tasks_table",
           lambda entries, notes: build_train_tasks_table(metrics, published, entries, mapping, out, notes=notes),
           metrics, registry, out, note, published, sets=mapping)


def math_table(metrics: list[str], published: str, registry: str, out: str, note: list[str] | None = None) -> None:
    """The math table: base and ES (ours) on the five math sets, beside the published RL baselines."""
    from esrepro.report.v2_tables import build_math_table

    _table("math_table", lambda entries, notes: build_math_table(metrics, published, entries, out, notes=notes),
           metrics, registry, out, note, published)


def puzzle_table(metrics: list[str], published: str, registry: str, out: str, note: list[str] | None = None) -> None:
    """The puzzle table: Sudoku and ARC-AGI accuracy before and after fine-tuning, beside the paper's."""
    from esrepro.report.v2_tables import build_puzzle_table

    _table("puzzle_table", lambda entries, notes: build_puzzle_table(metrics, published, entries, out, notes=notes),
           metrics, registry, out, note, published)


def stability_table(metrics: list[str], registry: str, out: str, note: list[str] | None = None) -> None:
    """Cross-run stability: accuracy mean, std, min and max over seeds per model and method."""
    from esrepro.report.v2_tables import build_stability_table

    _table("stability_table", lambda entries, notes: build_stability_table(metrics, entries, out, notes=notes),
           metrics, registry, out, note)
