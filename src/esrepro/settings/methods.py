"""Training methods' settings, each option defined once with the paper's value as its default.

A config states only what differs at its scale (``defaults.<algorithm>``), what sets a
named method apart (``methods.<name>``), what a task needs (``train.<task>.<method>``),
and the registry what a model needs (``models.<key>.methods.<name>``). The defaults here
are the settings of "Evolution Strategies at Scale" (Countdown, Table 1): ES N=30,
sigma=1e-3, alpha=5e-4, 500 iterations on 200 problems, 1,024 new tokens; the RL
baselines as TinyZero (PPO) and TRL (GRPO) ran them. GRPO options whose TRL default moved
between releases are pinned here and always passed to TRL explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

# FORMER_NAMES is defined in settings.base (below this module), so that base.RENAMED is derived from it
from esrepro.settings.base import FORMER_NAMES, FieldProblem, Settings

#: The transformers backend's generation paths (esrepro.backends.hf).
Generation = Literal["default", "static", "continuous"]
#: vLLM 0.32.0's allowed ``max_lora_rank`` values (``vllm/config/lora.py``, ``MaxLoRARanks``): the LoRA slots an
#: engine serving adapters (ESSA candidates, low-rank ES members) is built with.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_MAX_RANK = LORA_RANKS[-1]


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


class SnapshotRef(Settings):
    """Another run's weights part-way through: the run of ``method`` (same task, model and seed) after ``iteration``
    iterations, a snapshot it kept (``keep_every``) or, at its last iteration, its final checkpoint."""

    method: str = Field(description="the method of the same task whose run holds the weights")
    iteration: int = Field(ge=1, description="after this many of its iterations: a multiple of its keep_every, or "
                           "its last iteration (its final checkpoint)")


class MethodSettings(Settings):
    """Options every training method has."""

    algorithm: str = Field(description="the trainer: es, grpo, dr_grpo, ppo or essa (default: the method's own name)")
    train_examples: int = Field(200, ge=1, description="training problems: the first N of the prepared train split")
    keep_every: int | None = Field(
        None, ge=1, description="keep the weights every K iterations (ES) or steps (RL) under <run>/checkpoints/"
        "iterK, e.g. for the Pareto figure; null keeps none")
    # --- periodic evaluation (v2: Figure 7, test accuracy against training-sample evaluations) ---
    eval_every: int | None = Field(
        None, ge=1, description="greedy evaluation on the training task's test split every K iterations (ES) or "
        "steps (RL), and once before training, into <run>/periodic_eval.jsonl; null: none")
    eval_limit: int | None = Field(None, ge=1, description="periodic evaluation: only the first N test examples "
                                   "(null: all)")
    eval_max_new_tokens: int | None = Field(None, ge=1, description="periodic evaluation: greedy generation length "
                                            "(null: the method's own generation length)")
    eval_batch_size: int | None = Field(None, ge=1, description="periodic evaluation of an RL run: prompts per "
                                        "generation batch (null: 64; ES evaluates with its engines' batch_size)")


class PopulationSettings(MethodSettings):
    """Options of the engines a population is scored on: ES members, ESSA candidates."""

    backend: Literal["hf", "vllm"] = Field("hf", description="generation engine: hf (transformers, CPU or GPU) or "
                                           "vllm (GPU, the vllm extra)")
    engines: int | None = Field(None, ge=1, description="engines scoring the population: 1 runs in-process, more "
                                "run as Ray actors (one per GPU, or CPU processes); null: one per GPU of the job, "
                                "1 on CPU")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vllm backend: share of each GPU an engine's vLLM takes for weights, activations "
        "and KV cache; null: 0.85, divided among the engines sharing a GPU (the rest holds ES's weight copies and "
        "noise)")
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="vllm backend: KV cache bytes per engine instead of sizing it from "
        "gpu_memory_utilization (on vLLM's CPU build null means 256 MiB)")
    start_timeout: float = Field(1800, gt=0, description="seconds an engine actor (engines > 1) may take to start "
                                 "before the run stops with the resources it waited for")
    call_timeout: float = Field(3600, gt=0, description="seconds one call to an engine may take (a population "
                                "slice, an update, a save) before the engine counts as hung: it is replaced and "
                                "the call retried (3 times), then the run stops")


#: PopulationSettings fields that change neither the weights nor the rewards of a run (a resume may change them).
ENGINE_FIELDS = frozenset(PopulationSettings.model_fields) - frozenset(MethodSettings.model_fields)


#: ES options for EGGROLL's own recipe; at their defaults (ES's) they are left out of a run's spec and resume key.
RECIPE_FIELDS = ("antithetic", "fitness", "step")


class ESSettings(PopulationSettings):
    """Full-parameter evolution strategies (the paper's Algorithm 1)."""

    algorithm: Literal["es"] = Field("es", description="es")
    start_from: SnapshotRef | None = Field(
        None, description="start from another ES run's kept weights instead of the base model: {method, iteration} "
        "of this task, model and seed (v2 App. A.6: ESCHKPT-2 continues the 160-iteration snapshot); the run counts "
        "its own iterations from 0, as the authors' trainer does with a loaded checkpoint; null: the base model")
    iterations: int = Field(500, ge=1, description="ES iterations")
    population: int = Field(30, ge=2, description="population size N (perturbations per iteration)")
    sigma: float = Field(1e-3, gt=0, description="noise scale of the perturbations")
    alpha: float = Field(5e-4, gt=0, description="learning rate (1/sigma folded in, as in the paper)")
    max_new_tokens: int = Field(1024, ge=1, description="greedy generation length for scoring a member")
    batch_size: int = Field(200, ge=1, description="prompts per generation batch")
    prompts_per_iteration: int | None = Field(
        None, ge=1, description="score every member on this many of the train_examples per iteration, drawn from a "
        "seeded reshuffle of them each epoch (the authors' math recipe: 1,024); null: on all of them every iteration")
    max_prompt_tokens: int | None = Field(None, ge=1, description="keep only the last N prompt tokens (short-context "
                                          "models, e.g. ARC prompts on the tiny model); null: whole prompts")
    noise: Literal["iid", "correlated"] = Field(
        "correlated", description="iid: a generator per (seed, tensor); correlated: every tensor reseeded with the "
        "member seed, as the authors' released code does")
    restore: Literal["exact", "subtract"] = Field(
        "subtract", description="exact: copy the weights back after each member (bit-exact); subtract: the paper's "
        "theta -= sigma*eps (drifts in bf16)")
    master_weights: Literal["float32"] | None = Field(
        None, description="float32: keep fp32 master weights for bf16/fp16 models, so updates below a bf16 ulp survive")
    resume_every: int = Field(50, ge=1, description="write the resume state (<run>/resume/) every K iterations")
    resume_on_other_gpu: bool = Field(
        False, description="continue a resume state written by engines whose noise differs (another GPU variant: "
        "CUDA's noise follows the SM count); the run then goes on with this GPU's noise and no longer follows from "
        "its seed bit for bit. false: such a resume is refused with this option named")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine")
    generation: Generation = Field(
        "default", description="hf backend's generation path: default (generate, dynamic KV cache), static (static KV "
        "cache and compiled decoding; CUDA graphs on GPU) or continuous (transformers' continuous batching, paged "
        "attention); greedy outputs are identical on CPU")
    noise_on: Literal["all", "linear"] = Field(
        "all", description="the parameters a member's noise perturbs: all (the paper's ES), or linear: only the "
        "decoder blocks' linear projections, the tensors low-rank ES perturbs, each keyed by the same (seed, tensor) "
        "(full-rank ES as low-rank ES's control arm: the two then differ by the noise's rank alone)")
    antithetic: bool = Field(
        False, description="false: N independent members (ES); true: members in mirrored pairs, +sigma and -sigma "
        "on one draw of noise, as EGGROLL's code does (population must be even)")
    fitness: Literal["zscore", "centred"] = Field(
        "zscore", description="update weights from the members' rewards: zscore, (r - mean) / (std + 1e-8) (ES); "
        "centred, (r - mean) / sqrt(var + 1e-5), EGGROLL's convert_fitnesses with the population as the group of "
        "one prompt's generations")
    step: Literal["alpha_over_n", "sigma_sqrt_n"] = Field(
        "alpha_over_n", description="update scale: alpha_over_n, theta += alpha / N * sum w eps (ES, 1/sigma folded "
        "into alpha); sigma_sqrt_n, theta += alpha * sigma / sqrt(N) * sum w eps, EGGROLL's update with alpha its "
        "learning rate")

    def as_dict(self) -> dict[str, Any]:
        """:meth:`Settings.as_dict`, without ``start_from`` when it is unset and without ``noise_on`` at its default
        (a run from the base model, or with the method's own noise targets, keeps the spec, manifest and resume-state
        key it had before those options existed)."""
        out = super().as_dict()
        if out.get("start_from") is None:
            out.pop("start_from", None)
        for name in ("noise_on", *RECIPE_FIELDS):
            if name in out and out[name] == type(self).model_fields[name].default:
                out.pop(name)
        return out

    @model_validator(mode="after")
    def _antithetic_pairs(self) -> "ESSettings":
        if self.antithetic and self.population % 2:
            raise FieldProblem("population", f"population {self.population} is odd, but antithetic: true pairs every "
                               "member with its mirror; set an even population or antithetic: false")
        return self

    @model_validator(mode="after")
    def _generation_backend(self) -> "ESSettings":
        if self.generation != "default" and self.backend != "hf":
            raise FieldProblem("generation", f"generation {self.generation} is a path of the hf backend; the "
                               f"{self.backend} backend generates its own way (leave generation at default)")
        return self

    @model_validator(mode="after")
    def _per_iteration(self) -> "ESSettings":
        if self.prompts_per_iteration is not None and self.prompts_per_iteration > self.train_examples:
            raise FieldProblem("prompts_per_iteration", f"prompts_per_iteration ({self.prompts_per_iteration}) is "
                               f"more than train_examples ({self.train_examples}), the prompts it is drawn from")
        return self


class EggrollSettings(ESSettings):
    """Low-rank evolution strategies (EGGROLL, Sarkar et al., arXiv 2511.16652): ES whose member perturbs every
    linear projection W (m x n) by A Bᵀ / √r (esrepro.perturb.lowrank); every other option is ES's, and a
    method of this algorithm starts from defaults.es, so it runs at ES's population, sigma, alpha and budget."""

    algorithm: Literal["eggroll"] = Field("eggroll", description="eggroll")
    rank: int = Field(1, ge=1, description="rank r of each member's perturbation A Bᵀ / √r of a weight matrix "
                      "(at most the matrix's smaller side; the vllm backend serves ranks up to 512)")
    noise: Literal["iid", "correlated"] = Field(
        "iid", description="iid: factors A, B drawn per (seed, tensor), as EGGROLL keys each parameter; "
        "correlated: every tensor reseeded with the member seed, so same-shaped matrices share their factors")
    restore: Literal["exact", "subtract"] = Field(
        "exact", description="hf backend (members written into the weights): exact copies the weights back after "
        "each member, subtract takes sigma A Bᵀ / √r off again; the vllm backend never writes a member into the "
        "weights (each is a LoRA adapter)")
    max_loras: int | None = Field(
        None, ge=1, description="vllm backend: member adapters vLLM runs in one batch; null: every member of an "
        "engine's share of the population at once")
    noise_on: Literal["linear"] = Field(
        "linear", description="linear: the decoder blocks' linear projections, the only tensors low-rank noise "
        "perturbs (embeddings, norms and biases keep the base model's values)")

    @model_validator(mode="after")
    def _vllm_rank(self) -> "EggrollSettings":
        if self.backend == "vllm" and self.rank > LORA_MAX_RANK:
            raise FieldProblem("rank", f"rank {self.rank} exceeds {LORA_MAX_RANK}, the largest LoRA rank vLLM "
                               "serves (its max_lora_rank); use the hf backend or a lower rank")
        return self


class RLSettings(MethodSettings):
    """Options of every RL baseline: the equal sample budget."""

    budget_from: str = Field("es", description="the ES method whose sample budget (iterations x population x "
                             "train_examples) this run matches")
    sample_budget: int | None = Field(
        None, ge=1, description="scored training samples; null: the budget_from method's budget (set by the plan)")
    resume_every: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        50, description="write the resume state (<run>/resume/: weights, optimiser, scheduler, RNG, step) every K "
        "optimiser steps; a killed run continues from it; auto: the plan derives K from the state's size and the "
        "storage's write speed so that saving takes at most 3% of the run (esrepro.planning.resume_cost)")
    collective_timeout: int | None = Field(
        None, ge=60, description="seconds a training process waits in a collective before the job fails (the "
        "process group's timeout); null: the library's default (NCCL 10 minutes, transformers' ddp_timeout 30 minutes), or "
        "with resume_every: auto the plan's, above the longest resume save (esrepro.planning.resume_cost)")
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp", description="how the weights spread over the job's training processes (one per GPU): ddp, a whole "
        "copy on each; fsdp, parameters, gradients and optimiser state sharded over them (FSDP full shard)")


