"""The model registry (config/models.yaml): one entry per model. Adding a model is adding an entry."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from esrepro.settings.base import Settings

Partial = dict[str, Any]


class Resources(Settings):
    """Cluster resources of one rule's jobs (SLURM through Snakemake's executor plugin)."""

    gpu: int = Field(0, ge=0, description="GPUs per node (0: none)")
    gpu_model: str | None = Field(None, description="GRES type of the GPUs (sinfo -o '%P %G'), e.g. h100")
    cpus_per_gpu: int | None = Field(None, ge=1, description="CPU cores per GPU")
    cpus_per_task: int | None = Field(None, ge=1, description="CPU cores of a job without GPUs; also its threads")
    mem_mb: int = Field(4000, ge=100, description="memory per node, MB")
    runtime: int = Field(60, ge=1, description="wall-clock limit, minutes")
    nodes: int = Field(1, ge=1, description="nodes of a training job (a Ray cluster spans them)")
    processes: int | None = Field(
        None, ge=1, description="training processes per node of an RL job (PPO, GRPO) or an ESSA SFT, started by "
        "torchrun: null, one per GPU (one without GPUs); set it to run several CPU processes (gloo)")
    ray_cluster: bool = Field(False, description="run the job under scripts/ray-slurm, whose Ray cluster the ES "
                              "engines join, even on one node (always so when nodes > 1)")

    def training_processes(self) -> int:
        """Training processes per node under the distributed launcher: ``processes``, else one per GPU, else 1."""
        return self.processes or self.gpu or 1

    def threads(self) -> int:
        """CPU threads a job of this rule uses: cpus_per_task, else cpus_per_gpu x gpu, else 1."""
        if self.cpus_per_task:
            return self.cpus_per_task
        if self.cpus_per_gpu and self.gpu:
            return self.cpus_per_gpu * self.gpu
        return 1


class Tokenizer(Settings):
    """The tiny model's byte-level BPE."""

    vocab_size: int = Field(ge=300, description="BPE vocabulary size")
    corpus_problems: int = Field(ge=10, description="generated problems the BPE is trained on")


class Architecture(Settings):
    """The tiny model's architecture: a transformers config of ``model_type`` (Qwen2 unless named)."""

    model_type: str | None = Field(None, description="transformers model_type of the built model (its config.json "
                                   "key, e.g. qwen3, mistral, gemma3_text, olmo2, phi3); null: qwen2")
    options: dict[str, Any] = Field(default_factory=dict, description="further config.json keys of that "
                                    "architecture (e.g. head_dim, sliding_window, layer_types)")
    hidden_size: int = Field(ge=8, description="model width")
    intermediate_size: int = Field(ge=8, description="MLP width")
    num_hidden_layers: int = Field(ge=1, description="layers")
    num_attention_heads: int = Field(ge=1, description="attention heads")
    num_key_value_heads: int = Field(ge=1, description="key/value heads (grouped-query attention)")
    max_position_embeddings: int = Field(ge=16, description="context length")

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        # a Qwen2 build states neither key: its settings, and so the pins and manifests recording them, are what
        # they were before other architectures could be built
        out = handler(self)
        if out.get("model_type") is None:
            out.pop("model_type", None)
        if not out.get("options"):
            out.pop("options", None)
        return out


#: Tasks the tiny model can be warm-started on (each has a generator of SFT pairs: esrepro.models.warm_start).
SFT_TASKS = ("countdown", "math_train", "gsm8k", "sudoku", "arc")


class WarmStart(Settings):
    """The tiny model's warm-start SFT on generated problems (disjoint from the prepared splits)."""

    task: Literal["countdown"] = Field("countdown", description="task whose generated problems it is trained on")
    problems: int | None = Field(None, ge=1, description="generated problems (the single-task form, with task)")
    tasks: dict[Literal[SFT_TASKS], int] | None = Field(
        None, description="several formats instead: task -> generated problems, mixed and shuffled (e.g. "
        "{countdown: 2000, math_train: 1500, sudoku: 800, arc: 400}); the tokenizer is trained on every format")
    epochs: int = Field(ge=1, description="passes over them")
    learning_rate: float = Field(gt=0, description="AdamW learning rate (cosine schedule)")
    prompts_per_step: int = Field(ge=1, description="problems (prompt and target) per optimiser step")
    max_prompt_tokens: int | None = Field(None, ge=1, description="with tasks: keep only the last N prompt tokens "
                                          "(as ES and evaluation do for long ARC prompts); null: whole prompts")

    @model_validator(mode="after")
    def _one_form(self) -> "WarmStart":
        if (self.problems is None) == (self.tasks is None):
            raise ValueError("give exactly one of problems (with task) or tasks ({task: problems})")
        if self.tasks is not None and (not self.tasks or any(n < 1 for n in self.tasks.values())):
            raise ValueError("tasks needs at least one task, each with at least one problem")
        return self

    def task_problems(self) -> dict[str, int]:
        """``{task: problems}`` in either form."""
        return dict(self.tasks) if self.tasks is not None else {self.task: int(self.problems)}


