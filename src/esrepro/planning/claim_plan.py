"""Which runs decide each claim of the claims table: per row, the selectors of the files its rule reads
(:mod:`esrepro.report.claims.evidence`), those files as paths of this configuration, the run keys behind them and
the row's own target (``results/claims/<row>.csv``, whose rule builds only that row's jobs).

Rows follow the configuration: one ES-against-RL row per Table 1 model, the conciseness rows when the study is
configured, the ESSA rows when the ESSA study is, the low-rank ES row when Table 1's task trains low-rank ES beside
ES. The claims themselves are listed in :mod:`esrepro.report.claims.catalogue`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from esrepro import paths as P
from esrepro.pipeline import BASE, ESSA_GRPO, ESSA_REF, ESSA_SWEEPS, Pipeline
from esrepro.planning.plan import PUZZLES, ExtrasPlan, Plan
from esrepro.report.claims.catalogue import V1_RL, row_id

Selectors = dict[str, list[list[str]]]
#: The ESSA sweeps' keys by the row that reads them (with the reference run).
ESSA_ROW_SWEEPS = {"essa_time_falls_with_gpus": "engines", "essa_moderate_population": "populations",
                   "essa_rank": "ranks", "essa_quantised": "precisions"}
SWEEP_PREFIX = {key: prefix for key, _, prefix in ESSA_SWEEPS}
#: The convergence-speed row of each ESSA sweep row (the same runs).
SPEED_OF = {"essa_moderate_population": "essa_population_speed", "essa_rank": "essa_rank_speed",
            "essa_quantised": "essa_quantised_speed"}


def size_of(text: str) -> float | None:
    """A registry ``size`` ("0.5B", "7B", "1M") in parameters (None: not a size)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMB])\s*", text or "", flags=re.I)
    return float(m.group(1)) * {"K": 1e3, "M": 1e6, "B": 1e9}[m.group(2).upper()] if m else None


def smallest(models: Sequence[str], sizes: Mapping[str, str]) -> str | None:
    """The smallest of ``models`` by their registry sizes (models without a size last, then in order)."""
    if not models:
        return None
    return min(models, key=lambda m: (size_of(sizes.get(m, "")) is None, size_of(sizes.get(m, "")) or 0.0,
                                      list(models).index(m)))