#: The (loss_type, scale_rewards) pair that defines each GRPO variant in TRL's terms. The verl_* variants are GRPO and
#: Dr.GRPO as VERL runs them (the ES paper v2's GRPO-v and Dr.GRPO-v, App. A.2): VERL's token-mean loss aggregation
#: (a token mean per micro-batch, averaged over micro-batches: TRL's bnpo) with std-scaled advantages, and VERL's
#: seq-mean-token-sum-norm (token sums over sequences x the response length: TRL's dr_grpo) without std scaling.
#: ``grpo_zero`` is GRPO as GRPO-Zero runs it (the ES paper v2's GRPO-z, App. A.2): its loss sums the step's token
#: losses over every generated token of the step's batch (TRL's dapo: the active tokens of the global accumulated
#: batch), with std-scaled group advantages. GRPO-Zero's std has no Bessel correction, TRL's has: every advantage
#: differs by the same factor sqrt((G - 1) / G), which AdamW's update divides out (up to its epsilon, and on steps
#: where gradient clipping binds for one scale and not the other), so it is kept as TRL computes it.
GRPO_VARIANTS: dict[str, tuple[str, str]] = {"grpo": ("grpo", "group"), "dr_grpo": ("dr_grpo", "none"),
                                             "verl_grpo": ("bnpo", "group"), "verl_dr_grpo": ("dr_grpo", "none"),
                                             "grpo_zero": ("dapo", "group")}
