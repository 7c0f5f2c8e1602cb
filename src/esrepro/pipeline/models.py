"""The pipeline's view of the model registry: a model's entry, its jobs' resources, its grids and cells, and
its ``models.<model>.methods.<method>`` settings layer."""

from __future__ import annotations

import itertools

from esrepro.pipeline.names import GRID_KEYS, cell_name
from esrepro.settings.layers import Layer
from esrepro.settings.registry import ModelEntry, Resources

FETCH_MEM_MB = 8000  # a download needs no more, whatever the model's GPU jobs ask for
#: Rules whose jobs never use a GPU, whatever the registry entry they fall back on (``default``) says, with their
#: memory cap in MB (None: the entry's): a download, the choice of an RL grid cell from the cells' logs, and the
#: parameter-shift histogram (an absolute difference of two checkpoints, which holds both in host memory).
CPU_ONLY_RULES: dict[str, int | None] = {"fetch": FETCH_MEM_MB, "select": FETCH_MEM_MB, "param_shift": None}


class ModelsMixin:
    """:class:`~esrepro.pipeline.Pipeline`'s registry look-ups (``self.registry``, ``self.registry_source``)."""

    def model(self, key: str) -> ModelEntry:
        """The registry entry of ``key``."""
        if key not in self.registry:
            raise KeyError(f"{key!r} is not in the registry {self.registry_source}")
        return self.registry[key]

    def local_models(self) -> list[str]:
        """Registry keys of the models on disk (``path``): their base folder links to the folder's files."""
        return [k for k, e in self.registry.items() if e.path is not None]

    def resources(self, model: str, rule: str) -> Resources:
        """Cluster resources of ``rule``'s jobs for ``model``; a CPU-only rule (:data:`CPU_ONLY_RULES`) never holds
        a GPU: it keeps the entry's CPU threads (one for a download or a selection) and at most its memory cap."""
        res = self.model(model).rule_resources(rule)
        if rule in CPU_ONLY_RULES:
            cap = CPU_ONLY_RULES[rule]
            threads = res.threads() if cap is None else 1
            res = res.model_copy(update={"gpu": 0, "gpu_model": None, "cpus_per_gpu": None, "cpus_per_task": threads,
                                         "nodes": 1, "mem_mb": res.mem_mb if cap is None else min(res.mem_mb, cap)})
        return res

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
        cells = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]
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
