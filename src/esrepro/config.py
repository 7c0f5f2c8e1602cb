"""Loading and validating configuration files against their JSON schemas.

Errors name the file and the field (as a dotted path), so a typo in
``config/paper.yaml`` is reported before any job starts, not hours into a run.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from esrepro.rl.budget import es_sample_budget

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "workflow" / "schemas"


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the field."""


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file, naming it in the error when it is missing or malformed."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def _field_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def validate(data: Any, schema_name: str, source: str | Path, schema_dir: Path = SCHEMA_DIR) -> None:
    """Validate ``data`` against ``{schema_dir}/{schema_name}.schema.yaml``.

    Raises ConfigError listing every violation as ``source: field.path: message``.
    """
    schema = load_yaml(schema_dir / f"{schema_name}.schema.yaml")
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = []
        for err in errors:
            # oneOf/anyOf failures: report the most specific sub-error
            best = jsonschema.exceptions.best_match([err])
            lines.append(f"{source}: {_field_path(best)}: {best.message}")
        raise ConfigError("invalid configuration\n  " + "\n  ".join(lines))


def load_registry(path: str | Path) -> dict[str, dict]:
    """Load and validate the model registry; returns ``{model_key: entry}``."""
    data = load_yaml(path)
    validate(data, "models", path)
    return data["models"]


def check_config(config: dict, source: str | Path, root: str | Path = ".") -> dict[str, dict]:
    """Validate a pipeline config and its cross-references; return the registry it names.

    Checks the schema (of the config, the registry and the published numbers it
    names), that every listed model is in the registry, that every
    trained or evaluated task has a dataset, and that every method has settings.
    """
    validate(config, "config", source)
    root = Path(root)
    registry = load_registry(root / config["registry"])
    validate(load_yaml(root / config["published"]), "published", config["published"])
    problems: list[str] = []
    for i, key in enumerate(config["models"]):
        if key not in registry:
            problems.append(f"models.{i}: {key!r} is not in the registry {config['registry']}")
    for task, spec in config["train"].items():
        if task not in config["data"]:
            problems.append(f"train.{task}: no data.{task} entry to train on")
        for method in spec["methods"]:
            if method not in spec:
                problems.append(f"train.{task}.methods: {method!r} has no train.{task}.{method} settings")
                continue
            problems += _method_problems(config, registry, task, method)
    from esrepro.tasks import known_tasks

    for section in ("data", "train", "evaluate", "task_options"):
        for task in config.get(section, {}):
            if task not in known_tasks():
                problems.append(f"{section}.{task}: unknown task; known: {', '.join(known_tasks())}")
    for task, spec in config["evaluate"].items():
        if task not in config["data"]:
            problems.append(f"evaluate.{task}: no data.{task} entry to evaluate on")
        train_task = spec.get("train_task", task)
        if train_task != task and train_task not in config["train"]:
            problems.append(f"evaluate.{task}.train_task: no train.{train_task} entry")
    for task in config.get("kl", {}):
        if task not in config["data"]:
            problems.append(f"kl.{task}: no data.{task} entry to measure KL on")
    for name, study in config.get("studies", {}).items():
        where = f"studies.{name}"
        if study["model"] not in registry:
            problems.append(f"{where}.model: {study['model']!r} is not in the registry {config['registry']}")
        if study["task"] not in config["data"]:
            problems.append(f"{where}.task: no data.{study['task']} entry to train on")
        if study["task"] not in config.get("kl", {}):
            problems.append(f"{where}.task: no kl.{study['task']} entry saying how KL is measured")
        try:
            methods = study_methods(study)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            methods = {}
        clash = set(methods) & set(config["train"].get(study["task"], {}).get("methods", []))
        if clash:
            problems.append(f"{where}: method names {sorted(clash)} also in train.{study['task']}.methods")
    if problems:
        raise ConfigError("invalid configuration\n  " + "\n  ".join(f"{source}: {p}" for p in problems))
    return registry


ALGORITHMS = ("es", "grpo", "dr_grpo", "ppo")


def algorithm_of(method: str, settings: dict) -> str:
    """The algorithm a method runs: its settings' ``algorithm`` field, else the method's own name."""
    return settings.get("algorithm", method)


