"""The files of a pipeline run: which runs, evaluations, KL measurements, tables and figures exist.

The Snakefiles call this to wire paths (templates from :mod:`esrepro.paths`); keeping it
here makes the DAG's shape unit-testable without Snakemake. Method ``base`` is the
untrained model: its "checkpoint" is the base model directory, and it is evaluated once
(tag seed0), as greedy decoding makes the seed irrelevant.
"""

from __future__ import annotations

import re

from esrepro import paths as P
from esrepro.pipeline import BASE, ESSA_GRPO, ESSA_REF, Pipeline
from esrepro.tasks.math_data import MATH_SETS
from esrepro.tasks.sources import downloads

Run = tuple[str, str, int]  # (model, method, seed)


def keys_regex(keys: list[str]) -> str:
    """A wildcard constraint matching exactly ``keys`` (nothing when empty)."""
    return "|".join(re.escape(k) for k in keys) if keys else "(?!x)x"


class Plan:
    """Paths of every job of a validated pipeline."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline
        self.paths = P.Workspace(pipeline.cfg.workspace)  # where this config's data and results go
        self.models = pipeline.models
        self.seeds = pipeline.seeds

    # --- training runs -------------------------------------------------------------
    def train_runs(self, task: str) -> list[Run]:
        """(model, method, seed) of every run trained on ``task``: its models x methods x the config's seeds, then
        the extra seeds of ``claims.seeds`` and of the ``stability`` block."""
        models, methods = self.p.train_models(task), self.p.train_methods(task)
        out = [(m, meth, s) for m in models for meth in methods for s in self.seeds]
        out += [(m, meth, s) for m in models for meth in methods for s in self.p.claims_seeds(task, m, meth)]
        out += [(m, meth, s) for m in models for meth in methods for s in self.p.stability_seeds(task, m, meth)]
        return list(dict.fromkeys(out))

    def runs(self, task: str) -> list[Run]:
        """(model, method, seed) of every run evaluated on ``task``, base models included.

        Base models: the training task's models when ``task`` (or its ``train_task``) is trained on, else the
        config's models."""
        train_task = self.p.train_task_of(task)
        trained = train_task in self.p.cfg.train
        models = self.p.train_models(train_task) if trained else self.models
        if trained:
            models = list(dict.fromkeys(models + self.p.eval_models(train_task)))
        return [(m, BASE, 0) for m in models] + self.train_runs(train_task) + self.snapshot_runs(train_task)

    def snapshot_runs(self, task: str) -> list[Run]:
        """(model, snapshot name, seed) of every kept snapshot evaluated as a run (``train.<task>.snapshots``): one
        per run of the snapshot's method."""
        snaps = self.p.snapshots(task)
        return [(m, name, s) for name, ref in snaps.items() for m, meth, s in self.train_runs(task)
                if meth == ref.method]

    def weights_at(self, task: str, model: str, ref, seed: int | str) -> str:
        """The weights of ``ref`` ({method, iteration}) for this task, model and seed: the kept snapshot, or the
        final checkpoint at the run's last iteration."""
        run = P.fill(self.paths.RUN, task=task, model=model, method=ref.method, seed=seed)
        last = getattr(self.p.method_settings(model, task, ref.method), "iterations", None)
        if ref.iteration == last:
            return f"{run}/{P.CHECKPOINT}"
        return f"{run}/{P.SNAPSHOTS}/{P.snapshot_name(ref.iteration)}"

    def checkpoint_of(self, task: str, model: str, method: str, seed: int | str) -> str:
        """The weights evaluated on ``task``: the base model, a kept snapshot, or the run's final checkpoint."""
        if method == BASE:
            return P.fill(self.paths.BASE_MODEL, model=model)
        train_task = self.p.train_task_of(task)
        ref = self.p.snapshots(train_task).get(method)
        if ref is not None:
            return self.weights_at(train_task, model, ref, seed)
        run = P.fill(self.paths.RUN, task=train_task, model=model, method=method, seed=seed)
        return f"{run}/{P.CHECKPOINT}"

    def checkpoint_input(self, task: str, model: str, method: str, seed: int | str) -> str:
        """What an evaluation waits for: :meth:`checkpoint_of`, or for a kept snapshot (not a rule's declared
        output) the manifest of the run that keeps it."""
        train_task = self.p.train_task_of(task)
        ref = self.p.snapshots(train_task).get(method) if method != BASE else None
        if ref is None:
            return self.checkpoint_of(task, model, method, seed)
        run = P.fill(self.paths.RUN, task=train_task, model=model, method=ref.method, seed=seed)
        return f"{run}/{P.MANIFEST}"

    def start_dir(self, task: str, model: str, method: str, seed: int | str) -> str:
        """The weights a training run starts from: the base model, or (``start_from``) another run's snapshot."""
        ref = self.p.start_of(model, task, method)
        if ref is None:
            return P.fill(self.paths.BASE_MODEL, model=model)
        return self.weights_at(task, model, ref, seed)

    def start_input(self, task: str, model: str, method: str, seed: int | str) -> str:
        """What a training run waits for: the base model, or the manifest of the run whose snapshot it starts from."""
        ref = self.p.start_of(model, task, method)
        if ref is None:
            return P.fill(self.paths.BASE_MODEL, model=model)
        return f"{P.fill(self.paths.RUN, task=task, model=model, method=ref.method, seed=seed)}/{P.MANIFEST}"

    def methods_regex(self, rl: bool) -> str:
        """Methods trained through a grid (``rl``), or directly (ES and every study method)."""
        trained = {(task, m) for task in self.p.cfg.train for m in self.p.train_methods(task)}
        grid = {m for task, m in trained if self.p.is_rl(task, m)}
        if rl:
            return keys_regex(sorted(grid))
        direct = {m for _, m in trained if m not in grid}
        direct |= {m for name in self.p.studies() for m in self.p.study_methods(name)}
        direct |= {m for t in self.p.essa_tasks() for m in self.p.essa_methods(t)
                   if m != ESSA_GRPO}  # the baseline has its own rule
        return keys_regex(sorted(direct))

    def train_priority(self, method: str) -> int:
        """Snakemake's priority of a training job: 1 for a reference ESSA run, else 0.

        The ESSA study's GRPO baseline starts from the reference run's SFT adapter, so the two run one after the
        other; started first, this chain overlaps the many short jobs instead of ending the run alone."""
        return 1 if method == ESSA_REF else 0

    def cell_runs(self, task: str, model: str, method: str, seed: int | str) -> list[str]:
        """Run directories of every grid cell of an RL method."""
        return [P.fill(self.paths.CELL_RUN, task=task, model=model, method=method, cell=c, seed=seed)
                for c in self.p.grid_cells(model, method)]

    def selections(self, task: str) -> list[str]:
        """selection.json of every RL run trained on ``task``."""
        return [f"{P.fill(self.paths.RUN, task=task, model=m, method=meth, seed=s)}/{P.SELECTION}"
                for m, meth, s in self.train_runs(task) if self.p.is_rl(task, meth)]

    def all_selections(self) -> list[str]:
        """selection.json of every RL run of every training task (Table 3's inputs)."""
        return [path for task in self.p.cfg.train for path in self.selections(task)]

    def curve_logs(self, task: str, method: str) -> list[str]:
        """Training logs of ``method`` on ``task`` (the training-curve figure's inputs)."""
        return [f"{P.fill(self.paths.RUN, task=task, model=m, method=meth, seed=s)}/{P.TRAIN_LOG}"
                for m, meth, s in self.runs(task) if meth == method]

    def labelled_logs(self, logs: list[str]) -> list[str]:
        """``LABEL=PATH`` of training logs, labelled ``<model display> / <METHOD> / seed<s>``."""
        pattern = re.compile(self.paths.RUN.replace("{task}", "[^/]+").replace("{model}", "(?P<model>[^/]+)")
                             .replace("{method}", "(?P<method>[^/]+)").replace("{seed}", "(?P<seed>\\d+)"))
        out = []
        for path in map(str, logs):
            m = pattern.match(path)
            if m is None:
                raise ValueError(f"{path} is not a training log under {self.paths.RUN}")
            label = f"{self.p.model(m['model']).display} / {m['method'].upper()} / seed{m['seed']}"
            out.append(f"{label}={path}")
        return out

    def run_dirs(self) -> list[str]:
        """Every training run directory the evaluations read."""
        dirs = [P.fill(self.paths.RUN, task=self.p.train_task_of(task), model=m, method=meth, seed=s)
                for task in self.p.evaluated_tasks() for m, meth, s in self.runs(task)
                if meth != BASE and meth not in self.p.snapshots(self.p.train_task_of(task))]
        dirs += [self.essa_run(m, meth, s, t) for t in self.p.essa_tasks() for m, meth, s in self.p.essa_runs(t)]
        return list(dict.fromkeys(dirs))

    # --- models and data ---------------------------------------------------------------
    def built_models_regex(self) -> str:
        return keys_regex([k for k, e in self.p.registry.items() if e.build is not None])

    def pinned_inputs(self, model: str) -> list[str]:
        """The pin folder a built model is copied from (empty when its registry entry has none)."""
        pinned = self.p.model(model).pinned
        return [] if pinned is None else [pinned.path]

    def rebuilds(self) -> list[str]:
        """The comparison of each pinned model the run uses with its rebuild from scratch (verify_models)."""
        return [P.fill(self.paths.REBUILD, model=m) for m in self.p.all_models() if self.p.model(m).pinned]

    def hub_models_regex(self) -> str:
        return keys_regex([k for k, e in self.p.registry.items() if e.hub_id is not None])

    def downloaded_tasks(self) -> list[str]:
        """Tasks whose data source downloads (hub, url, the authors' file by url): prepared on the submitting host."""
        return [t for t, d in self.p.cfg.data.items() if downloads(d.source.model_dump(exclude_none=True))]

    def prepared_tasks_regex(self, downloaded: bool) -> str:
        """The tasks whose data the download rule (``downloaded``) or the local preparation rule prepares."""
        chosen = set(self.downloaded_tasks())
        return keys_regex(sorted(t for t in self.p.cfg.data if (t in chosen) == downloaded))

    def build_inputs(self, model: str) -> list[str]:
        """Prepared data a built model's warm start must stay disjoint from (each warm-start task's)."""
        tasks = self.p.model(model).build.sft.task_problems()
        return [P.fill(self.paths.PREPARED, task=t) for t in tasks if t in self.p.cfg.data]

    def datasets(self) -> list[str]:
        """data/prepared/{task} of every task the run reads: evaluated, trained on, warm-started on."""
        dirs: list[str] = []
        for task in self.p.evaluated_tasks():
            dirs.append(P.fill(self.paths.PREPARED, task=task))
            if any(meth != BASE for _, meth, _ in self.runs(task)):
                dirs.append(P.fill(self.paths.PREPARED, task=self.p.train_task_of(task)))
        for model in self.p.all_models():
            if self.p.model(model).build is not None:
                dirs += self.build_inputs(model)
        dirs += [P.fill(self.paths.PREPARED, task=t) for t in self.p.essa_tasks()]
        return list(dict.fromkeys(dirs))

    def model_dirs(self) -> list[str]:
        """Every base model directory of the run: every model a job touches (studies' included)."""
        return [P.fill(self.paths.BASE_MODEL, model=m) for m in self.p.all_models()]

    # --- evaluation and KL ---------------------------------------------------------------
    def eval_dir(self, task: str, model: str, method: str, seed: int | str) -> str:
        return P.fill(self.paths.EVAL, task=task, model=model, method=method, seed=seed,
                      split=self.p.eval_settings(task).split)

    def eval_metrics(self) -> list[str]:
        """metrics.json of every configured evaluation (each task, model, method, seed)."""
        return self.task_metrics(self.p.evaluated_tasks())

    def task_metrics(self, tasks: list[str]) -> list[str]:
        """metrics.json of every evaluation of ``tasks``."""
        return [f"{self.eval_dir(task, *run)}/metrics.json" for task in tasks for run in self.runs(task)]

    def table1_metrics(self) -> list[str]:
        task = self.p.cfg.report.table1.task
        return [f"{self.eval_dir(task, *run)}/metrics.json" for run in self.runs(task)]

    def kl_runs(self) -> list[tuple[str, str, str, int]]:
        """(task, model, method, seed) of every KL measurement: each run of a task with a ``kl`` entry (the
        task's training runs and their base models, every study run and the study's base model)."""
        out: list[tuple[str, str, str, int]] = []
        for task in self.p.cfg.kl:
            if self.p.train_methods(task):
                out += [(task, m, BASE, 0) for m in self.p.train_models(task)]
            out += [(task, m, meth, s) for m, meth, s in self.train_runs(task)]
        for name, study in self.p.studies().items():
            out += [(study.task, m, BASE, 0) for m in study.models]
            out += [(study.task, m, meth, s) for m, meth, s in self.p.study_runs(name)]
        return list(dict.fromkeys(out))

    def kl_targets(self) -> list[str]:
        return [f"{P.fill(self.paths.KL, task=t, model=m, method=meth, seed=s)}/kl.json"
                for t, m, meth, s in self.kl_runs()]

    def kl_model_dir(self, task: str, model: str, method: str, seed: int | str) -> str:
        """The weights KL is measured for: the base model, or the run's final checkpoint."""
        if method == BASE:
            return P.fill(self.paths.BASE_MODEL, model=model)
        return f"{P.fill(self.paths.RUN, task=task, model=model, method=method, seed=seed)}/{P.CHECKPOINT}"

    def kl_run_dir(self, task: str, model: str, method: str, seed: int | str) -> str | None:
        """The run whose manifest lists the kept snapshots (None for the base model)."""
        return None if method == BASE else P.fill(self.paths.RUN, task=task, model=model, method=method, seed=seed)

    # --- the conciseness study ---------------------------------------------------------------
    def conciseness_kl(self) -> list[str]:
        """kl.json of the conciseness study: the base model and every run."""
        study = self.p.studies().get("conciseness")
        if study is None:
            return []
        runs = [*((m, BASE, 0) for m in study.models), *self.p.study_runs("conciseness")]
        return [f"{P.fill(self.paths.KL, task=study.task, model=m, method=meth, seed=s)}/kl.json"
                for m, meth, s in runs]

    # --- tables, figures, reports ----------------------------------------------------------------
    def table_targets(self) -> list[str]:
        """Every table and figure file of the run (their manifests excluded)."""
        t1 = self.p.cfg.report.table1.task
        out = [f"{self.paths.TABLE1}.{e}" for e in ("csv", "md", "tex", "metrics.json")]
        if self.all_selections():
            out += [f"{self.paths.TABLE3}.{e}" for e in ("csv", "md", "tex")]
        if self.curve_logs(t1, "es"):
            out += [f"{self.paths.CURVES}.{e}" for e in ("png", "pdf", "csv")]
        if self.p.studies().get("conciseness"):
            out += [f"{stem}.{e}" for stem in (self.paths.TABLE2, self.paths.CONCISENESS_STABILITY)
                    for e in ("csv", "md", "tex")]
            out += [f"{stem}.{e}" for stem in (self.paths.PARETO, self.paths.DISTRIBUTION)
                    for e in ("png", "pdf", "csv")]
        out += self.essa_targets()
        out += ExtrasPlan(self).targets()
        out += [f"{self.paths.CLAIMS_FIGURE}.{e}" for e in ("png", "pdf", "csv")]
        return out + [f"{self.paths.CLAIMS}.{e}" for e in ("csv", "md", "tex")]

    def final_targets(self) -> list[str]:
        out = self.table_targets() + self.eval_metrics() + self.kl_targets() + self.essa_eval_metrics()
        return list(dict.fromkeys(out))

    def report_files(self) -> list[str]:
        return [p for p in self.table_targets() if p.startswith((self.paths.TABLES, self.paths.FIGURES))]

    def manifests(self) -> list[str]:
        """Every step manifest of the run: data, models, runs, evaluations, tables and figures."""
        out = [f"{d}/{P.MANIFEST}" for d in self.datasets() + self.model_dirs() + self.run_dirs()]
        out += [f"{p.rsplit('/', 1)[0]}/{P.MANIFEST}"
                for p in dict.fromkeys(self.eval_metrics() + self.essa_eval_metrics())]
        stems = dict.fromkeys(p.split(".", 1)[0] for p in self.report_files())
        return out + [f"{stem}.manifest.json" for stem in stems]

    # --- the ESSA study --------------------------------------------------------------------
    def essa_run(self, model: str, method: str, seed: int | str, task: str | None = None) -> str:
        """An ESSA study run's directory (on ``task``; the study's own task when None)."""
        study = self.p.essa_study()
        assert study is not None, "no studies.essa in this config"
        return P.fill(self.paths.RUN, task=task or study.task, model=model, method=method, seed=seed)

    def essa_grpo_regex(self) -> str:
        """The GRPO baseline's method name when the study has one (its own rule trains it)."""
        return keys_regex([ESSA_GRPO] if ESSA_GRPO in self.p.essa_methods() else [])

    def essa_ref_run(self, model: str, seed: int | str, task: str | None = None) -> str:
        """The reference ESSA run (on ``task``) whose SFT adapter the GRPO baseline starts from."""
        return self.essa_run(model, ESSA_REF, seed, task)

    def essa_eval_metrics(self) -> list[str]:
        """metrics.json of every ESSA study run and of its base models, on each study task's eval split."""
        out = []
        for task in self.p.essa_tasks():
            runs = [(m, BASE, 0) for m in self.p.essa_models(task)] + self.p.essa_runs(task)
            out += [f"{self.eval_dir(task, m, meth, s)}/metrics.json" for m, meth, s in runs]
        return out

    def essa_inputs(self) -> dict[str, list[str]]:
        """What the ESSA figures read: run logs and manifests, evaluations (run_dir/metrics per run)."""
        runs = [self.essa_run(m, meth, s, t) for t in self.p.essa_tasks() for m, meth, s in self.p.essa_runs(t)]
        return {"runs": runs, "metrics": self.essa_eval_metrics()}

    def essa_figures(self) -> list[str]:
        """Stems of the ESSA figures this config makes (a sweep without values makes none)."""
        study = self.p.essa_study()
        if study is None:
            return []
        out = [self.paths.ESSA_POPULATION] if study.populations else []
        out += [self.paths.ESSA_RANK] if study.ranks else []
        out += [self.paths.ESSA_ENGINES] if study.engines else []
        out += [self.paths.ESSA_PRECISION] if study.precisions else []
        out += [self.paths.ESSA_WALLCLOCK] if study.grpo is not None else []
        out += [self.paths.ESSA_SCALING] if study.scaling is not None else []
        return out

    def essa_targets(self) -> list[str]:
        """Every ESSA table and figure file (manifests excluded)."""
        if self.p.essa_study() is None:
            return []
        out = [f"{self.paths.ESSA_TABLE}.{e}" for e in ("csv", "md")]
        return out + [f"{stem}.{e}" for stem in self.essa_figures() for e in ("png", "pdf", "csv")]


