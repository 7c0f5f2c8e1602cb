"""A run's method settings, resolved through their layers, and the algorithm a method runs.

Method settings are layered, later layers winning: the code's defaults (the paper's
values, :mod:`esrepro.settings.methods`), ``defaults.<family>``, ``methods.<method>``,
``train.<task>.<method>``, the registry's ``models.<model>.methods.<method>`` and, for
an RL grid, the cell's values; last, a run's own layer where the pipeline was built with one (the rehearsal's
bounds, :mod:`esrepro.planning.rehearsal_bounds`). Studies expand into methods of their own
(``es_sigma<value>``, ``grpo_beta<value>``), with layers of their own (:mod:`esrepro.pipeline.studies`,
:mod:`esrepro.pipeline.essa_study`). An RL run's sample budget comes from an ES run's.

The resolution is a pure function of the config and the registry: ``resume_every: auto`` stays ``auto`` here; the
pricing room resolves it into the job's spec (:func:`esrepro.planning.resume_cost.job_settings`).
"""

from __future__ import annotations

from typing import Any

from esrepro.essa.data import essa_sample_budget
from esrepro.pipeline.names import ESSA_REF, ESSA_STUDY, StudyMethod
from esrepro.rl.budget import es_sample_budget
from esrepro.settings.layers import ConfigError, Layer, at, resolve
from esrepro.settings.methods import Algorithm, MethodSettings, algorithm


class SettingsMixin:
    """:class:`~esrepro.pipeline.Pipeline`'s method settings: algorithms, layers, sample budgets."""

    def study_method(self, task: str, method: str) -> StudyMethod | None:
        """The study configuration called ``method`` on ``task``, if a study has one."""
        for name, study in self.studies().items():
            if study.task == task:
                found = self.study_methods(name).get(method)
                if found is not None:
                    return found
        return self.essa_methods(task).get(method) if task in self.essa_tasks() else None

    def algorithm_of(self, task: str, method: str) -> Algorithm:
        """The algorithm ``method`` runs on ``task``: a study's, else ``methods.<method>.algorithm``, else
        ``train.<task>.<method>.algorithm``, else its name."""
        found = self.study_method(task, method)
        block = self.cfg.train.get(task)
        own = block.overrides().get(method, {}) if block is not None else {}
        name = found.algorithm if found else (self.cfg.methods.get(method, {}).get("algorithm")
                                              or own.get("algorithm") or method)
        try:
            return algorithm(name)
        except KeyError:
            where = at(self.source, "methods", method, "algorithm") if method in self.cfg.methods else \
                at(self.source, "train", task, "methods")
            raise ConfigError(f"{where}: {name!r} is not an algorithm (es, grpo, dr_grpo, verl_grpo, verl_dr_grpo, ppo); a method named "
                              "otherwise needs methods.<name>.algorithm") from None

    def is_rl(self, task: str, method: str) -> bool:
        """Whether ``method`` is an RL baseline (budgeted, trained per grid cell, best cell kept)."""
        return self.algorithm_of(task, method).rl

    def is_es_variant(self, task: str, method: str) -> bool:
        """Whether ``method`` is a variant of ES beside the papers' runs: low-rank ES (algorithm ``eggroll``), or ES
        with its noise on the linear projections only (``noise_on: linear``, low-rank ES's control arm). Variants
        report in their own table and claim row (es_variants), not in Table 1's."""
        name = self.algorithm_of(task, method).name
        if name == "eggroll":
            return True
        return name == "es" and any(getattr(self.method_settings(m, task, method), "noise_on", "all") == "linear"
                                    for m in self.train_models(task))

    def method_layers(self, model: str, task: str, method: str, cell: str | None = None) -> list[Layer]:
        """The layers of ``method``'s settings on ``task`` for ``model`` (and grid ``cell``), in order; the run's own
        layer (:attr:`run_layers`) last."""
        layers = self._method_layers(model, task, method, cell)
        own = self.run_layers.get((task, model, method))
        return layers + [own] if own is not None else layers

    def _method_layers(self, model: str, task: str, method: str, cell: str | None = None) -> list[Layer]:
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

    def method_settings(self, model: str, task: str, method: str, cell: str | None = None) -> MethodSettings:
        """The validated settings of one run; an RL run's ``sample_budget`` is filled from its ES method (an RL run's
        ``resume_every: auto`` is left as it is: :func:`esrepro.planning.resume_cost.job_settings` prices it)."""
        algo = self.algorithm_of(task, method)
        settings = resolve(algo.settings, self.method_layers(model, task, method, cell))
        if algo.rl and settings.sample_budget is None:
            settings = settings.model_copy(update={"sample_budget": self._es_budget(model, task, method, settings)})
        return settings

    def _es_budget(self, model: str, task: str, method: str, settings: Any) -> int:
        found = self.study_method(task, method)
        if found is not None and found.study == ESSA_STUDY:  # the GRPO baseline matches the reference ESSA run
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
