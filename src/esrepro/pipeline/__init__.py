"""A validated run configuration: every setting a job reads, resolved through its layers.

:class:`Pipeline` is the one object callers hold; its parts are one concern a module:

- :mod:`~esrepro.pipeline.names`: the constants and names of methods, cells and sweeps (:class:`StudyMethod`);
- :mod:`~esrepro.pipeline.models`: the registry's models, their jobs' resources, grids and cells;
- :mod:`~esrepro.pipeline.tasks`: which models and seeds train on which task, what is evaluated, task options,
  evaluation and KL settings;
- :mod:`~esrepro.pipeline.method_settings`: method settings through their layers, algorithms, sample budgets;
- :mod:`~esrepro.pipeline.studies`: the sweep studies;
- :mod:`~esrepro.pipeline.essa_study`: the ESSA study;

Reading a run's config and registry into a checked :class:`Pipeline` (:mod:`esrepro.planning.load`) and the notes
under the tables (:mod:`esrepro.planning.notes`) sit in the planning package above: nothing here imports planning.
"""

from __future__ import annotations

from esrepro.pipeline.essa_study import ESSAStudyMixin
from esrepro.pipeline.method_settings import SettingsMixin
from esrepro.pipeline.models import CPU_ONLY_RULES, FETCH_MEM_MB, ModelsMixin
from esrepro.pipeline.names import (
    BASE,
    CELL_KEY_NAMES,
    DEFAULT_CELL,
    ESSA_GRPO,
    ESSA_REF,
    ESSA_STUDY,
    ESSA_SWEEPS,
    GRID_KEYS,
    SWEEPS,
    StudyMethod,
    cell_key_name,
    cell_name,
    format_value,
)
from esrepro.pipeline.studies import StudiesMixin
from esrepro.pipeline.tasks import TasksMixin
from esrepro.settings.layers import Layer
from esrepro.settings.pipeline import PipelineConfig
from esrepro.settings.registry import ModelEntry

__all__ = ["BASE", "CELL_KEY_NAMES", "CPU_ONLY_RULES", "DEFAULT_CELL", "ESSA_GRPO", "ESSA_REF", "ESSA_STUDY",
           "ESSA_SWEEPS", "FETCH_MEM_MB", "GRID_KEYS", "SWEEPS", "Pipeline", "StudyMethod", "cell_key_name",
           "cell_name", "format_value"]


class Pipeline(ModelsMixin, TasksMixin, SettingsMixin, StudiesMixin, ESSAStudyMixin):
    """The validated config and registry of one run, and the settings of every job derived from them."""

    def __init__(self, cfg: PipelineConfig, registry: dict[str, ModelEntry], source: str = "config",
                 registry_source: str = "registry",
                 run_layers: dict[tuple[str, str, str], Layer] | None = None) -> None:
        """``run_layers``: (task, model, method) -> a last layer of that run's method settings, over every other
        (the rehearsal's bounds, esrepro.planning.rehearsal_bounds); none by default."""
        self.cfg = cfg
        self.registry = registry
        self.source = source
        self.registry_source = registry_source
        self.models: list[str] = list(cfg.models)
        self.seeds: list[int] = list(cfg.seeds)
        self.run_layers: dict[tuple[str, str, str], Layer] = dict(run_layers or {})