PUZZLES = ("sudoku", "arc")
TABLE = ("csv", "md", "tex")
FIGURE = ("png", "pdf", "csv")

RunKey = tuple[str, str, str, int]  # (task, model, method, seed)


class ExtrasPlan:
    """Paths of the ``report.extras`` jobs of a :class:`Plan`: which runs feed Figures 3, 5-9 and the math,
    puzzle, per-task and stability tables, and which of those files a config writes; with them the ES-variants table
    (written whenever Table 1's task trains a low-rank ES method beside ES)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.p = plan.p
        self.extras = set(self.p.cfg.report.extras)

    # --- Figure 6 ---------------------------------------------------------------------------------
    def gains_tasks(self) -> list[str]:
        """Tasks with a gains figure: Table 1's task, when it is trained on."""
        task = self.p.cfg.report.table1.task
        return [task] if "gains" in self.extras and self.p.train_methods(task) else []

    # --- Figure 7 ---------------------------------------------------------------------------------
    def periodic_runs(self, task: str) -> list[str]:
        """Run directories of ``task``'s runs that evaluate periodically (``eval_every``)."""
        out = []
        for model, method, seed in self.plan.train_runs(task):
            if getattr(self.p.method_settings(model, task, method), "eval_every", None) is not None:
                out.append(P.fill(self.plan.paths.RUN, task=task, model=model, method=method, seed=seed))
        return out

    def curve_tasks(self) -> list[str]:
        """Training tasks with a sample-curves figure (some run evaluates periodically)."""
        if "sample_curves" not in self.extras:
            return []
        return [t for t in self.p.cfg.train if self.periodic_runs(t)]

    # --- Figures 8-10 --------------------------------------------------------------------------------
    def es_runs(self) -> list[RunKey]:
        """(task, model, method, seed) of every ES run from its base model: training runs of ES methods and every
        study's ES runs (a run with ``start_from`` has no random walk from the base model to compare with; ES's
        variants beside the papers, :meth:`~esrepro.pipeline.Pipeline.is_es_variant`, are not the papers' ES)."""
        out = [(task, m, meth, s) for task in self.p.cfg.train for m, meth, s in self.plan.train_runs(task)
               if self.p.algorithm_of(task, meth).name == "es" and self.p.start_of(m, task, meth) is None
               and not self.p.is_es_variant(task, meth)]
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
        return [f"{P.fill(self.plan.paths.PARAM_SHIFT, task=t, model=m, method=meth, seed=s)}/histogram.json"
                for t, m, meth, s in self.es_runs() if t == task]

    def shift_methods_regex(self) -> str:
        return keys_regex(sorted({meth for _, _, meth, _ in self.es_runs()}))

    # --- Figures 4-5 (v2): the conciseness learning-rate sweep ----------------------------------------------
    def lr_sweep_kl(self) -> list[str]:
        """kl.json of the sweep's runs and base model, and of the conciseness study's ES runs (the comparison)."""
        if "lr_sweep" not in self.extras or "conciseness_lr" not in self.p.studies():
            return []
        sweep = self.p.studies()["conciseness_lr"]
        runs = [(sweep.task, m, BASE, 0) for m in sweep.models]
        runs += [(sweep.task, m, meth, s) for m, meth, s in self.p.study_runs("conciseness_lr")]  # its own ES too
        main = self.p.studies().get("conciseness")
        if main is not None and main.task == sweep.task:
            runs += [(main.task, m, meth, s) for m, meth, s in self.p.study_runs("conciseness")
                     if self.p.algorithm_of(main.task, meth).name == "es"]
        return [f"{P.fill(self.plan.paths.KL, task=t, model=m, method=meth, seed=s)}/kl.json"
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

    def math_figure_model(self) -> str | None:
        """The model of Figure 2's ES and base bars: the first model trained on the math sets' training task (None:
        no math figure, when ``math`` is not an extra or no math set is evaluated on a trained task)."""
        sets = self.math_sets()
        if "math" not in self.extras or not sets:
            return None
        return self.p.train_models(self.p.train_task_of(sets[0]))[0]

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

    # --- beyond the papers: low-rank ES beside full-rank ES ---------------------------------------------------
    def es_variants(self) -> list[str]:
        """Table 1's task's ES variants (low-rank ES, and ES with noise on the linear projections only:
        :meth:`~esrepro.pipeline.Pipeline.is_es_variant`), when ES trains beside them (else none)."""
        task = self.p.cfg.report.table1.task
        if task not in self.p.cfg.train or "es" not in self.p.train_methods(task):
            return []
        return [m for m in self.p.train_methods(task) if self.p.is_es_variant(task, m)]

    def es_variant_metrics(self) -> list[str]:
        """metrics.json of Table 1's test set for its base models, ES and the ES variants (every seed)."""
        variants = self.es_variants()
        if not variants:
            return []
        task, keep = self.p.cfg.report.table1.task, {BASE, "es", *variants}
        return [f"{self.plan.eval_dir(task, *run)}/metrics.json" for run in self.plan.runs(task) if run[1] in keep]

    # --- every file ------------------------------------------------------------------------------------
    def targets(self) -> list[str]:
        """Every extras table and figure file this config writes (their manifests excluded)."""
        out: list[str] = []
        paths = self.plan.paths
        out += [f"{P.fill(paths.GAINS, task=t)}.{e}" for t in self.gains_tasks() for e in FIGURE]
        out += [f"{P.fill(paths.SAMPLE_CURVES, task=t)}.{e}" for t in self.curve_tasks() for e in FIGURE]
        out += [f"{P.fill(paths.PARAM_SHIFT_FIGURE, task=t)}.{e}" for t in self.shift_tasks() for e in FIGURE]
        if self.lr_sweep_kl():
            out += [f"{stem}.{e}" for stem in (paths.LR_SWEEP, paths.LR_DISTRIBUTIONS) for e in FIGURE]
        if self.math_figure_model() is not None:
            out += [f"{paths.MATH_FIGURE}.{e}" for e in FIGURE]
        for stem, inputs in ((paths.TRAIN_TASKS, self.train_task_metrics()), (paths.MATH_TABLE, self.math_metrics()),
                             (paths.PUZZLE_TABLE, self.puzzle_metrics()), (paths.STABILITY, self.stability_metrics()),
                             (paths.ES_VARIANTS, self.es_variant_metrics())):
            if inputs:
                out += [f"{stem}.{e}" for e in TABLE]
        return out
