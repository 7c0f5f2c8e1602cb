"""Documentation generated from the settings classes: ``esrepro options``, config/README.md, the JSON schemas."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from esrepro.settings.base import FORMER_BLOCK_NAMES, FORMER_NAMES, RENAMED, fields_help
from esrepro.settings.methods import EggrollSettings, ESSASettings, ESSettings, GRPOSettings, PPOSettings
from esrepro.settings.pipeline import (
    Claims,
    Dataset,
    DataSource,
    Defaults,
    ESSAStudy,
    ESSweep,
    EvalSettings,
    GRPOSweep,
    KLSettings,
    PipelineConfig,
    Report,
    Stability,
    Study,
    TrainTask,
)
from esrepro.settings.registry import Architecture, Build, ModelEntry, Registry, Resources, Tokenizer, WarmStart

#: (name, class, where it is written) of every documented block, in reading order.
BLOCKS: list[tuple[str, type[BaseModel], str]] = [
    ("pipeline", PipelineConfig, "top level of config/config.yaml and config/paper.yaml"),
    ("defaults", Defaults, "defaults"),
    ("es", ESSettings, "defaults.es, methods.<name>, train.<task>.<method>, a study's es.settings, "
                       "models.<key>.methods.<name> (registry)"),
    ("eggroll", EggrollSettings, "methods.<name> with algorithm: eggroll (over defaults.es), train.<task>.<method>, "
                                 "models.<key>.methods.<name> (registry)"),
    ("grpo", GRPOSettings, "defaults.grpo, methods.<name>, train.<task>.<method>, a study's grpo.settings, "
                           "models.<key>.methods.<name> (registry; grid too)"),
    ("ppo", PPOSettings, "defaults.ppo, methods.<name>, train.<task>.<method>, models.<key>.methods.<name> "
                         "(registry; grid too)"),
    ("essa", ESSASettings, "defaults.essa, methods.<name>, train.<task>.<method>, studies.essa.settings, "
                           "models.<key>.methods.essa (registry)"),
    ("data", Dataset, "data.<task>"),
    ("source", DataSource, "data.<task>.source"),
    ("train", TrainTask, "train.<task> (besides methods: <method>: {settings for this task})"),
    ("evaluate", EvalSettings, "defaults.evaluate, evaluate.<task>"),
    ("kl", KLSettings, "defaults.kl, kl.<task>"),
    ("study", Study, "studies.conciseness, studies.conciseness_lr"),
    ("es-sweep", ESSweep, "studies.<name>.es"),
    ("grpo-sweep", GRPOSweep, "studies.<name>.grpo"),
    ("essa-study", ESSAStudy, "studies.essa"),
    ("report", Report, "report"),
    ("stability", Stability, "stability"),
    ("claims", Claims, "claims"),
    ("model", ModelEntry, "models.<key> in config/models.yaml"),
    ("resources", Resources, "models.<key>.resources.<rule or default>"),
    ("build", Build, "models.<key>.build"),
    ("tokenizer", Tokenizer, "models.<key>.build.tokenizer"),
    ("architecture", Architecture, "models.<key>.build.architecture"),
    ("sft", WarmStart, "models.<key>.build.sft"),
]

INTRO = """\
# Configuration options

Generated from the settings classes in `src/esrepro/settings/` by `esrepro options --markdown`
(a test keeps this file in step with the code); `esrepro options <block>` prints one block.
Every option is defined once, with its default; a default is the paper's value unless it says
otherwise. Unknown keys are errors, and every file is checked before any job starts
(`esrepro validate config/config.yaml`): errors name the file and the field.

## How settings combine

A run's method settings are layered, later layers winning:

