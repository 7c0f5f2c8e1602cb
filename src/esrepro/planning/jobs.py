"""Every job of a config's Snakemake DAG, from its :class:`~esrepro.planning.plan.Plan`, each under the paper table or figure
it is run for (a job several of them read counts under the first: Table 1's base models, the ESSA reference runs).

The rules and their wildcards mirror workflow/rules/*.smk; tests/test_cost.py keeps the count of each rule equal to
``snakemake -n -F``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from esrepro.pipeline import BASE, ESSA_GRPO, ESSA_SWEEPS, Pipeline
from esrepro.planning.plan import ExtrasPlan, Plan

TABLE1 = "ES Table 1, Figs. 6-7 (Countdown)"
STABILITY = "ES v2 stability (Countdown seeds)"
SHARED = "Models, data, other evaluations, reports"
#: ESSA figures by sweep (esrepro.pipeline.ESSA_SWEEPS' keys).
ESSA_SWEEP_GROUPS = {"populations": "ESSA Fig. 4 (population)", "ranks": "ESSA Fig. 7 (LoRA rank)",
                     "engines": "ESSA Fig. 2 (GPUs)", "precisions": "ESSA Fig. 9 (precision)",
                     "resample": "ESSA Sec. 5.4 (resampled problems)"}
ESSA_REFERENCE = "ESSA reference runs (Figs. 2, 4, 6-9)"
ESSA_GRPO_GROUP = "ESSA Fig. 8 (against GRPO)"
ESSA_SCALING = "ESSA Fig. 6 (PRM800K)"
STUDY_GROUPS = {"conciseness": "ES Table 2, Fig. 1 (conciseness)", "conciseness_lr": "ES Figs. 4-5 (GRPO learning rates)"}
MATH = "ES v2 Fig. 2 and math table"
PUZZLES = "ES v2 Table 3 (puzzles)"
SHIFTS = "ES Figs. 8-10 (parameter shifts)"
ES_VARIANTS = "Beyond the papers: low-rank ES (EGGROLL)"


@dataclass(frozen=True)
class Job:
    """One job: its rule, wildcards and the table or figure it is counted under."""

    rule: str
    group: str
    wildcards: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return "/".join(str(v) for v in self.wildcards.values())


class Groups:
    """Which table or figure a run key (task, model, method, seed) is for."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        study = p.essa_study()
        self.essa_task = study.task if study else None
        self.scaling_task = study.scaling.task if study and study.scaling else None
        self.sweep = {m: ESSA_SWEEP_GROUPS[k] for k, _, _ in ESSA_SWEEPS for _, m in p.essa_sweep(k)}
        self.study_runs = {(s.task, *r): STUDY_GROUPS.get(name, f"study {name}")
                           for name, s in p.studies().items() for r in p.study_runs(name)}
        self.study_runs.update({(s.task, m, BASE, 0): STUDY_GROUPS.get(name, f"study {name}")
                                for name, s in reversed(list(p.studies().items())) for m in s.models})

    def of(self, task: str, model: str, method: str, seed: int) -> str:
        p, seed = self.p, int(seed)
        if task == self.scaling_task and model in p.essa_models(task):
            return ESSA_SCALING
        if task == self.essa_task and model in p.essa_models(task) and \
                (method == BASE or method in p.essa_methods(task, model)):  # not the task's other training runs
            if method == ESSA_GRPO:
                return ESSA_GRPO_GROUP
            return self.sweep.get(method, ESSA_REFERENCE)
        if (task, model, method, seed) in self.study_runs:
            return self.study_runs[task, model, method, seed]
        train = p.train_task_of(task)
        trained = train in p.cfg.train and method in p.train_methods(train)
        if trained and p.is_es_variant(train, method):
            return ES_VARIANTS
        if train == p.cfg.report.table1.task and train in p.cfg.train:
            if method == BASE and model in p.train_models(train):
                return TABLE1
            if method != BASE:
                return TABLE1 if seed in p.seeds or seed in p.claims_seeds(train, model, method) else STABILITY
        if train == "math_train" and train in p.cfg.train:
            return MATH
        if train in ("sudoku", "arc") and train in p.cfg.train:
            return PUZZLES
        return SHARED


def _training(plan: Plan, groups: Groups) -> list[Job]:
    p, out = plan.p, []
    for task in p.cfg.train:
        for model, method, seed in plan.train_runs(task):
            w = {"task": task, "model": model, "method": method, "seed": seed}
            g = groups.of(task, model, method, seed)
            if p.is_rl(task, method):
                out += [Job("train_cell", g, {**w, "cell": c}) for c in p.grid_cells(model, method)]
                out.append(Job("select_rl", g, w))
            else:
                out.append(Job("train", g, w))
    for name, study in p.studies().items():
        out += [Job("train", groups.of(study.task, m, meth, s), {"task": study.task, "model": m, "method": meth,
                                                                  "seed": s}) for m, meth, s in p.study_runs(name)]
    for task in p.essa_tasks():
        for m, meth, s in p.essa_runs(task):
            out.append(Job("essa_grpo" if meth == ESSA_GRPO else "train", groups.of(task, m, meth, s),
                           {"task": task, "model": m, "method": meth, "seed": s}))
    return out


