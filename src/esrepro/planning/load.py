"""A run's config and registry read into a checked :class:`~esrepro.pipeline.Pipeline`.

The planning rooms in order (docs/architecture.md): the files are read and validated (:mod:`esrepro.config`), a
rehearsal's config and registry transformed (:mod:`esrepro.planning.rehearsal_bounds`), the pipeline built (settings
resolved on demand, a pure function of config and registry) and every cross-reference checked
(:mod:`esrepro.planning.checks`). This module sits above those it calls, and nothing below planning imports it.
"""

from __future__ import annotations

from pathlib import Path

from esrepro.config import ConfigError, config_base, load_registry, validate_published
from esrepro.pipeline import Pipeline
from esrepro.planning.checks import check_pipeline
from esrepro.planning.rehearsal_bounds import rehearse
from esrepro.settings.layers import validate_block
from esrepro.settings.pipeline import PipelineConfig
from esrepro.settings.registry import ModelEntry

__all__ = ["ConfigError", "check_config", "load_pipeline"]


def load_pipeline(config: dict, source: str | Path, root: str | Path = ".") -> Pipeline:
    """Validate a run's config, registry and published numbers and every cross-reference; the resolved pipeline.

    Raises :class:`ConfigError` listing every problem, one line each, naming file and field. A config that
    still names the file it ``extends`` (relative to ``root``) is read over that file's options first. A config
    with a ``rehearsal`` block is rehearsed (:func:`esrepro.planning.rehearsal_bounds.rehearse`) before its pipeline is
    built.
    """
    source = str(source)
    cfg = validate_block(PipelineConfig, config_base(config, source, root), source)
    root = Path(root)
    registry = load_registry(root / cfg.registry, cfg.registry, root)
    validate_published(root / cfg.published, cfg.published)
    run_layers = None
    if cfg.rehearsal is not None:
        cfg, registry, run_layers = rehearse(cfg, registry, source, cfg.registry)
    pipeline = Pipeline(cfg, registry, source=source, registry_source=cfg.registry, run_layers=run_layers)
    check_pipeline(pipeline)
    return pipeline


def check_config(config: dict, source: str | Path, root: str | Path = ".") -> dict[str, ModelEntry]:
    """Validate a pipeline config (see :func:`load_pipeline`); returns the registry it names."""
    return load_pipeline(config, source, root).registry
