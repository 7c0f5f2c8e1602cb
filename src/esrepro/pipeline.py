"""A validated run configuration: every setting a job reads, resolved through its layers.

Method settings are layered, later layers winning: the code's defaults (the paper's
values, :mod:`esrepro.settings.methods`), ``defaults.<family>``, ``methods.<method>``,
``train.<task>.<method>``, the registry's ``models.<model>.methods.<method>`` and, for
an RL grid, the cell's values. Studies expand into methods of their own
(``es_sigma<value>``, ``grpo_beta<value>``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from esrepro.rl.budget import es_sample_budget
from esrepro.settings.layers import ConfigError, Layer, at, resolve
from esrepro.settings.methods import FORMER_NAMES, Algorithm, MethodSettings, algorithm
from esrepro.settings.pipeline import ESSAStudy, EvalSettings, KLSettings, PipelineConfig, Study
from esrepro.settings.registry import ModelEntry, Resources

BASE = "base"  # the untrained model, evaluated as a method of its own
CODE = "esrepro.settings"  # where the code's defaults come from, in messages
#: Short names of grid keys in cell directory names, by a setting's former name (FORMER_NAMES), so they stay.
CELL_KEY_NAMES = {"learning_rate": "lr", "actor_learning_rate": "alr", "critic_learning_rate": "clr",
                  "kl_coef": "kl", "beta": "beta",
                  # v2: explicit cells (registry methods.<m>.cells), e.g. the authors' GRPO-Zero settings
                  "per_device_train_batch_size": "pbs", "gradient_accumulation_steps": "ga",
                  "max_completion_length": "len", "num_generations": "g"}
#: Registry keys of methods.<method> that are not settings: the grid's value lists and its explicit extra cells.
GRID_KEYS = ("grid", "cells")
DEFAULT_CELL = "default"
CPU_ONLY_RULES = ("fetch",)
FETCH_MEM_MB = 8000  # a download needs no more, whatever the model's GPU jobs ask for
#: A study's swept hyperparameter per algorithm: (sweep block key, setting name, method-name prefix).
SWEEPS = {"es": ("sigmas", "sigma", "es_sigma"), "grpo": ("betas", "beta", "grpo_beta")}
#: The ESSA study's sweeps: (study key, ESSA setting, method-name prefix), one run per value.
ESSA_SWEEPS = (("populations", "population", "essa_pop"), ("ranks", "rank", "essa_rank"),
               ("engines", "engines", "essa_eng"), ("precisions", "precision", "essa_"),
               ("resample", "resample_per_step", "essa_resample"))
ESSA_STUDY = "essa"
ESSA_REF = "essa_ref"  # the ESSA study's reference run
ESSA_GRPO = "essa_grpo"  # its GRPO baseline from the reference run's SFT start


def cell_key_name(key: str, algorithm: str) -> str:
    """A grid key's short name in ``algorithm``'s cell directory names (as before any rename)."""
    former = FORMER_NAMES.get(algorithm, {}).get(key, key)
    return CELL_KEY_NAMES.get(former, former)


def cell_name(cell: dict, algorithm: str = "") -> str:
    """A grid cell's directory name, e.g. ``lr0.0001_beta0`` (``default`` for the empty cell)."""
    if not cell:
        return DEFAULT_CELL
    return "_".join(f"{cell_key_name(k, algorithm)}{v:g}" if isinstance(v, float) else
                    f"{cell_key_name(k, algorithm)}{v}" for k, v in cell.items())


def format_value(x: float) -> str:
    """A swept value as it appears in a method name: positional, at most 3 significant digits (0.0167, 0)."""
    import numpy as np

    return np.format_float_positional(float(f"{float(x):.3g}"), trim="-")


@dataclass(frozen=True)
class StudyMethod:
    """One run configuration of a study: its algorithm and the values the study sets."""

    study: str
    algorithm: str
    swept: dict[str, Any]


