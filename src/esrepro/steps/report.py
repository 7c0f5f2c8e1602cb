"""Steps: tables (csv, md, tex) and figures (png, pdf), each with a manifest of what it was made from."""

from __future__ import annotations

from esrepro.steps import kl_inputs, registry_entries, report_manifest
from esrepro.steps.train import named_paths

TABLE = (".csv", ".md", ".tex")
FIGURE = (".png", ".pdf")


def table1(metrics: list[str], published: str, registry: str, models: list[str], out: str, task: str = "countdown",
           split: str = "test", note: list[str] | None = None) -> None:
    """Table 1 (accuracy per model and method, ours beside the paper's) and its headline metrics."""
    from esrepro.config import load_registry
    from esrepro.provenance import now
    from esrepro.report.tables import build_table1

    started = now()
    reg = load_registry(registry)
    entries = {k: reg[k].model_dump(mode="json") for k in models}
    build_table1(metrics, published, entries, out, notes=note or [], task=task, split=split, include=models)
    report_manifest("table1", out, (*TABLE, ".metrics.json"), started,
                    inputs={**{m: m for m in metrics}, "published": published, "registry": registry},
                    settings={"task": task, "split": split, "models": models, "notes": note or []})


def table2(kl: list[str], registry: str, out: str, reward_cutoff: float | None = None,
           note: list[str] | None = None) -> None:
    """Table 2 (conciseness: reward and KL per configuration, mean +- std over seeds)."""
    from esrepro.config import load_registry
    from esrepro.provenance import now
    from esrepro.report.conciseness import build_table2, load_kl

    started = now()
    reg = load_registry(registry)
    display = ", ".join(reg[m].display if m in reg else m for m in sorted(set(load_kl(kl)["model"])))
    build_table2(kl, out, reward_cutoff, notes=note or [], model_display=display)
    report_manifest("table2", out, TABLE, started, inputs={**{p: p for p in kl}, "registry": registry},
                    settings={"reward_cutoff": reward_cutoff, "notes": note or []})


def table3(selection: list[str], registry: str, out: str) -> None:
    """Table 3: each RL method's hyperparameter grid and the cell kept, per model."""
    from esrepro.provenance import now
    from esrepro.report.tables import build_table3

    started = now()
    build_table3(selection, registry_entries(registry), out)
    report_manifest("table3", out, TABLE, started, inputs={p: p for p in selection} | {"registry": registry},
                    settings={})


def curves(log: list[str], out: str) -> None:
    """Training reward per iteration of each labelled log.jsonl (``LABEL=PATH``), png, pdf and csv."""
    from esrepro.provenance import now
    from esrepro.report.figures import build_countdown_curves

    started = now()
    logs = named_paths(log, "--log", "LABEL=PATH")
    build_countdown_curves(logs, out)
    report_manifest("curves", out, (*FIGURE, ".csv"), started, inputs={p: p for p in logs.values()},
                    settings={"labels": list(logs)})


def pareto(kl: list[str], out: str, estimator: str = "exact") -> None:
    """Reward against KL to the base model, with each method's Pareto front."""
    from esrepro.provenance import now
    from esrepro.report.figures import pareto_figure

    started = now()
    pareto_figure(kl, out, kl=estimator)
    report_manifest("pareto", out, FIGURE, started, inputs={p: p for p in kl}, settings={"estimator": estimator})


def reward_distribution(kl: list[str], out: str) -> None:
    """Per-response reward distributions of the base model and every ES and GRPO configuration."""
    from esrepro.provenance import now
    from esrepro.report.figures import reward_distribution_figure

    started = now()
    reward_distribution_figure(kl, out)
    report_manifest("reward_distribution", out, FIGURE, started, inputs=kl_inputs(kl), settings={})


# --- the ESSA study (ESSA paper Figures 2, 4, 7, 8, 9 and a summary table) ---------------------------


def essa_report(runs: list[str], metrics: list[str], published: str, registry: str, spec: dict) -> None:
    """The ESSA study's summary table and figures from its run directories and their evaluations.

    ``spec``: ``target_accuracy``, ``sweeps`` ({populations|ranks|engines|precisions: [methods]}),
    ``stems`` ({table, populations, ranks, engines, precisions, wallclock: output path stem}); a
    figure is written when its stem is given.
    """
    from esrepro.config import load_registry, load_yaml
    from esrepro.provenance import now
    from esrepro.report import essa as R

    started = now()
    reg = load_registry(registry)
    display = {k: v.display for k, v in reg.items()}
    curves = R.load_curves(runs)
    table = R.load_runs(runs, metrics)
    notes, published_target = R.published_notes(load_yaml(published), list(dict.fromkeys(table["model"])))
    target = float(spec["target_accuracy"])
    stems, sweeps = spec["stems"], spec.get("sweeps", {})
    inputs = {**{f"{r}/log.jsonl": f"{r}/log.jsonl" for r in runs}, **{m: m for m in metrics},
              "published": published, "registry": registry}
    makers = {
        "populations": lambda stem: R.population_figure(table, curves, sweeps["populations"], stem, display),
        "ranks": lambda stem: R.rank_figure(table, curves, sweeps["ranks"], stem, display),
        "engines": lambda stem: R.engines_figure(table, curves, sweeps["engines"], target, stem, display,
                                                 published_target),
        "precisions": lambda stem: R.precision_figure(table, curves, sweeps["precisions"], stem, display),
        "wallclock": lambda stem: R.wallclock_figure(table, curves, stem, target, display, notes),
    }
    for key, make in makers.items():
        if stems.get(key):
            make(stems[key])
            report_manifest(f"essa_{key}", stems[key], (*FIGURE, ".csv"), started, inputs,
                            settings={"target_accuracy": target, "sweep": sweeps.get(key)})
    R.summary_table(table, R.base_accuracy(metrics), stems["table"], target, curves, notes, display)
    report_manifest("essa_summary", stems["table"], (".csv", ".md"), started, inputs,
                    settings={"target_accuracy": target, "sweeps": sweeps})