#: Every algorithm that trains through TRL's GRPOTrainer.
GRPO_ALGORITHMS: tuple[str, ...] = tuple(GRPO_VARIANTS)
#: VERL's defaults where they differ from GRPOSettings' (verl/trainer/config/ppo_trainer.yaml and its actor and optim
#: blocks, and the GRPO math example examples/grpo_trainer/run_qwen2-7b_math.sh), with the ES paper v2 App. A.2's
#: values: a rollout of 1,024 prompts x 8 completions, ppo_mini_batch_size 256 prompts (2,048 completions per optimiser
#: step, 4 steps per rollout), 16 completions per GPU micro-batch, AdamW weight decay 0.01, no importance-sampling
#: correction of the rollout engine's probabilities; Dr.GRPO-v without the KL loss. Over these go the config's layers.
VERL_DEFAULTS: dict[str, dict[str, Any]] = {
    "verl_grpo": {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 128, "updates_per_generation": 4,
                  "weight_decay": 0.01, "vllm_importance_sampling_correction": False, "beta": 1e-3},
}
VERL_DEFAULTS["verl_dr_grpo"] = {**VERL_DEFAULTS["verl_grpo"], "beta": 0.0}


class GRPOSettings(RLSettings):
    """GRPO and Dr.GRPO through TRL's GRPOTrainer; field names are GRPOConfig's but one (esrepro.rl.grpo.TRL_NAMES)."""

    algorithm: Literal["grpo", "dr_grpo", "verl_grpo", "verl_dr_grpo", "grpo_zero"] = Field(
        description="grpo (std-scaled group advantages, length-normalised loss), dr_grpo (no std scaling, constant "
        "normaliser), the two as VERL runs them (the ES paper's GRPO-v and Dr.GRPO-v): verl_grpo (std-scaled, "
        "token-mean loss) and verl_dr_grpo (no std scaling, token sums over the response length), the verl variants "
        "starting from VERL's defaults (esrepro.settings.methods.VERL_DEFAULTS); or grpo_zero, GRPO as GRPO-Zero runs "
        "it (the ES paper's GRPO-z: std-scaled, the step's token losses over all its generated tokens, TRL's dapo)")
    loss_type: Literal["grpo", "dr_grpo", "bnpo", "dapo"] = Field(description="TRL loss_type; follows the algorithm "
                                                                   "(checked)")
    scale_rewards: Literal["group", "none"] = Field(description="TRL scale_rewards; follows the algorithm (checked)")
    beta: float = Field(1e-3, ge=0, description="KL coefficient to the base model (0: no reference model)")
    num_generations: int = Field(8, ge=2, description="group size: completions per prompt")
    learning_rate: float = Field(1e-6, gt=0, description="AdamW learning rate")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling (1: off)")
    top_k: int = Field(0, ge=0, description="top-k sampling (0: off)")
    max_new_tokens: int = Field(1024, ge=1, description="completion tokens")
    per_device_train_batch_size: int = Field(
        32, ge=1, description="completions per device and micro-step; samples per step = this x "
        "gradient_accumulation_steps")
    gradient_accumulation_steps: int = Field(8, ge=1, description="micro-steps per optimiser step")
    epsilon: float = Field(0.2, gt=0, description="clipping range of the ratio")
    epsilon_high: float | None = Field(None, gt=0, description="upper clipping range (null: epsilon)")
    num_iterations: int = Field(1, ge=1, description="optimisation passes per generation batch")
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = Field(
        "constant", description="learning-rate schedule")
    warmup_steps: int | float = Field(0, ge=0, description="warm-up steps (below 1: a fraction of the run)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    bf16: bool = Field(True, description="bf16 mixed precision (forced off on CPU, recorded in the manifest)")
    gradient_checkpointing: bool = Field(True, description="activation checkpointing (forced off on CPU)")
    disable_dropout: bool = Field(True, description="dropout off in policy and reference")
    mask_truncated_completions: bool = Field(False, description="leave truncated completions out of the loss")
    importance_sampling_level: Literal["token", "sequence"] = Field("token", description="ratio per token or "
                                                                    "per sequence (GSPO)")
    use_vllm: bool = Field(False, description="generate the rollouts with vLLM inside TRL (GPU machines with the vllm "
                           "extra; forced off on CPU, recorded in the manifest); false: transformers generate")
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="use_vllm: colocate runs a vLLM engine in every training process on its GPU (TRL "
        "syncs the policy's weights into it each step); server talks to a separately started trl vllm-serve")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="use_vllm colocate: share of each GPU "
                                               "the vLLM engine takes (weights, KV cache); the rest trains")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="use_vllm colocate: GPUs one vLLM engine spans (a "
                                           "divisor of the job's GPUs)")
    vllm_max_model_length: int | None = Field(None, ge=1, description="use_vllm: vLLM's context window (null: the "
                                              "longest training prompt plus max_new_tokens, esrepro.rl.grpo)")
    vllm_enable_sleep_mode: bool = Field(False, description="use_vllm colocate: offload vLLM's weights and KV cache "
                                         "during the optimiser step (less memory, slower steps)")
    vllm_importance_sampling_correction: bool = Field(
        True, description="use_vllm: correct the loss for the gap between vLLM's sampling probabilities and the "
        "policy's (TRL's truncated importance sampling)")
    updates_per_generation: int = Field(
        1, ge=1, description="optimiser steps per rollout: each generation batch samples this many steps' completions "
        "and is split into them (VERL: train_batch_size / ppo_mini_batch_size; TRL's steps_per_generation is this x "
        "gradient_accumulation_steps); 1: a fresh rollout every step")
    repeat_prompts: bool = Field(
        False, description="when one rollout draws more prompts than train_examples, sample rollouts from whole copies "
        "of the problems (as many as make whole rollouts; TRL shuffles them together), each copy its own group; "
        "false: such a run is refused")

    @model_validator(mode="before")
    @classmethod
    def _variant(cls, data: Any) -> Any:
        """loss_type and scale_rewards default to the algorithm's pair; a contradicting pair is refused."""
        if isinstance(data, dict) and data.get("algorithm") in GRPO_VARIANTS:
            given = [k for k in ("loss_type", "scale_rewards") if k in data]
            want = GRPO_VARIANTS[data["algorithm"]]
            data = {**VERL_DEFAULTS.get(data["algorithm"], {}), "loss_type": want[0], "scale_rewards": want[1], **data}
            if (data["loss_type"], data["scale_rewards"]) != want:
                raise FieldProblem(given[0], f"algorithm {data['algorithm']} means loss_type {want[0]} with "
                                   f"scale_rewards {want[1]}, not {data['loss_type']}/{data['scale_rewards']} "
                                   "(leave both out)")
        return data

    @model_validator(mode="after")
    def _groups(self) -> "GRPOSettings":
        per_step = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if per_step % self.num_generations:
            raise FieldProblem("per_device_train_batch_size", f"per_device_train_batch_size x "
                               f"gradient_accumulation_steps ({per_step}) must be a multiple of num_generations "
                               f"({self.num_generations}): whole groups per step")
        return self