class Build(Settings):
    """How a tiny model is built locally: tokenizer, architecture, warm start."""

    seed: int = Field(0, ge=0, description="seed of the initialisation, the data and the SFT")
    tokenizer: Tokenizer = Field(description="the byte-level BPE (tokenizer block)")
    architecture: Architecture = Field(description="the model's architecture (architecture block)")
    sft: WarmStart = Field(description="the warm-start SFT (sft block)")


class Pinned(Settings):
    """A build of this entry shipped with the repository (``esrepro pin-model``): the build step copies it, each
    file checked, when it was built from the entry's build settings and data; else it builds."""

    path: str = Field(min_length=1, description="the pin folder, relative to the repository (data/pinned/<model>)")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the model folder the build writes (its "
                        "manifest's outputs.model.sha256)")


class ModelEntry(Settings):
    """One model: where it comes from, its dtype, per-method overrides and per-rule resources."""

    display: str = Field(description="name printed in tables")
    family: str = Field("", description="architecture family (informational: shapes and layer kinds come from the "
                        "model's config, e.g. qwen2, llama)")
    size: str = Field("", description="parameter count as text, e.g. 7B (informational: counts come from the "
                      "model's config, built on the meta device)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(description="dtype weights are loaded and trained in")
    chat_template: bool = Field(False, description="wrap prompts in the tokenizer's chat template")
    build: Build | None = Field(None, description="a locally built model (the tiny default)")
    pinned: Pinned | None = Field(None, description="with build: its output shipped with the repository, copied "
                                  "instead of rebuilt (esrepro verify-build rebuilds and compares)")
    hub_id: str | None = Field(None, pattern=r"^[^/\s]+/[^/\s]+$", description="a hub model: repository id")
    path: str | None = Field(None, min_length=1, description="a model on disk: a transformers model folder "
                             "(config.json, safetensors, tokenizer); its files' sha256 are recorded and checked "
                             "before every job that reads it")
    config: dict[str, Any] | str | None = Field(
        None, description="the model's config.json as a mapping, or a JSON file holding it (relative to the "
        "repository, e.g. config/model_configs/<model>.json): shapes and layer kinds for planning before any "
        "download; required for a hub model, checked against the downloaded (or the folder's) config.json, field "
        "by field (esrepro add-model writes it)")
    revision: str | None = Field(None, min_length=1, description="hub commit to download (a branch name is resolved "
                                 "at fetch time and recorded in the model's manifest)")
    gated: bool = Field(False, description="the hub repository is gated (e.g. meta-llama): fetching it needs a hub "
                        "token of an account that accepted its licence; checked before any job (esrepro.planning.preflight)")
    methods: dict[str, Partial] = Field(default_factory=dict, description="method -> settings over the config's, "
                                        "plus an RL hyperparameter grid (grid: {setting: [values]})")
    resources: dict[str, Resources] = Field(description="rule name (train, evaluate, kl, build, fetch, ...), "
                                            "train_es (ES training jobs; else they use train), train_es_<task> "
                                            "(ES training jobs of that task; else train_es) or default -> "
                                            "cluster resources; default is required")

    @model_validator(mode="after")
    def _source(self) -> "ModelEntry":
        if sum(x is not None for x in (self.build, self.hub_id, self.path)) != 1:
            raise ValueError("needs exactly one of build (a locally built model), hub_id + revision (a hub model) "
                             "or path (a transformers model folder)")
        if self.hub_id is not None and self.config is None:
            raise ValueError("a hub model needs config (its config.json, for planning before the download: "
                             "esrepro add-model KEY --hub-id ID --revision REV writes the entry)")
        if self.build is not None and self.config is not None:
            raise ValueError("config applies to a hub model or a folder (a built model's config is its build block)")
        if self.pinned is not None and self.build is None:
            raise ValueError("pinned applies to a locally built model (build)")
        if self.gated and self.hub_id is None:
            raise ValueError("gated applies to a hub model (hub_id)")
        if self.hub_id is not None and self.revision is None:
            raise ValueError("a hub model needs revision (a commit, or a branch name resolved at fetch time)")
        if self.revision is not None and self.hub_id is None:
            raise ValueError("revision applies to a hub model (hub_id)")
        if "default" not in self.resources:
            raise ValueError("resources needs a default entry (rules without their own entry use it)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        # an entry states its path or config only when it has one: the entries of the built and hub models dump as
        # they did before a model could be a folder (the manifests and tables that record them are unchanged)
        out = handler(self)
        for key in ("path", "config"):
            if out.get(key) is None:
                out.pop(key, None)
        return out

    def rule_resources(self, rule: str) -> Resources:
        """Resources of ``rule``'s jobs: the rule's own entry over ``default``."""
        base = self.resources["default"].model_dump(exclude_unset=True)
        base.update(self.resources.get(rule, Resources()).model_dump(exclude_unset=True))
        return Resources(**base)


class Registry(Settings):
    """config/models.yaml."""

    models: dict[str, ModelEntry] = Field(min_length=1, description="registry key -> model")
