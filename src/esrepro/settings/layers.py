"""Settings assembled from layers (code defaults, then config blocks, then the registry), validated once.

Each layer remembers where it was written (``config/config.yaml: defaults.es``), so an
invalid value is reported against the file and block that set it, not against the
merged result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel, ValidationError

from esrepro.settings.base import dotted, error_lines


class ConfigError(ValueError):
    """A configuration file is invalid; each line of the message names the file and the field."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("invalid configuration\n  " + "\n  ".join(self.problems))


@dataclass(frozen=True)
class Layer:
    """Partial settings and where they were written: a file and the block's dotted path in it."""

    file: str
    block: str
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """``file: block`` (for messages)."""
        return at(self.file, self.block)


def at(file: str, *path: Any) -> str:
    """``file: a.b.c`` from a file and path parts (empty parts skipped)."""
    parts = [str(p) for p in path if p not in ("", None)]
    return f"{file}: {'.'.join(parts)}" if parts else file


M = TypeVar("M", bound=BaseModel)


def merge(layers: Sequence[Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    """The merged values (later layers win) and, per key, the layer that set it."""
    merged: dict[str, Any] = {}
    origin: dict[str, Layer] = {}
    for layer in layers:
        if not isinstance(layer.values, dict):
            raise ConfigError(f"{layer.where}: expected a mapping of settings, got {type(layer.values).__name__}")
        for key, value in layer.values.items():
            merged[key] = value
            origin[key] = layer
    return merged, origin


def resolve(cls: type[M], layers: Sequence[Layer]) -> M:
    """Validate the merged layers as ``cls``; errors name the layer that set each bad value."""
    merged, origin = merge(layers)
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        last = layers[-1] if layers else Layer(cls.__name__, "")

        def where(loc: tuple) -> str:
            layer = origin.get(loc[0], last) if loc else last
            return at(layer.file, layer.block, dotted(loc))

        raise ConfigError(error_lines(exc, where, cls)) from None


def validate_block(cls: type[M], values: Any, file: str, block: str = "") -> M:
    """Validate one whole block (no layering); errors are ``file: block.field.path``."""
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(error_lines(exc, lambda loc: at(file, block, dotted(loc)), cls)) from None