class PPOSettings(RLSettings):
    """PPO with a critic (esrepro.rl.ppo, verl-style); defaults are TinyZero's, as the paper ran it."""

    algorithm: Literal["ppo"] = Field("ppo", description="ppo")
    actor_learning_rate: float = Field(1e-6, gt=0, description="policy learning rate")
    critic_learning_rate: float = Field(1e-5, gt=0, description="critic learning rate")
    beta: float = Field(1e-3, ge=0, description="in-reward KL penalty to the base model (0: no reference model)")
    prompts_per_step: int = Field(256, ge=1, description="prompts (one response each) per step: samples per step "
                                  "(a total, shared evenly by the job's training processes)")
    mini_batch_size: int = Field(128, ge=1, description="responses per optimiser step (a total, shared evenly by the "
                                 "training processes)")
    micro_batch_size: int = Field(8, ge=1, description="responses per forward/backward pass of one process (one GPU)")
    rollout_batch_size: int | None = Field(
        None, ge=1, description="responses per generate call of one process (null: the process's whole share of "
        "prompts_per_step in one call)")
    bf16: bool = Field(True, description="bf16 mixed precision over float32 master weights (forced off on CPU, "
                       "recorded in the manifest)")
    gradient_checkpointing: bool = Field(True, description="activation checkpointing of actor and critic (forced "
                                         "off on CPU)")
    ppo_epochs: int = Field(1, ge=1, description="passes over each rollout")
    clip_ratio: float = Field(0.2, gt=0, description="clipping range of the ratio")
    value_clip: float = Field(0.5, gt=0, description="clipping range of the value update")
    gamma: float = Field(1.0, ge=0, le=1, description="discount")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    entropy_coef: float = Field(1e-3, ge=0, description="entropy bonus")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    max_new_tokens: int = Field(1024, ge=1, description="response tokens")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")

    @model_validator(mode="after")
    def _batches(self) -> "PPOSettings":
        if self.prompts_per_step % self.mini_batch_size or self.mini_batch_size % self.micro_batch_size:
            field = "mini_batch_size" if self.prompts_per_step % self.mini_batch_size else "micro_batch_size"
            raise FieldProblem(field, f"prompts_per_step ({self.prompts_per_step}) must be a multiple of "
                               f"mini_batch_size ({self.mini_batch_size}), and that of micro_batch_size "
                               f"({self.micro_batch_size})")
        return self


