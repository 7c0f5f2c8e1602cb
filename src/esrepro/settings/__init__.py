"""Every option of the pipeline, defined once: pydantic settings classes with defaults and help text."""

from esrepro.settings.base import Settings
from esrepro.settings.layers import ConfigError, Layer, resolve, validate_block
from esrepro.settings.methods import (
    ALGORITHMS,
    EggrollSettings,
    ESSettings,
    GRPOSettings,
    MethodSettings,
    PPOSettings,
    algorithm,
)
from esrepro.settings.pipeline import Dataset, EvalSettings, KLSettings, PipelineConfig, Study
from esrepro.settings.registry import ModelEntry, Registry, Resources

__all__ = [
    "ALGORITHMS", "ConfigError", "Dataset", "EggrollSettings", "ESSettings", "EvalSettings", "GRPOSettings", "KLSettings", "Layer",
    "MethodSettings", "ModelEntry", "PPOSettings", "PipelineConfig", "Registry", "Resources", "Settings", "Study",
    "algorithm", "resolve", "validate_block",
]
