"""The pipeline's names: the base method, studies' and grid cells' method and directory names, and the sweeps.

Nothing here reads a config: these are the constants and pure functions that the pipeline's parts, the plan and
the checks name runs by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from esrepro.settings.methods import FORMER_NAMES

BASE = "base"  # the untrained model, evaluated as a method of its own
#: Short names of grid keys in cell directory names, by a setting's former name (FORMER_NAMES), so they stay.
CELL_KEY_NAMES = {"learning_rate": "lr", "actor_learning_rate": "alr", "critic_learning_rate": "clr",
                  "kl_coef": "kl", "beta": "beta",
                  # v2: explicit cells (registry methods.<m>.cells), e.g. the authors' GRPO-Zero settings
                  "per_device_train_batch_size": "pbs", "gradient_accumulation_steps": "ga",
                  "max_completion_length": "len", "num_generations": "g"}
#: Registry keys of methods.<method> that are not settings: the grid's value lists and its explicit extra cells.
GRID_KEYS = ("grid", "cells")
DEFAULT_CELL = "default"
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