# --- ESSA (Korotyshova et al., arXiv 2507.04453) ------------------------------------------


#: ESSA's default LoRA targets: each model's attention linears (ESSA Sec. 4.2 adapts q, k, v and o).
DEFAULT_LORA_TARGETS = "attention"


def without_default_lora_targets(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` (a resume state's or an SFT cache's) without ``lora_targets`` where it holds the default: such keys
    stay those written before the setting existed."""
    return {k: v for k, v in key.items() if not (k == "lora_targets" and v == DEFAULT_LORA_TARGETS)}


class ESSASettings(PopulationSettings):
    """ESSA: LoRA SFT, then CMA-ES over the top singular values of every adapter (esrepro.essa).

    The run reads the first ``train_examples`` = ``sft_examples`` + ``fitness_examples`` +
    ``val_examples`` problems of the prepared train split: the LoRA SFT split first, then
    the alignment split's fixed fitness subset candidates are scored on, then held-out
    alignment problems the CMA-ES mean is scored on along the way (the curves of the
    study's figures). Values the ESSA paper does not give are marked so: they are this
    reproduction's choices.
    """

    algorithm: Literal["essa"] = Field("essa", description="essa")
    train_examples: int | None = Field(
        None, ge=1, description="problems read from the train split: sft_examples + fitness_examples + "
        "val_examples (computed; a different value is an error)")
    sft_examples: int = Field(1495, ge=1, description="the LoRA SFT split: the first N problems of the train split "
                              "(GSM8K 1,495; PRM800K MATH 3,600)")
    fitness_examples: int = Field(880, ge=1, description="the fixed subset of alignment problems candidates are "
                                  "scored on: the N after the SFT split")
    resample_per_step: int | None = Field(
        None, ge=1, description="problems drawn from the fitness subset each generation (without replacement, "
        "seeded by run seed and generation); null: all of them, the paper's main experiments (a fixed subset of "
        "880); its Sec. 5.4 draws 100 per generation (the study's resample sweep)")
    val_examples: int = Field(0, ge=0, description="held-out alignment problems (after the fitness subset) the "
                              "CMA-ES mean is scored on every val_every generations (0: none)")
    val_every: int = Field(1, ge=1, description="score the mean on the held-out problems every K generations "
                           "(and after the last)")
    fitness: Literal["accuracy", "reward"] = Field(
        "accuracy", description="what a candidate is scored by: accuracy (the paper) or the task's reward")
    rank: int = Field(16, ge=1, description="LoRA rank r of every adapted layer (lora_targets; the paper's q, k, v "
                      "and o projections; it sweeps 4-64; 16 is its text's rank for Fig. 4, whose caption says 32)")
    lora_targets: Literal["attention", "all"] | tuple[str, ...] = Field(
        DEFAULT_LORA_TARGETS,
        description="the linear layers the LoRA adapts, read off the model's decoder blocks: attention (the paper: its "
        "LoRA on the q, k, v and o projections; each model's own attention linears, Phi-3's fused qkv_proj "
        "and o_proj), all (every linear of the blocks), or a list of module names (q_proj, v_proj), each the "
        "name of a linear layer of the blocks")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scaling alpha / r; the paper does not give it: "
                              "2 x rank 16)")
    sft_epochs: int = Field(2, ge=1, description="LoRA SFT epochs (the paper does not give them)")
    sft_learning_rate: float = Field(1e-4, gt=0, description="LoRA SFT learning rate, linear decay (the paper does "
                                     "not give it)")
    sft_prompts_per_step: int = Field(16, ge=1, description="LoRA SFT examples per optimizer step (the paper does "
                                      "not give them)")
    fraction: float = Field(0.4, gt=0, le=1, description="p: the fraction of singular values optimised (the top "
                            "ceil(p r) of each adapter)")
    selection: Literal["per_adapter", "global"] = Field(
        "per_adapter", description="per_adapter: the top p of each adapter; global: the top p of all adapters' "
        "values together")
    sigma0: float = Field(0.32, gt=0, description="CMA-ES initial step size")
    population: int = Field(192, ge=2, description="CMA-ES population (the paper fixes 192 for its rank, GPU-count, "
                            "precision and GRPO experiments; its Fig. 4 sweeps 96, 192, 400, 608)")
    covariance: Literal["separable", "full"] = Field(
        "separable", description="CMA-ES covariance: separable (cmaes.SepCMA, diagonal; memory and time linear in "
        "the number of singular values) or full (cmaes.CMA, d x d; for small search spaces). The paper describes "
        "mean and covariance and cites sep-CMA-ES; docs/essa.md")
    iterations: int = Field(100, ge=1, description="CMA-ES generations, as ES calls its iterations (the paper does "
                            "not give them)")
    max_new_tokens: int = Field(1024, ge=1, description="greedy generation length when scoring a candidate")
    batch_size: int = Field(200, ge=1, description="prompts per generation batch")
    precision: Literal["native", "int8", "int4"] = Field(
        "native", description="native: the registry dtype with each candidate merged into the weights; int8/int4: "
        "bitsandbytes-quantised base with the LoRA adapter unmerged on top (CUDA only; int4 on either backend, int8 "
        "on hf only)")
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="generation engine: hf (transformers: the SFT adapter merged, one candidate at a time) or "
        "vllm (the base loaded once, each candidate a LoRA adapter, all of an engine's candidates in one batch; "
        "precision native or int4)")
    max_loras: int = Field(16, ge=1, description="vllm backend: candidate adapters vLLM runs in one batch (more "
                           "candidates per engine are scheduled in turn)")
    resume_every: int = Field(10, ge=1, description="write the resume state (<run>/resume/) every K generations")

    @model_validator(mode="before")
    @classmethod
    def _examples(cls, data: Any) -> Any:
        """train_examples is sft + fitness + val examples; a contradicting value is refused."""
        if not isinstance(data, dict):
            return data
        parts = [data.get(k, cls.model_fields[k].default) for k in ("sft_examples", "fitness_examples", "val_examples")]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in parts):
            return data  # the fields' own checks report the bad value
        need = sum(parts)
        given = data.get("train_examples")
        if given is not None and given != need:
            raise FieldProblem("train_examples", f"train_examples is sft_examples + fitness_examples + val_examples "
                               f"({need}), not {given} (leave it out)")
        return {**data, "train_examples": need}

    @model_validator(mode="after")
    def _subset(self) -> "ESSASettings":
        if self.resample_per_step is not None and self.resample_per_step > self.fitness_examples:
            raise FieldProblem("resample_per_step", f"resample_per_step ({self.resample_per_step}) exceeds "
                               f"fitness_examples ({self.fitness_examples})")
        if self.eval_every is not None:
            raise FieldProblem("eval_every", "ESSA has no test-split periodic evaluation; its curve is the CMA-ES mean "
                               "on val_examples held-out problems every val_every generations")
        return self

    @model_validator(mode="before")
    @classmethod
    def _lora_targets(cls, data: Any) -> Any:
        """lora_targets is attention, all, or a non-empty list of distinct module names (whether the model has them
        is checked on the model, before the SFT: esrepro.essa.lora.lora_target_modules)."""
        if not isinstance(data, dict) or "lora_targets" not in data:
            return data
        value = data["lora_targets"]
        if isinstance(value, str) and value not in ("attention", "all"):
            raise FieldProblem("lora_targets", f"lora_targets {value!r} is neither attention nor all; a list names "
                               f"modules: [{value}]")
        if isinstance(value, (list, tuple)):
            if not value:
                raise FieldProblem("lora_targets", "lora_targets is an empty list: name the linear modules to adapt "
                                   "(q_proj, v_proj), or say attention or all")
            bad = [v for v in value if not isinstance(v, str) or not v.strip() or "." in v or v != v.strip()]
            if bad:
                raise FieldProblem("lora_targets", f"lora_targets {list(value)!r}: {bad[0]!r} is not a module name "
                                   "(a linear layer's own name, q_proj, not a path)")
            if len(set(value)) != len(value):
                raise FieldProblem("lora_targets", f"lora_targets {list(value)!r}: names must be distinct")
        return data

    @model_validator(mode="after")
    def _vllm_precision(self) -> "ESSASettings":
        """int8 on vLLM is refused: vLLM 0.32.0's bitsandbytes (its vllm-bnb-plugin) reads 8-bit weights only from a
        checkpoint saved quantised, and quantises a base as it loads to 4 bits only (esrepro.essa.vllm_engine)."""
        if self.backend == "vllm" and self.precision == "int8":
            raise FieldProblem("precision", "precision int8 runs on the hf backend only: vLLM's bitsandbytes plugin "
                               "quantises to 8 bits only checkpoints saved already quantised, not a base as it loads; "
                               "use backend: hf (or precision native or int4 on vllm)")
        return self


def with_former_names(algorithm: str, values: dict | None) -> dict:
    """``values`` (settings or grid keys of ``algorithm``) keyed by their names before any rename (FORMER_NAMES)."""
    former = FORMER_NAMES.get(algorithm, {})
    return {former.get(k, k): v for k, v in (values or {}).items()}


@dataclass(frozen=True)
class Algorithm:
    """A trainer the ``train`` rule can run: its settings class and how the plan treats its runs."""

    name: str
    settings: type[MethodSettings]
    defaults: str  # the config's defaults.<block> this algorithm's methods start from
    trainer: str  # "module:function" with the signature of esrepro.train.Trainer
    rl: bool  # budgeted by an ES method, trained per grid cell, best cell kept (Table 3)
    description: str


#: The algorithms the ES loop trains (esrepro.es.train): full-rank ES and low-rank ES (EGGROLL). Their jobs are laid
#: out, checked, priced and counted alike: engines scoring a population, iterations, no optimiser state.
ES_ALGORITHMS: tuple[str, ...] = ("es", "eggroll")

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("es", ESSettings, "es", "esrepro.es.train:train_es", False, "full-parameter evolution strategies"),
        Algorithm("eggroll", EggrollSettings, "es", "esrepro.es.train:train_es", False,
                  "low-rank evolution strategies (EGGROLL): rank-r member perturbations of the linear layers"),
        Algorithm("grpo", GRPOSettings, "grpo", "esrepro.rl.run:train_rl", True, "GRPO (TRL GRPOTrainer)"),
        Algorithm("dr_grpo", GRPOSettings, "grpo", "esrepro.rl.run:train_rl", True, "Dr.GRPO (TRL GRPOTrainer)"),
        Algorithm("verl_grpo", GRPOSettings, "grpo", "esrepro.rl.run:train_rl", True,
                  "GRPO with VERL's defaults and token-mean loss (TRL GRPOTrainer)"),
        Algorithm("verl_dr_grpo", GRPOSettings, "grpo", "esrepro.rl.run:train_rl", True,
                  "Dr.GRPO with VERL's defaults and seq-mean-token-sum-norm loss (TRL GRPOTrainer)"),
        Algorithm("grpo_zero", GRPOSettings, "grpo", "esrepro.rl.run:train_rl", True,
                  "GRPO as GRPO-Zero runs it: token losses over the step's generated tokens (TRL GRPOTrainer, dapo)"),
        Algorithm("ppo", PPOSettings, "ppo", "esrepro.rl.run:train_rl", True, "PPO with a critic (esrepro.rl.ppo)"),
        Algorithm("essa", ESSASettings, "essa", "esrepro.essa.train:train_essa", False,
                  "ESSA: CMA-ES over the singular values of SFT LoRA adapters"),
    )
}


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; a KeyError names the known ones."""
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
