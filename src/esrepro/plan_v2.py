"""The v2 part of the plan (issue 13): which runs feed Figures 3, 5-9 and the math, puzzle, per-task and
stability tables, and which of those files a config writes (``report.extras``).

Kept apart from :mod:`esrepro.plan` so the Table 1 / Table 2 wiring stays as it was; the Snakefile
rules in ``workflow/rules/v2.smk`` read these lists.
"""

from __future__ import annotations

from esrepro import paths as P
from esrepro.pipeline import BASE
from esrepro.plan import Plan
from esrepro.tasks.math_data import MATH_SETS

PUZZLES = ("sudoku", "arc")
TABLE = ("csv", "md", "tex")
FIGURE = ("png", "pdf", "csv")

RunKey = tuple[str, str, str, int]  # (task, model, method, seed)


class V2Plan:
    """Paths of the v2 jobs of a :class:`~esrepro.plan.Plan`."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.p = plan.p
        self.extras = set(self.p.cfg.report.extras)

    # --- Figure 5 ---------------------------------------------------------------------------------
    def gains_tasks(self) -> list[str]:
        """Tasks with a gains figure: Table 1's task, when it is trained on."""
        task = self.p.cfg.report.table1.task
        return [task] if "gains" in self.extras and self.p.train_methods(task) else []

    # --- Figure 6 ---------------------------------------------------------------------------------
    def periodic_runs(self, task: str) -> list[str]:
        """Run directories of ``task``'s runs that evaluate periodically (``eval_every``)."""
        out = []
        for model, method, seed in self.plan.train_runs(task):
            if getattr(self.p.method_settings(model, task, method), "eval_every", None) is not None:
                out.append(P.fill(P.RUN, task=task, model=model, method=method, seed=seed))
        return out

    def curve_tasks(self) -> list[str]:
        """Training tasks with a sample-curves figure (some run evaluates periodically)."""
        if "sample_curves" not in self.extras:
            return []
        return [t for t in self.p.cfg.train if self.periodic_runs(t)]

    # --- Figures 7-9 --------------------------------------------------------------------------------
    def es_runs(self) -> list[RunKey]:
        """(task, model, method, seed) of every ES run: training runs of ES methods and every study's ES runs."""
        out = [(task, m, meth, s) for task in self.p.cfg.train for m, meth, s in self.plan.train_runs(task)
               if self.p.algorithm_of(task, meth).name == "es"]
        for name, study in self.p.studies().items():
            out += [(study.task, m, meth, s) for m, meth, s in self.p.study_runs(name)
                    if self.p.algorithm_of(study.task, meth).name == "es"]
        return list(dict.fromkeys(out))

    def shift_tasks(self) -> list[str]:
        """Tasks with a parameter-shift figure (one per task with ES runs)."""
        if "param_shift" not in self.extras:
            return []
        return list(dict.fromkeys(t for t, _, _, _ in self.es_runs()))

    def shift_histograms(self, task: str) -> list[str]:
        """histogram.json of every ES run of ``task``."""
        return [f"{P.fill(P.PARAM_SHIFT, task=t, model=m, method=meth, seed=s)}/histogram.json"
                for t, m, meth, s in self.es_runs() if t == task]

    def shift_methods_regex(self) -> str:
        from esrepro.plan import keys_regex

        return keys_regex(sorted({meth for _, _, meth, _ in self.es_runs()}))

    # --- Figures 3-4: the conciseness learning-rate sweep ----------------------------------------------
    def lr_sweep_kl(self) -> list[str]:
        """kl.json of the sweep's runs and base model, and of the conciseness study's ES runs (the comparison)."""
        if "lr_sweep" not in self.extras or "conciseness_lr" not in self.p.studies():
            return []
        sweep = self.p.studies()["conciseness_lr"]
        runs = [(sweep.task, sweep.model, BASE, 0)]
        runs += [(sweep.task, m, meth, s) for m, meth, s in self.p.study_runs("conciseness_lr")]  # its own ES too
        main = self.p.studies().get("conciseness")
        if main is not None and main.task == sweep.task:
            runs += [(main.task, m, meth, s) for m, meth, s in self.p.study_runs("conciseness")
                     if self.p.algorithm_of(main.task, meth).name == "es"]
        return [f"{P.fill(P.KL, task=t, model=m, method=meth, seed=s)}/kl.json"
                for t, m, meth, s in dict.fromkeys(runs)]

    # --- tables --------------------------------------------------------------------------------------
    def train_task_metrics(self) -> list[str]:
        """metrics.json of every test set of every training task (the per-task table's inputs)."""
        if "train_tasks" not in self.extras:
            return []
        return self.plan.task_metrics([s for t in self.p.cfg.train for s in self.p.eval_sets_of(t)])

    def math_sets(self) -> list[str]:
        """The math sets evaluated on a trained task's runs (``evaluate.<set>.train_task``)."""
        return [t for t in MATH_SETS if t in self.p.evaluated_tasks() and self.p.train_task_of(t) in self.p.cfg.train]

    def math_metrics(self) -> list[str]:
        return self.plan.task_metrics(self.math_sets()) if "math" in self.extras else []

    def puzzle_tasks(self) -> list[str]:
        return [t for t in PUZZLES if t in self.p.cfg.train and t in self.p.evaluated_tasks()]

    def puzzle_metrics(self) -> list[str]:
        return self.plan.task_metrics(self.puzzle_tasks()) if "puzzles" in self.extras else []

    def stability_metrics(self) -> list[str]:
        """metrics.json of the stability task's test sets (every model and seed)."""
        st = self.p.cfg.stability
        if "stability" not in self.extras or st is None:
            return []
        return self.plan.task_metrics(self.p.eval_sets_of(st.task))

    # --- every file ------------------------------------------------------------------------------------
    def targets(self) -> list[str]:
        """Every v2 table and figure file this config writes (their manifests excluded)."""
        out: list[str] = []
        out += [f"{P.fill(P.GAINS, task=t)}.{e}" for t in self.gains_tasks() for e in FIGURE]
        out += [f"{P.fill(P.SAMPLE_CURVES, task=t)}.{e}" for t in self.curve_tasks() for e in FIGURE]
        out += [f"{P.fill(P.PARAM_SHIFT_FIGURE, task=t)}.{e}" for t in self.shift_tasks() for e in FIGURE]
        if self.lr_sweep_kl():
            out += [f"{stem}.{e}" for stem in (P.LR_SWEEP, P.LR_DISTRIBUTIONS) for e in FIGURE]
        for stem, inputs in ((P.TRAIN_TASKS, self.train_task_metrics()), (P.MATH_TABLE, self.math_metrics()),
                             (P.PUZZLE_TABLE, self.puzzle_metrics()), (P.STABILITY, self.stability_metrics())):
            if inputs:
                out += [f"{stem}.{e}" for e in TABLE]
        return out