1. the defaults below (the paper's settings);
2. `defaults.<family>` of the config: what differs at this scale (`es`, `grpo` for every GRPO
   variant: grpo, dr_grpo, verl_grpo, verl_dr_grpo; `ppo`, `essa`);
3. `methods.<name>`: a named method (a table column: `grpo8`, `grpo30`, `grpov`, `drgrpov`), its
   `algorithm` and what sets it apart; a method named after its algorithm (`es`, `ppo`)
   needs no entry;
4. `train.<task>.<method>`: what one task needs (e.g. longer generations);
5. the registry's `models.<key>.methods.<name>`: what one model needs;
6. an RL grid cell (`models.<key>.methods.<name>.grid`, one run per cell, best kept).

A study's runs layer `defaults.<family>`, the study's `settings`, the registry's entry for
the algorithm, then the swept value; the ESSA study's runs layer `defaults.essa`,
`studies.essa.settings`, the registry's `essa` entry, then the swept value (its GRPO baseline:
`defaults.grpo`, `studies.essa.grpo`, the registry's `grpo` entry). Evaluation and KL settings layer `defaults.evaluate` /
`defaults.kl` under `evaluate.<task>` / `kl.<task>`. A job's CPU threads are its registry
resources' `cpus_per_task` (or `cpus_per_gpu` x `gpu`).

A `--configfile` replaces `config/config.yaml`. A config file may build on another with
`extends: <path>` (relative to the working directory): the other file's options are read
first, then this file's on top, mappings merged key by key and anything else (a list, a
value, `null`) replaced; `config/config.yaml` extends `config/essa_tiny.yaml` so. Within
a file, a YAML anchor and merge key (`<<: *name`) share a block; a key written twice is an
error.
"""


def _value(v: Any) -> str:
    if isinstance(v, BaseModel):
        return "(block)"
    if v in ({}, [], None):
        return {dict: "{}", list: "[]"}.get(type(v), "null")
    return json.dumps(v) if not isinstance(v, str) else v


def block_markdown(name: str, cls: type[BaseModel], where: str) -> str:
    """One block's options as a Markdown table."""
    rows = [f"## `{name}`: {(cls.__doc__ or '').strip().splitlines()[0]}", "", f"Written in: {where}.", "",
            "| option | default | meaning |", "|---|---|---|"]
    for f in fields_help(cls):
        default = "(required)" if f["required"] else f"`{_value(f['default'])}`"
        rows.append(f"| `{f['name']}` | {default} | {f['help'].replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def renamed_markdown() -> str:
    """The renamed options (settings.base.RENAMED) as a Markdown table: old name, current name, blocks."""
    rows = ["## Renamed options", "",
            "So that one name means one thing across the config, these options were renamed; an old name is refused "
            "with `renamed: use <new>`.", "", "| old name | current name | in |", "|---|---|---|"]
    for old, new in RENAMED.items():
        blocks = [b for b, names in {**FORMER_NAMES, **FORMER_BLOCK_NAMES}.items() if names.get(new) == old]
        rows.append(f"| `{old}` | `{new}` | {', '.join(f'`{b}`' for b in blocks)} |")
    return "\n".join(rows) + "\n"


def markdown() -> str:
    """config/README.md: the renamed options, then every block's options."""
    return INTRO + "\n" + renamed_markdown() + "\n" + "\n".join(block_markdown(*b) for b in BLOCKS)


def block_text(name: str) -> str:
    """One block's options as plain text (``esrepro options es``)."""
    found = {b[0]: b for b in BLOCKS}
    if name not in found:
        raise KeyError(f"no options block {name!r}; blocks: {', '.join(found)}")
    _, cls, where = found[name]
    lines = [f"{name}: {(cls.__doc__ or '').strip().splitlines()[0]}", f"  written in: {where}"]
    for f in fields_help(cls):
        default = "required" if f["required"] else _value(f["default"])
        lines.append(f"  {f['name']:<30} {default:<14} {f['help']}")
    return "\n".join(lines)


def schemas() -> dict[str, dict]:
    """JSON schemas of the config and the registry (for editors; validation uses the classes themselves)."""
    return {"config.schema.json": PipelineConfig.model_json_schema(), "models.schema.json": Registry.model_json_schema()}