class Pipeline:
    """The validated config and registry of one run, and the settings of every job derived from them."""

    def __init__(self, cfg: PipelineConfig, registry: dict[str, ModelEntry], source: str = "config",
                 registry_source: str = "registry") -> None:
        self.cfg = cfg
        self.registry = registry
        self.source = source
        self.registry_source = registry_source
        self.models: list[str] = list(cfg.models)
        self.seeds: list[int] = list(cfg.seeds)

    # --- models ------------------------------------------------------------------
    def model(self, key: str) -> ModelEntry:
        """The registry entry of ``key``."""
        if key not in self.registry:
            raise KeyError(f"{key!r} is not in the registry {self.registry_source}")
        return self.registry[key]

    def resources(self, model: str, rule: str) -> Resources:
        """Cluster resources of ``rule``'s jobs for ``model``; a download never holds a GPU or much memory."""
        res = self.model(model).rule_resources(rule)
        if rule in CPU_ONLY_RULES:
            res = res.model_copy(update={"gpu": 0, "gpu_model": None, "cpus_per_gpu": None, "cpus_per_task": 1,
                                         "nodes": 1, "mem_mb": min(res.mem_mb, FETCH_MEM_MB)})
        return res

    # --- methods -------------------------------------------------------------------
    def train_methods(self, task: str) -> list[str]:
        """Methods trained on ``task`` (``train.<task>.methods``), in table order."""
        block = self.cfg.train.get(task)
        return list(block.methods) if block else []

    # --- v2: per-task models, extra seeds, every model a run touches --------------------
    def train_models(self, task: str) -> list[str]:
        """Models trained on ``task``: ``train.<task>.models``, else the config's models."""
        block = self.cfg.train.get(task)
        return list(block.models) if block is not None and block.models else list(self.models)

    def stability_seeds(self, task: str, model: str, method: str) -> list[int]:
        """Extra seeds the ``stability`` block asks for this run (empty when none)."""
        st = self.cfg.stability
        if st is None or st.task != task or model not in st.models or method not in st.methods:
            return []
        return list(st.seeds)

    def all_models(self) -> list[str]:
        """Every model a job of this config touches: the config's, each training task's and each study's."""
        out = list(self.models)
        out += [m for task in self.cfg.train for m in self.train_models(task)]
        out += [m for s in self.studies().values() for m in s.models]
        if self.cfg.stability is not None:
            out += list(self.cfg.stability.models)
        out += [m for task in self.essa_tasks() for m in self.essa_models(task)]
        return list(dict.fromkeys(m for m in out if m in self.registry))

    def evaluated_tasks(self) -> list[str]:
        """Tasks evaluated: every ``evaluate`` entry, then every training task that no entry evaluates through
        ``train_task`` (on its own test split, with ``defaults.evaluate``)."""
        out = list(self.cfg.evaluate)
        covered = {self.train_task_of(t) for t in out}
        return out + [t for t in self.cfg.train if t not in covered and t not in out]

    def eval_sets_of(self, train_task: str) -> list[str]:
        """The evaluated tasks whose runs are ``train_task``'s (its test sets)."""
        return [t for t in self.evaluated_tasks() if self.train_task_of(t) == train_task]

    def study_method(self, task: str, method: str) -> StudyMethod | None:
        """The study configuration called ``method`` on ``task``, if a study has one."""
        for name, study in self.studies().items():
            if study.task == task:
                found = self.study_methods(name).get(method)
                if found is not None:
                    return found
        return self.essa_methods(task).get(method) if task in self.essa_tasks() else None

    def algorithm_of(self, task: str, method: str) -> Algorithm:
        """The algorithm ``method`` runs on ``task``: a study's, else ``methods.<method>.algorithm``, else its name."""
        found = self.study_method(task, method)
        name = found.algorithm if found else self.cfg.methods.get(method, {}).get("algorithm", method)
        try:
            return algorithm(name)
        except KeyError:
            where = at(self.source, "methods", method, "algorithm") if method in self.cfg.methods else \
                at(self.source, "train", task, "methods")
            raise ConfigError(f"{where}: {name!r} is not an algorithm (es, grpo, dr_grpo, ppo); a method named "
                              "otherwise needs methods.<name>.algorithm") from None

    def is_rl(self, task: str, method: str) -> bool:
        """Whether ``method`` is an RL baseline (budgeted, trained per grid cell, best cell kept)."""
        return self.algorithm_of(task, method).rl

    def grid(self, model: str, method: str) -> dict[str, list]:
        """The registry's hyperparameter grid of ``method`` for ``model`` (empty: the settings alone)."""
        return dict(self.model(model).methods.get(method, {}).get("grid", {}))

    def extra_cells(self, model: str, method: str) -> list[dict]:
        """The registry's explicit cells of ``method`` for ``model`` (``methods.<m>.cells``), tried besides the grid."""
        return [dict(c) for c in self.model(model).methods.get(method, {}).get("cells", []) or []]

    def grid_cells(self, model: str, method: str) -> dict[str, dict]:
        """``{cell name: overrides}``: the product of the grid's value lists, in grid order, then the explicit cells."""
        grid = self.grid(model, method)
        keys = list(grid)
        cells = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
        cells += self.extra_cells(model, method)
        algo = self.cfg.methods.get(method, {}).get("algorithm", method)  # grids are trained methods', not studies'
        return {cell_name(c, algo): c for c in cells}

    def grid_record(self, model: str, method: str) -> dict:
        """The grid as the selection step records it: the value lists, plus ``cells`` when there are explicit ones."""
        extra = self.extra_cells(model, method)
        return {**self.grid(model, method), **({"cells": extra} if extra else {})}

    def _registry_layer(self, model: str, method: str) -> Layer:
        values = {k: v for k, v in self.model(model).methods.get(method, {}).items() if k not in GRID_KEYS}
        return Layer(self.registry_source, f"models.{model}.methods.{method}", values)

    def method_layers(self, model: str, task: str, method: str, cell: str | None = None) -> list[Layer]:
        """The layers of ``method``'s settings on ``task`` for ``model`` (and grid ``cell``), in order."""
        found = self.study_method(task, method)
        if found is not None and found.study == ESSA_STUDY:
            return self._essa_layers(model, task, method, found)
        if found is not None:
            return self._study_layers(model, method, found)
        algo = self.algorithm_of(task, method)
        layers = [
            Layer(self.source, f"defaults.{algo.defaults}", dict(getattr(self.cfg.defaults, algo.defaults))),
            Layer(self.source, f"methods.{method}", {"algorithm": algo.name, **self.cfg.methods.get(method, {})}),
        ]
        block = self.cfg.train.get(task)
        if block is not None and method in block.overrides():
            layers.append(Layer(self.source, f"train.{task}.{method}", block.overrides()[method]))
        layers.append(self._registry_layer(model, method))
        if cell is not None:
            cells = self.grid_cells(model, method)
            if cell not in cells:
                raise KeyError(f"{model}/{method}: no grid cell {cell!r}; cells: {', '.join(cells)}")
            layers.append(Layer(self.registry_source, f"models.{model}.methods.{method}.grid", cells[cell]))
        return layers

    def _study_layers(self, model: str, method: str, found: StudyMethod) -> list[Layer]:
        study = self.studies()[found.study]
        sweep = getattr(study, found.algorithm)
        family = algorithm(found.algorithm).defaults
        return [
            Layer(self.source, f"defaults.{family}", dict(getattr(self.cfg.defaults, family))),
            Layer(self.source, f"studies.{found.study}.{found.algorithm}.settings", dict(sweep.settings)),
            self._registry_layer(model, found.algorithm),
            Layer(self.source, f"studies.{found.study}", {**found.swept, "algorithm": found.algorithm,
                                                          "keep_every": study.keep_every}),
        ]

    def method_settings(self, model: str, task: str, method: str, cell: str | None = None) -> MethodSettings:
        """The validated settings of one run; an RL run's ``sample_budget`` is filled from its ES method."""
        algo = self.algorithm_of(task, method)
        settings = resolve(algo.settings, self.method_layers(model, task, method, cell))
        if algo.rl and settings.sample_budget is None:
            settings = settings.model_copy(update={"sample_budget": self._es_budget(model, task, method, settings)})
        return settings

    def _es_budget(self, model: str, task: str, method: str, settings: Any) -> int:
        found = self.study_method(task, method)
        if found is not None and found.study == ESSA_STUDY:  # the GRPO baseline matches the reference ESSA run
            from esrepro.essa.data import essa_sample_budget

            return essa_sample_budget(self.method_settings(model, task, ESSA_REF).as_dict())
        if found is not None:
            study = self.studies()[found.study]
            if study.es is None:
                raise ConfigError(at(self.source, "studies", found.study, found.algorithm, "settings", "sample_budget")
                                  + ": required when the study has no ES runs")
            first = next(m for m, s in self.study_methods(found.study).items() if s.algorithm == "es")
            return es_sample_budget(self.method_settings(model, task, first).as_dict())
        ref = settings.budget_from
        if ref not in self.train_methods(task) or self.algorithm_of(task, ref).name != "es":
            raise ConfigError(at(self.source, "methods", method, "budget_from")
                              + f": {ref!r} is not an ES method of train.{task}.methods")
        return es_sample_budget(self.method_settings(model, task, ref).as_dict())

    # --- studies ---------------------------------------------------------------------
    def studies(self) -> dict[str, Study]:
        """The sweep studies this config runs, by name (ES sigmas, GRPO betas and learning rates; the conciseness
        studies); the ESSA study is apart (:meth:`essa_study`)."""
        return {k: v for k, v in self.cfg.studies if isinstance(v, Study)}

    def study_methods(self, name: str) -> dict[str, StudyMethod]:
        """A study's run configurations by method name: one per swept value per algorithm."""
        import numpy as np

        study = self.studies()[name]
        out: dict[str, StudyMethod] = {}
        for algo, (key, setting, prefix) in SWEEPS.items():
            sweep = getattr(study, algo)
            if sweep is None:
                continue
            spaced = getattr(sweep, f"{key}_logspace", None)
            values = ([float(v) for v in np.logspace(spaced.start, spaced.stop, spaced.num)] if spaced
                      else [float(v) for v in getattr(sweep, key)])
            rates = getattr(sweep, "learning_rates", None) or [None]
            for value in values:
                for lr in rates:
                    method = f"{prefix}{format_value(value)}" + ("" if lr is None else f"_lr{format_value(lr)}")
                    swept = {setting: value, **({} if lr is None else {"learning_rate": float(lr)})}
                    if method in out:
                        raise ConfigError(at(self.source, "studies", name, algo) + f": values {out[method].swept} "
                                          f"and {swept} share the method name {method}")
                    out[method] = StudyMethod(name, algo, swept)
        return out

    def study_runs(self, name: str) -> list[tuple[str, str, int]]:
        """(model, method, seed) of a study's training runs."""
        study = self.studies().get(name)
        if study is None:
            return []
        return [(model, m, s) for model in study.models for m in self.study_methods(name) for s in study.seeds]

    # --- evaluation, KL, task options -------------------------------------------------
    def task_options(self, task: str) -> dict:
        """A task's options (``task_options.<task>``), for training and evaluation alike."""
        return dict(self.cfg.task_options.get(task, {}))

    def eval_settings(self, task: str) -> EvalSettings:
        """``evaluate.<task>`` over ``defaults.evaluate`` (a training task without an entry: the defaults alone)."""
        return resolve(EvalSettings, [Layer(self.source, "defaults.evaluate", dict(self.cfg.defaults.evaluate)),
                                      Layer(self.source, f"evaluate.{task}", dict(self.cfg.evaluate.get(task) or {}))])

    def kl_settings(self, task: str) -> KLSettings:
        """``kl.<task>`` over ``defaults.kl``."""
        return resolve(KLSettings, [Layer(self.source, "defaults.kl", dict(self.cfg.defaults.kl)),
                                    Layer(self.source, f"kl.{task}", dict(self.cfg.kl[task] or {}))])

    def train_task_of(self, task: str) -> str:
        """The training task whose runs are evaluated on ``task`` (itself unless ``evaluate.<task>.train_task``)."""
        return (self.cfg.evaluate.get(task) or {}).get("train_task") or task

    # --- the ESSA study ------------------------------------------------------------------
    def essa_study(self) -> ESSAStudy | None:
        """``studies.essa``, if this config has it."""
        return self.cfg.studies.essa

    def essa_tasks(self) -> list[str]:
        """The tasks the ESSA study trains on: its own, then its scaling block's (ESSA Fig. 6)."""
        study = self.essa_study()
        if study is None:
            return []
        return [study.task] + ([study.scaling.task] if study.scaling is not None else [])

    def essa_models(self, task: str | None = None) -> list[str]:
        """The models of the ESSA study's runs on ``task`` (the study's own task when None)."""
        study = self.essa_study()
        if study is None:
            return []
        if task is not None and task != study.task:
            return list(study.scaling.models) if study.scaling is not None and study.scaling.task == task else []
        return list(study.models)

    def essa_methods(self, task: str | None = None) -> dict[str, StudyMethod]:
        """The ESSA study's runs on ``task`` (its own task when None) by method name: the reference, one per
        swept value, the GRPO baseline; on the scaling task the reference, one per engine count and the baseline."""
        study = self.essa_study()
        if study is None or (task is not None and task not in self.essa_tasks()):
            return {}
        scaling = task is not None and task != study.task
        out = {ESSA_REF: StudyMethod(ESSA_STUDY, "essa", {})}
        for key, setting, prefix in ESSA_SWEEPS:
            if scaling and key != "engines":
                continue
            for value in getattr(study.scaling if scaling else study, key):
                out[f"{prefix}{value}"] = StudyMethod(ESSA_STUDY, "essa", {setting: value})
        if study.grpo is not None:
            out[ESSA_GRPO] = StudyMethod(ESSA_STUDY, "grpo", {})
        return out

    def essa_sweep(self, key: str) -> list[tuple[Any, str]]:
        """(value, method) of one sweep (a key of :data:`ESSA_SWEEPS`: ``populations``, ``ranks``, ``engines``,
        ``precisions``, ``resample``), without the reference run (the figures add it at its own value)."""
        study = self.essa_study()
        prefix = {k: p for k, _, p in ESSA_SWEEPS}[key]
        return [(v, f"{prefix}{v}") for v in getattr(study, key)] if study else []

    def essa_runs(self, task: str | None = None) -> list[tuple[str, str, int]]:
        """(model, method, seed) of every ESSA study run on ``task`` (its own task when None), the GRPO baseline
        included."""
        study = self.essa_study()
        if study is None:
            return []
        return [(m, meth, s) for m in self.essa_models(task) for meth in self.essa_methods(task)
                for s in study.seeds]

    def _essa_layers(self, model: str, task: str, method: str, found: StudyMethod) -> list[Layer]:
        study = self.essa_study()
        assert study is not None
        scaling = study.scaling if task != study.task else None
        if found.algorithm == "essa":
            axis = next((k for k, setting, _ in ESSA_SWEEPS if setting in found.swept), None)
            block = "studies.essa.scaling" if scaling is not None else "studies.essa"
            return [
                Layer(self.source, "defaults.essa", dict(self.cfg.defaults.essa)),
                Layer(self.source, "studies.essa.settings", dict(study.settings)),
                *([Layer(self.source, "studies.essa.scaling.settings", dict(scaling.settings))] if scaling else []),
                self._registry_layer(model, "essa"),
                Layer(self.source, f"{block}.{axis}" if axis else block, {**found.swept, "algorithm": "essa"}),
            ]
        ref = self.method_settings(model, task, ESSA_REF)
        return [
            Layer(self.source, "defaults.grpo", dict(self.cfg.defaults.grpo)),
            Layer(self.source, "studies.essa (the reference run's fitness_examples)",
                  {"train_examples": ref.fitness_examples}),
            Layer(self.source, "studies.essa.grpo", dict(study.grpo or {})),
            *([Layer(self.source, "studies.essa.scaling.grpo", dict(scaling.grpo))] if scaling else []),
            self._registry_layer(model, "grpo"),
            Layer(self.source, "studies.essa", {"algorithm": "grpo"}),
        ]