def _method_problems(config: dict, registry: dict, task: str, method: str) -> list[str]:
    """Cross-field checks of one method: algorithm, the ES method its budget matches, grid keys."""
    spec = config["train"][task]
    settings = spec[method]
    where = f"train.{task}.{method}"
    algorithm = algorithm_of(method, settings)
    if algorithm not in ALGORITHMS:
        return [f"{where}.algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)} "
                "(set algorithm: when the method's name is not its algorithm)"]
    out = []
    if algorithm != "es":
        ref = settings.get("budget_from")
        if ref not in spec.get("methods", []) or algorithm_of(ref, spec.get(ref, {})) != "es":
            out.append(f"{where}.budget_from: {ref!r} is not an ES method of train.{task}.methods")
    for model in config["models"]:
        grid = registry.get(model, {}).get("methods", {}).get(method, {}).get("grid", {})
        for key in grid:
            if key not in settings:
                out.append(f"{config['registry']}: models.{model}.methods.{method}.grid.{key}: "
                           f"not a setting of {where}")
        if grid and algorithm == "es":
            out.append(f"{config['registry']}: models.{model}.methods.{method}.grid: grids are for RL methods")
    return out


#: A study's swept hyperparameter per algorithm: (config list key, setting name, method-name prefix).
SWEEPS = {"es": ("sigmas", "sigma", "es_sigma"), "grpo": ("betas", "beta", "grpo_beta")}


def format_value(x: float) -> str:
    """A swept value as it appears in a method name: positional, at most 3 significant digits (0.0167, 0)."""
    import numpy as np

    return np.format_float_positional(float(f"{float(x):.3g}"), trim="-")


def sweep_values(block: dict, key: str) -> list[float]:
    """The swept values of an algorithm block: ``<key>``, or ``<key>_logspace: {start, stop, num}`` (10**start..10**stop)."""
    spaced = block.get(f"{key}_logspace")
    if spaced:
        import numpy as np

        return [float(v) for v in np.logspace(spaced["start"], spaced["stop"], spaced["num"])]
    return [float(v) for v in block[key]]


def study_methods(study: dict) -> dict[str, dict]:
    """Expand a study into ``{method name: train settings}``: one method per swept value per algorithm.

    Each method's settings are the algorithm block's ``settings`` with the swept value set
    (``sigma`` for ES, ``beta`` for GRPO), ``algorithm`` naming the trainer, and
    ``save_every`` = the study's ``checkpoint_every`` (weights kept along the way).
    """
    out: dict[str, dict] = {}
    for algorithm, (key, setting, prefix) in SWEEPS.items():
        block = study.get(algorithm)
        if not block:
            continue
        for value in sweep_values(block, key):
            name = f"{prefix}{format_value(value)}"
            if name in out:
                raise ValueError(f"{algorithm}: values {out[name][setting]} and {value} share the method name {name}")
            out[name] = {**copy.deepcopy(block["settings"]), setting: value, "algorithm": algorithm,
                         "save_every": study["checkpoint_every"]}
            if algorithm != "es" and "sample_budget" not in out[name]:
                if not study.get("es"):
                    raise ValueError(f"{algorithm}.settings: sample_budget is needed when the study has no ES runs")
                out[name]["sample_budget"] = es_sample_budget(study["es"]["settings"])  # equal budgets
    return out


def study_method(config: dict, task: str, method: str) -> tuple[dict, dict] | None:
    """(study, settings) of a study's ``method`` on ``task`` (see ``study_methods``); None if no study has it."""
    for study in config.get("studies", {}).values():
        if study["task"] == task:
            settings = study_methods(study).get(method)
            if settings is not None:
                return study, settings
    return None


def method_settings(config: dict, registry: dict, model: str, task: str, method: str) -> dict:
    """The settings of ``method`` on ``task`` for ``model``: config defaults, registry overrides on top.

    The registry's ``grid`` (hyperparameter cells to try) is not a setting; see ``Plan.grid_cells``.
    A study's method (e.g. ``es_sigma0.001``) takes the registry overrides of its
    algorithm, except the swept value and the snapshot interval, which the study sets.
    """
    found = study_method(config, task, method)
    if found is not None:
        settings = found[1]
        swept = {k: settings[k] for k in ("sigma", "beta", "save_every", "algorithm") if k in settings}
        overrides = registry[model].get("methods", {}).get(settings["algorithm"], {})
        settings.update({k: v for k, v in overrides.items() if k != "grid"})
        settings.update(swept)
        return settings
    settings = copy.deepcopy(config["train"][task][method])
    overrides = registry[model].get("methods", {}).get(method, {})
    settings.update({k: v for k, v in overrides.items() if k != "grid"})
    return settings


def rule_resources(entry: dict, rule: str) -> dict:
    """Cluster resources of ``rule`` for a registry entry (the rule's own, else ``default``)."""
    res = dict(entry["resources"]["default"])
    res.update(entry["resources"].get(rule, {}))
    return res