def _measurements(plan: Plan, groups: Groups) -> list[Job]:
    p = plan.p
    evals = [(t, *r) for t in p.evaluated_tasks() for r in plan.runs(t)]
    evals += [(t, *r) for t in p.essa_tasks() for r in [(m, BASE, 0) for m in p.essa_models(t)] + p.essa_runs(t)]
    out = [Job("evaluate", groups.of(*k), dict(zip(("task", "model", "method", "seed"), k, strict=True)))
           for k in dict.fromkeys(evals)]
    extras = ExtrasPlan(plan)
    kl = dict.fromkeys(plan.kl_runs())
    out += [Job("kl", groups.of(*k), dict(zip(("task", "model", "method", "seed"), k, strict=True))) for k in kl]
    if extras.shift_tasks():
        out += [Job("param_shift_histogram", SHIFTS, dict(zip(("task", "model", "method", "seed"), k, strict=True)))
                for k in extras.es_runs()]
    return out


def _reports(plan: Plan) -> list[Job]:
    """One job per table or figure the config writes, and the run's summaries."""
    R, ex = plan.paths, ExtrasPlan(plan)
    targets = set(plan.table_targets())
    made = {stem for stem in (R.TABLE1, R.TABLE3, R.CURVES, R.TABLE2, R.CONCISENESS_STABILITY, R.PARETO, R.DISTRIBUTION,
                              R.LR_SWEEP, R.LR_DISTRIBUTIONS, R.TRAIN_TASKS, R.MATH_TABLE, R.MATH_FIGURE,
                              R.PUZZLE_TABLE, R.STABILITY, R.ES_VARIANTS)
            if any(t.startswith(f"{stem}.") for t in targets)}
    rules = [(R.TABLE1, "table1_countdown", TABLE1), (R.CURVES, "countdown_curves", TABLE1),
             (R.TABLE3, "table3_rl_hyperparameters", TABLE1), (R.TABLE2, "table2_conciseness", STUDY_GROUPS["conciseness"]),
             (R.CONCISENESS_STABILITY, "conciseness_stability", STUDY_GROUPS["conciseness"]),
             (R.PARETO, "conciseness_pareto", STUDY_GROUPS["conciseness"]),
             (R.DISTRIBUTION, "conciseness_distribution", STUDY_GROUPS["conciseness"]),
             (R.LR_SWEEP, "lr_sweep", STUDY_GROUPS["conciseness_lr"]),
             (R.LR_DISTRIBUTIONS, "lr_distributions", STUDY_GROUPS["conciseness_lr"]),
             (R.TRAIN_TASKS, "train_tasks_table", SHARED), (R.MATH_TABLE, "math_table", MATH),
             (R.MATH_FIGURE, "math_figure", MATH),
             (R.PUZZLE_TABLE, "puzzle_table", PUZZLES), (R.STABILITY, "stability_table", STABILITY),
             (R.ES_VARIANTS, "es_variants_table", ES_VARIANTS)]
    out = [Job(rule, group) for stem, rule, group in rules if stem in made]
    out += [Job("gains", TABLE1, {"task": t}) for t in ex.gains_tasks()]
    out += [Job("sample_curves", TABLE1, {"task": t}) for t in ex.curve_tasks()]
    out += [Job("param_shift_figure", SHIFTS, {"task": t}) for t in ex.shift_tasks()]
    out += [Job("essa_report", ESSA_REFERENCE)] if plan.essa_targets() else []
    return out + [Job(rule, SHARED) for rule in ("claims", "eval_summary", "report_notebook", "ro_crate", "all")]


def _base_rule(p: Pipeline, model: str) -> str:
    """The rule that makes a model's base folder: a build, a download, or links to a folder on disk."""
    entry = p.model(model)
    return "build_tiny" if entry.build is not None else "local_model" if entry.path is not None else "fetch_model"


def plan_jobs(p: Pipeline) -> list[Job]:
    """Every job ``snakemake`` runs for this config from nothing (``-F``), each once."""
    plan, groups = Plan(p), Groups(p)
    out = [Job(_base_rule(p, m), SHARED, {"model": m}) for m in p.all_models()]
    downloaded = set(plan.downloaded_tasks())
    out += [Job("download_data" if task in downloaded else "prepare_data", SHARED, {"task": task})
            for task in (d.rsplit("/", 1)[-1] for d in plan.datasets())]
    return out + _training(plan, groups) + _measurements(plan, groups) + _reports(plan)