class ClaimPlan:
    """The claims' rows of a :class:`~esrepro.planning.plan.Plan`: selectors, files, run keys and targets."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.p: Pipeline = plan.p
        self._selectors: dict[str, Selectors] | None = None

    # --- selectors ----------------------------------------------------------------------------------------------
    def selectors(self) -> dict[str, Selectors]:
        """Every planned row's selectors, in the catalogue's order of claims."""
        if self._selectors is None:
            out: dict[str, Selectors] = {}
            out.update(self._countdown())
            out.update(self._conciseness())
            out.update(self._math_puzzles())
            out.update(self._essa())
            out.update(self._es_variants())
            self._selectors = {k: v for k, v in out.items() if any(v.values())}
        return self._selectors

    def rows(self) -> list[str]:
        return list(self.selectors())

    def _countdown(self) -> dict[str, Selectors]:
        p, t1 = self.p, self.p.cfg.report.table1
        if t1.task not in p.cfg.train or "es" not in p.train_methods(t1.task):
            return {}
        rl = [m for m in p.train_methods(t1.task) if p.is_rl(t1.task, m)]
        models = p.train_models(t1.task)
        out: dict[str, Selectors] = {
            "es_improves_base": {"evals": [[t1.task, t1.split, m, meth] for m in models for meth in ("es", BASE)]}}
        for m in models:
            if rl:
                out[row_id("es_beats_rl", m)] = {"evals": [[t1.task, t1.split, m, meth] for meth in ("es", *rl)]}
        small = self.small_model()
        if small is not None:
            out["es_small_models_v1"] = {"evals": [[t1.task, t1.split, small, meth] for meth in ("es", BASE, *rl)
                                                   if meth in ("es", BASE, *V1_RL)]}
        out["rl_sensitive_hyperparameters"] = {"grids": [[t1.task, m, meth] for m in models for meth in rl
                                                         if len(p.grid_cells(m, meth)) > 1]}
        periodic = []
        for d in ExtrasPlan(self.plan).periodic_runs(t1.task):
            task, model, method = d.rstrip("/").split("/")[-4:-1]
            if method == "es" or method in rl:
                periodic.append([task, model, method])
        periodic = [list(k) for k in dict.fromkeys(map(tuple, periodic))]
        if any(k[2] == "es" for k in periodic) and any(k[2] != "es" for k in periodic):
            out["es_ahead_throughout"] = {"periodic": periodic}
            v1 = [k for k in periodic if k[2] in ("es", *V1_RL)]
            if any(k[2] != "es" for k in v1):
                out["es_sample_efficiency_v1"] = {"periodic": v1}
        return out

    def _es_variants(self) -> dict[str, Selectors]:
        variants = ExtrasPlan(self.plan).es_variants()
        if not variants:
            return {}
        t1 = self.p.cfg.report.table1
        return {"eggroll_matches_es": {"evals": [[t1.task, t1.split, m, meth] for m in self.p.train_models(t1.task)
                                                 for meth in (BASE, "es", *variants)]}}

    def _conciseness(self) -> dict[str, Selectors]:
        p, out = self.p, {}
        study = p.studies().get("conciseness")
        if study is None:
            return out
        runs = [*((m, BASE) for m in study.models), *((m, meth) for m, meth, _ in p.study_runs("conciseness"))]
        kl = [[study.task, m, meth] for m, meth in dict.fromkeys(runs)]
        for row in ("es_pareto", "grpo_small_beta_hacks", "es_stable_across_runs", "es_kl_stable"):
            out[row] = {"kl": kl}
        sweep = p.studies().get("conciseness_lr")
        if sweep is not None and sweep.task == study.task:
            lr = [*((m, BASE) for m in sweep.models), *((m, meth) for m, meth, _ in p.study_runs("conciseness_lr"))]
            es = [(m, meth) for m, meth, _ in p.study_runs("conciseness")
                  if p.algorithm_of(study.task, meth).name == "es"]
            out["es_pareto_lr"] = {"kl": [[study.task, m, meth] for m, meth in dict.fromkeys(lr + es)]}
            swept = [(m, meth) for m, meth, _ in p.study_runs("conciseness_lr")]
            out["grpo_lr_raises_reward_kl"] = {"kl": [[study.task, m, meth] for m, meth in dict.fromkeys(swept)]}
            out["grpo_near_base_es_shifts"] = out["es_pareto_lr"]
        return out

    def _math_puzzles(self) -> dict[str, Selectors]:
        p, out = self.p, {}
        sets = ExtrasPlan(self.plan).math_sets()
        if sets:
            evals = [[t, "test", m, meth] for t in sets for m, meth, _ in self.plan.runs(t)]
            evals = [list(k) for k in dict.fromkeys(map(tuple, evals))]
            out["es_improves_math"] = {"evals": evals}
            out["es_competitive_math"] = {"evals": evals}
        for task, row in zip(PUZZLES, ("es_lifts_sudoku", "es_lifts_arc"), strict=True):
            if task in p.cfg.train and task in p.evaluated_tasks() and "es" in p.train_methods(task):
                out[row] = {"evals": [[task, "test", m, meth] for m in p.train_models(task) for meth in ("es", BASE)]}
        return out

    def small_model(self) -> str | None:
        """The smallest of Table 1's models by the registry's size (v1's small-model claim)."""
        p, t1 = self.p, self.p.cfg.report.table1
        if t1.task not in p.cfg.train or "es" not in p.train_methods(t1.task):
            return None
        models = p.train_models(t1.task)
        return smallest(models, {m: p.model(m).size for m in models})

    def math_model(self) -> str | None:
        """The model of the math claims' ES and base runs (the first model trained on the math sets' task)."""
        sets = ExtrasPlan(self.plan).math_sets()
        return self.p.train_models(self.p.train_task_of(sets[0]))[0] if sets else None

    def _essa(self) -> dict[str, Selectors]:
        p, out = self.p, {}
        study = p.essa_study()
        if study is None:
            return out
        task = study.task
        per_model = {m: p.essa_methods(task, m) for m in p.essa_models(task)}
        resample = SWEEP_PREFIX["resample"]
        grpo = [[task, m, meth] for m, methods in per_model.items() if ESSA_GRPO in methods
                for meth in methods if meth in (ESSA_REF, ESSA_GRPO) or meth.startswith(resample)]
        out["essa_faster_than_grpo"] = {"runs": grpo}
        out["essa_fig8_accuracy"] = {"runs": grpo}
        out["essa_data_efficiency"] = {"runs": grpo}
        for row, key in ESSA_ROW_SWEEPS.items():
            swept = {meth for _, meth in p.essa_sweep(key)}
            out[row] = {"runs": [[task, m, meth] for m, methods in per_model.items() if swept & set(methods)
                                 for meth in methods if meth == ESSA_REF or meth in swept]}
            if row in SPEED_OF:
                out[SPEED_OF[row]] = out[row]
        fig6 = []
        if study.scaling is not None:
            fig6 += [[study.scaling.task, m, ESSA_REF] for m in p.essa_models(study.scaling.task)]
        fig6 += [[task, m, ESSA_REF] for m in study.sweep_models.get("precisions", [])]
        out["essa_improves_over_training"] = {"runs": fig6}
        return out

    # --- files and run keys ---------------------------------------------------------------------------------------
    def _seeds(self, task: str, model: str, method: str, kind: str) -> list[int]:
        p = self.p
        if kind == "evals":
            return [s for m, meth, s in self.plan.runs(task) if (m, meth) == (model, method)]
        if kind == "kl":
            return sorted({s for t, m, meth, s in self.plan.kl_runs() if (t, m, meth) == (task, model, method)}
                          | ({0} if method == BASE else set()))
        if kind == "runs":
            return [s for m, meth, s in p.essa_runs(task) if (m, meth) == (model, method)]
        if kind == "grids":
            return [s for m, meth, s in self.plan.train_runs(task) if (m, meth) == (model, method)]
        return [s for m, meth, s in self.plan.train_runs(task) if (m, meth) == (model, method)]

    def keys(self, row: str) -> list[tuple[str, str, str, str, int]]:
        """(kind, task, model, method, seed) of every run a row reads (evaluations: task is the evaluated set)."""
        out = []
        for kind, selected in self.selectors()[row].items():
            for sel in selected:
                task, model, method = (sel[0], sel[2], sel[3]) if kind == "evals" else tuple(sel)
                out += [(kind, task, model, method, s) for s in self._seeds(task, model, method, kind)]
        return list(dict.fromkeys(out))

    def files(self, row: str) -> list[str]:
        """The files a row's rule reads: metrics.json with responses.jsonl, kl.json with samples.jsonl, a run's
        manifest.json (with log.jsonl for the ESSA runs)."""
        R, out = self.plan.paths, []
        splits = {(s[0], s[2], s[3]): s[1] for s in self.selectors()[row].get("evals", [])}
        for kind, task, model, method, seed in self.keys(row):
            if kind == "evals":
                d = P.fill(R.EVAL, task=task, model=model, method=method, seed=seed, split=splits[task, model, method])
                out += [f"{d}/metrics.json", f"{d}/responses.jsonl"]
            elif kind == "kl":
                d = P.fill(R.KL, task=task, model=model, method=method, seed=seed)
                out += [f"{d}/kl.json", f"{d}/samples.jsonl"]
            elif kind == "grids":
                out.append(f"{P.fill(R.RUN, task=task, model=model, method=method, seed=seed)}/{P.SELECTION}")
            else:
                d = P.fill(R.RUN, task=task, model=model, method=method, seed=seed)
                out += [f"{d}/{P.MANIFEST}"] + ([f"{d}/{P.TRAIN_LOG}"] if kind == "runs" else [])
        return list(dict.fromkeys(out))

    def all_files(self) -> list[str]:
        """Every file the claims table reads (the claims rule's inputs)."""
        return list(dict.fromkeys(f for row in self.rows() for f in self.files(row)))

    def target(self, row: str) -> str:
        """A row's own table (``.csv``): the target that builds only the jobs deciding it."""
        return f"{P.fill(self.plan.paths.CLAIM, claim=row)}.csv"
