"""GRPO and Dr.GRPO through TRL's ``GRPOTrainer`` (trl 1.16), every drifting default pinned.

TRL's defaults moved between releases (1.x: ``loss_type="dapo"``, ``beta=0``,
``bf16=True``, ``gradient_checkpointing=True``), so the config names every option that
decides the algorithm, and :func:`grpo_config_kwargs` refuses settings that leave one out.
GRPO = ``loss_type: grpo`` with ``scale_rewards: group``; Dr.GRPO = ``loss_type: dr_grpo``
with ``scale_rewards: none``. The reward is the task's own ``Task.score``.

Mixed precision as the libraries intend it: the policy's master weights are float32 whatever
the registry dtype (an AdamW step of lr 1e-6 is below half a bf16 ulp of any weight above ~4e-4,
so bf16 master weights would not move) and ``bf16: true`` autocasts the forward and backward
passes. TRL 1.16 builds the reference model from the same ``model_init_kwargs``, so it is
float32 too. The final checkpoint is saved in the registry dtype, as every method's.

On CPU, bf16, gradient checkpointing, vLLM rollouts and FSDP are forced off (bf16 autocast is
about 6x slower on CPU; checkpointing only trades memory for time; vLLM colocate needs GPUs;
accelerate 1.15 enables FSDP for accelerator processes only and runs CPU processes as MULTI_CPU
data parallel whatever plugin it is given).

Under a distributed launcher (one process per GPU) the settings' batch is the job's total per
optimiser step, shared by the processes (esrepro.rl.grpo_parallel); ``sharding: fsdp`` shards
the policy through accelerate's FSDP2. There bf16 also sets FSDP2's mixed-precision policy, under
accelerate's autocast: each unit's parameters are gathered in bf16 for the passes, gradients are reduced in
float32 into the float32 master shards, and outputs (the logits of the log-probabilities) are
float32 (esrepro.rl.grpo_parallel.set_mixed_precision; accelerate's own policy would reduce and
return in bf16). With ``resume_dir`` the run writes TRL's checkpoints there
every ``resume_every`` steps and a restarted run continues from the last one (esrepro.rl.trl_resume).

The policy is either every weight of the checkpoint in ``model_dir`` (TRL loads it from
the path) or, with ``adapter_dir``, only the LoRA matrices of that peft adapter on top of
``model_dir`` (loaded trainable by peft and handed to TRL as a ``PeftModel``). With
``beta > 0`` the reference is the policy's start either way: TRL loads the checkpoint in
``model_dir`` again for a full policy and, for a peft policy (TRL 1.16 with peft >= 0.20),
adds a frozen copy of the loaded adapter named ``ref`` (with a freshly initialised adapter
that would equal the base). Kept snapshots and the final weights of a peft policy are its
adapter (``default`` only), in peft format.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from esrepro.models.loading import DTYPES, load_model, load_tokenizer, save_adapter, save_checkpoint
from esrepro.rl import phases
from esrepro.rl.reward import EXAMPLE_COLUMN, trl_reward_func
from esrepro.runtime import numerics
from esrepro.settings.methods import GRPO_VARIANTS, GRPOSettings, RLSettings
from esrepro.tasks.base import Task
from esrepro.train.resume import announce_resume

#: GRPOSettings fields of our own that shape TRL's batches rather than being GRPOConfig keys (grpo_config_kwargs,
#: training_dataset).
OWN_KEYS: tuple[str, ...] = ("updates_per_generation", "repeat_prompts")
#: GRPOConfig keys (in our names, TRL_NAMES): every GRPOSettings field that is not one of our own run options.
TRL_KEYS: tuple[str, ...] = tuple(k for k in GRPOSettings.model_fields
                                  if k not in RLSettings.model_fields and k not in OWN_KEYS)
#: Keys that may be left out (TRL's default is ours); every other TRL key must be given explicitly,
#: since TRL's defaults moved between releases.
OPTIONAL_KEYS: tuple[str, ...] = ("epsilon_high", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
                                   "vllm_tensor_parallel_size", "vllm_max_model_length", "vllm_enable_sleep_mode",
                                   "vllm_importance_sampling_correction")
#: The master weights of a full-parameter policy (the optimiser updates them; bf16 autocasts the passes).
MASTER_DTYPE = "float32"
PINNED_KEYS: tuple[str, ...] = tuple(k for k in TRL_KEYS if k not in OPTIONAL_KEYS)
#: Our names of GRPOConfig keys that TRL calls otherwise (ours -> TRL's): one name per meaning across methods.
TRL_NAMES: dict[str, str] = {"max_new_tokens": "max_completion_length"}
#: The algorithm each name stands for (checked, so a config cannot call dapo "grpo").
ALGORITHM_LOSS = GRPO_VARIANTS


def grpo_config_kwargs(settings: dict, *, steps: int, seed: int, output_dir: str, on_cpu: bool, world_size: int = 1,
                       fsdp_layers: list[str] | None = None, resume: bool = False,
                       prompt_tokens: int | None = None) -> dict[str, Any]:
    """The ``GRPOConfig`` arguments of one run, from our settings block (in TRL's key names: TRL_NAMES).

    ``world_size``: training processes sharing each step's batch (esrepro.rl.grpo_parallel.process_batch);
    ``fsdp_layers``: the decoder layer classes to shard with ``sharding: fsdp``; ``resume``: write TRL
    checkpoints into ``output_dir`` every ``resume_every`` steps (else none); ``prompt_tokens``: the longest
    training prompt as TRL encodes it (:func:`longest_prompt_tokens`), which with ``use_vllm`` sizes vLLM's context
    (``vllm_max_model_length``: that plus ``max_new_tokens``) unless the settings give one. Left to vLLM, the
    context is the model's whole window (131,072 tokens for Llama-3.1-8B), whose KV cache does not fit in
    ``vllm_gpu_memory_utilization`` (0.3) of a GPU, and the engine refuses to start."""
    missing = [k for k in PINNED_KEYS if k not in settings]
    if missing:
        raise ValueError(f"GRPO settings must pin {', '.join(missing)} (TRL defaults differ between releases)")
    algorithm = settings["algorithm"]
    want = ALGORITHM_LOSS.get(algorithm)
    if want is None:
        raise ValueError(f"algorithm {algorithm!r} is not a GRPO variant; expected one of {sorted(ALGORITHM_LOSS)}")
    if (settings["loss_type"], settings["scale_rewards"]) != want:
        raise ValueError(f"algorithm {algorithm}: loss_type/scale_rewards must be {want[0]}/{want[1]}, got "
                         f"{settings['loss_type']}/{settings['scale_rewards']}")
    kw = {TRL_NAMES.get(k, k): settings[k] for k in TRL_KEYS if k in settings}
    if on_cpu:
        kw.update(bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True, use_vllm=False)
    if kw.get("use_vllm") and kw.get("vllm_max_model_length") is None:
        if prompt_tokens is None:
            raise ValueError("use_vllm: vLLM's context (vllm_max_model_length) is the longest prompt plus "
                             "max_new_tokens; give the longest prompt's length (prompt_tokens) or set "
                             "vllm_max_model_length")
        kw["vllm_max_model_length"] = int(prompt_tokens) + int(kw["max_completion_length"])
    if world_size > 1:
        from esrepro.rl.grpo_parallel import process_batch

        kw.update(process_batch(settings, world_size), ddp_find_unused_parameters=False)  # every trained weight is used
    # a rollout of updates_per_generation optimiser steps: TRL counts steps_per_generation in micro-steps per process
    kw["steps_per_generation"] = int(settings.get("updates_per_generation", 1)) * int(kw["gradient_accumulation_steps"])
    if settings.get("sharding", "ddp") == "fsdp" and not on_cpu:  # accelerate shards on accelerators only
        if fsdp_layers is None:
            raise ValueError("sharding: fsdp needs the decoder layer classes to wrap (fsdp_layers)")
        from esrepro.rl.grpo_parallel import fsdp_kwargs

        kw.update(fsdp_kwargs(fsdp_layers, kw.get("gradient_checkpointing", False)))
    if settings.get("collective_timeout"):  # accelerate's process group waits this long in a collective
        kw["ddp_timeout"] = int(settings["collective_timeout"])
    if resume:
        every = settings.get("resume_every", 50)
        if every == "auto":
            raise ValueError("resume_every: auto is resolved by the plan from the run's resume state and step time "
                             "(esrepro.planning.resume_cost); a run given it directly needs a number of steps")
        per_rollout = int(settings.get("updates_per_generation", 1) or 1)
        if int(every) % per_rollout:
            raise ValueError(
                f"resume_every: {every} steps is not a multiple of updates_per_generation ({per_rollout}): TRL keeps "
                "neither the rollout nor its place in it in a checkpoint, so a run resumed inside a rollout would "
                "generate a new one there and shift every later rollout's mini-batches; resume on rollout "
                f"boundaries (a multiple of {per_rollout})")
        kw.update(save_strategy="steps", save_steps=int(every), save_total_limit=None, save_only_model=False)
    else:
        kw.update(save_strategy="no")
    kw.update(
        output_dir=output_dir, max_steps=steps, seed=seed, data_seed=seed, logging_steps=1,
        report_to=[], log_completions=False, dataloader_num_workers=0, shuffle_dataset=True, do_eval=False,
        eval_strategy="no", disable_tqdm=True, optim=numerics.TRAINER_OPTIM,
    )
    return kw


def cpu_overrides(settings: dict) -> dict[str, Any]:
    """Settings the CPU path changed (recorded in the manifest)."""
    out: dict[str, Any] = {k: False for k in ("bf16", "gradient_checkpointing", "use_vllm") if settings.get(k)}
    if settings.get("sharding", "ddp") == "fsdp":
        out["sharding"] = "ddp"  # accelerate 1.15 keeps FSDP for accelerator processes; on CPU it runs MULTI_CPU
    return out


def training_examples(examples: list[dict], settings: dict) -> list[dict]:
    """The problems TRL samples rollouts from: ``examples``, or with ``repeat_prompts`` as many whole copies of them
    as make whole rollouts (TRL's RepeatSampler drops a last incomplete one each pass) when one rollout draws more
    prompts than there are problems. TRL shuffles the copies together, so a rollout holds each problem about
    ``prompts per rollout / problems`` times."""
    from esrepro.rl.budget import prompts_per_generation

    need = prompts_per_generation(settings)
    if not settings.get("repeat_prompts") or need <= len(examples):
        return list(examples)
    copies = math.lcm(len(examples), need) // len(examples)
    return [e for _ in range(copies) for e in examples]


def longest_prompt_tokens(tokenizer: Any, prompts: list[str], chat: bool) -> int:
    """The longest of ``prompts`` in tokens as TRL 1.16's GRPOTrainer encodes them for generation: the chat
    template with the generation prompt (tokenized by the template) for a chat model, else the tokenizer's own
    call (special tokens such as BOS included)."""
    if chat:
        return max(len(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=True)["input_ids"])
                   for p in prompts)
    return max(len(ids) for ids in tokenizer(list(prompts))["input_ids"])


def _dataset(task: Task, examples: list[dict], chat: bool):
    from datasets import Dataset

    rows = []
    for e in examples:
        text = task.prompt(e)
        prompt: Any = [{"role": "user", "content": text}] if chat else text
        rows.append({"prompt": prompt, EXAMPLE_COLUMN: json.dumps(e, sort_keys=True)})
    return Dataset.from_list(rows)


def is_peft(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a peft model (a trained adapter on a frozen base)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def save_policy(model: torch.nn.Module, tokenizer: Any, path: str | Path) -> None:
    """Save a GRPO policy: a peft policy as its trained adapter (not TRL's frozen ``ref`` copy), else a checkpoint."""
    if is_peft(model):
        save_adapter(model, path, selected_adapters=["default"])
    else:
        save_checkpoint(model, tokenizer, path)


def collective_timeout(settings: dict) -> int:
    """Seconds a collective of the run waits for every process: the settings' ``collective_timeout``, else the
    Trainer's own default (TrainingArguments' ``ddp_timeout``), as accelerate would set it."""
    from transformers import TrainingArguments

    return int(settings.get("collective_timeout") or TrainingArguments.__dataclass_fields__["ddp_timeout"].default)


def process_device(on_cpu: bool, local_rank: int = 0) -> str:
    """The one device a training process loads its models on: ``cpu``, or its own GPU ``cuda:LOCAL_RANK`` (with the
    index, which transformers' Trainer compares with its own device to tell a placed model from a split one)."""
    return "cpu" if on_cpu else f"cuda:{local_rank}"


def policy_init_kwargs(device: str) -> dict:
    """How a full policy is loaded: float32 master weights, whole on the process's own ``device`` (:func:`_policy`)."""
    return {"dtype": DTYPES[MASTER_DTYPE], "device_map": {"": device}}


def _policy(model_dir: str | Path, adapter_dir: str | Path | None, dtype: str,
            device: str = "cpu", meta_reference: bool = False) -> tuple[Any, dict | None]:
    """What GRPOTrainer gets as ``model`` and ``model_init_kwargs``: the checkpoint's path (TRL loads it in
    float32 master weights, every weight trainable), or the base in the registry dtype with the adapter loaded
    trainable by peft (peft keeps adapter weights in float32; no kwargs then).

    TRL 1.16 loads the policy, and the reference model of ``beta > 0``, from these kwargs; it sets ``device_map``
    to None itself only under DDP (MULTI_GPU) and DeepSpeed, so under FSDP both would load with transformers'
    ``device_map="auto"``, spread over every GPU the process sees (all of the node's under torchrun). The kwargs
    therefore place them whole on the process's own ``device`` (:func:`process_device`), from where FSDP2 shards
    them (TRL's DDP path still replaces this with None and accelerate moves the model).

    ``meta_reference`` (a full policy): the policy is loaded here, whole on ``device`` as TRL would load it, and the
    kwargs, which then make only the reference, build it on the meta device, for
    :func:`esrepro.rl.meta_load.sharded_reference_trainer` to shard and fill."""
    if adapter_dir is None:
        kwargs = policy_init_kwargs(device)
        if not meta_reference:
            return str(model_dir), kwargs
        from transformers import AutoModelForCausalLM

        from esrepro.rl.meta_load import META_DEVICE_MAP

        return AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs), {**kwargs, "device_map": META_DEVICE_MAP}
    if meta_reference:
        raise ValueError("a peft policy's reference is its frozen adapter copy, not a model to shard")
    from peft import PeftModel

    base = load_model(model_dir, dtype=dtype)
    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True), None


def shards_reference(settings: dict, fsdp: bool, adapter: bool) -> bool:
    """Whether the run's reference model is built on the meta device and loaded sharded (a full policy under FSDP
    with ``beta > 0``) rather than loaded whole by TRL: TRL starts the colocated vLLM engine before it shards the
    reference, so a whole float32 reference beside the whole policy (about 57-60 GiB on 7-8B models) would leave
    the engine too little of the GPU."""
    return fsdp and not adapter and float(settings.get("beta", 0) or 0) > 0


def reference_state(settings: dict, fsdp: bool, adapter: bool) -> str:
    """The reference model as the run's trainer is built (esrepro.rl.phases.REFERENCE_STATES): ``none`` (beta 0, or
    a peft policy's frozen adapter copy inside the policy), ``sharded`` (:func:`shards_reference`) or ``whole``."""
    if adapter or not float(settings.get("beta", 0) or 0) > 0:
        return "none"
    return "sharded" if shards_reference(settings, fsdp, adapter) else "whole"


def make_trainer(model_dir: str | Path, adapter_dir: str | Path | None, dtype: str, config_kwargs: dict, *,
                 device: str, fsdp: bool, sharded_reference: bool, resumable: bool, **trainer_kwargs: Any) -> Any:
    """TRL's GRPOTrainer for one run: the policy (:func:`_policy`), the config from ``config_kwargs``
    (:func:`grpo_config_kwargs`), FSDP2's mixed precision under ``fsdp``, the resumable sampler with ``resumable``
    (esrepro.rl.trl_resume) and, with ``sharded_reference`` (:func:`shards_reference`), the reference built on the
    meta device and sharded before the colocated vLLM engine starts (esrepro.rl.meta_load)."""
    from trl import GRPOConfig, GRPOTrainer

    from esrepro.rl import trl_resume

    policy, init_kwargs = _policy(model_dir, adapter_dir, dtype, device, meta_reference=sharded_reference)
    cfg = GRPOConfig(**config_kwargs, model_init_kwargs=init_kwargs)
    if fsdp:
        from esrepro.rl.grpo_parallel import set_mixed_precision

        set_mixed_precision(cfg, bool(cfg.bf16))
    trainer_class = trl_resume.resumable_trainer_class() if resumable else GRPOTrainer
    if sharded_reference:
        from esrepro.rl.meta_load import sharded_reference_trainer

        trainer_class = sharded_reference_trainer(trainer_class, model_dir, device, bool(cfg.bf16))
    return trainer_class(model=policy, args=cfg, **trainer_kwargs)


def train_grpo(
    model_dir: str | Path,
    task: Task,
    examples: list[dict],
    settings: dict,
    *,
    steps: int,
    seed: int,
    dtype: str = "float32",
    chat: bool = False,
    snapshot_dir: str | Path | None = None,
    periodic: tuple[Any, int] | None = None,
    adapter_dir: str | Path | None = None,
    resume_dir: str | Path | None = None,
) -> tuple[torch.nn.Module, Any, list[dict]]:
    """Run TRL's GRPOTrainer for ``steps`` optimiser steps; returns (policy, tokenizer, log rows).

    ``adapter_dir``: train only this peft adapter on the base in ``model_dir`` (the policy returned is then a
    ``PeftModel``; save it with :func:`save_policy`).

    ``periodic``: (:class:`esrepro.train.periodic.PeriodicEval`, completions per step): evaluate the policy
    greedily before training and every ``eval_every`` steps (v2, Figure 7).

    ``resume_dir``: write TRL checkpoints there every ``resume_every`` steps and continue from the last complete
    one (its log and periodic rows restored; a state of other settings is refused).

    Under a distributed launcher every process calls this; each returns the whole policy (under FSDP gathered
    before returning), and only the main process keeps snapshots and evaluates periodically.

    One log row per step: ``step``, ``reward_mean``, ``reward_std``, ``loss``, ``entropy``,
    ``completion_length``, ``learning_rate``, ``seconds`` and, only when ``beta > 0``, ``kl``.
    """
    from transformers import TrainerCallback

    numerics.portable_trl()  # the advantages' standard deviation with a correctly rounded square root
    from esrepro.rl import trl_resume
    from esrepro.rl.budget import check_problem_count
    from esrepro.runtime.distributed import barrier, init_process_group, world

    check_problem_count(settings, len(examples))
    on_cpu = not torch.cuda.is_available()
    here = world()
    if not on_cpu:
        from esrepro.rl.grpo_parallel import check_launch

        check_launch(here.world_size, torch.cuda.device_count())
    sharded = settings.get("sharding", "ddp") == "fsdp"
    fsdp = sharded and not on_cpu  # cpu_overrides: accelerate runs CPU processes without FSDP
    if sharded and adapter_dir is not None:
        raise ValueError("sharding: fsdp trains every weight; a LoRA adapter (adapter_dir) runs with sharding: ddp")
    tokenizer = load_tokenizer(model_dir)  # our tokenizer class, not AutoProcessor's guess
    tokenizer.padding_side = "left"
    rows: list[dict] = []
    periodic_rows: dict[str, list[dict]] = {"periodic": periodic[0].rows} if periodic is not None else {}
    checkpoint = None
    key = trl_resume.resume_key(settings, seed=seed, steps=steps, world_size=here.world_size)
    if resume_dir is not None:
        # the group accelerate would create with the Trainer, created now (accelerate keeps a group that exists) so
        # that the barrier below has processes to wait for
        init_process_group(process_device(on_cpu, here.local_rank), collective_timeout(settings))
        checkpoint, restored = trl_resume.open_state(resume_dir, key, periodic_rows, clean=here.is_main)
        rows.extend(restored)
        if checkpoint is not None and here.is_main:
            announce_resume("GRPO", checkpoint, len(restored), steps)
        barrier()  # the main process has removed an interrupted save before any process looks for checkpoints

    class _Log(TrainerCallback):
        """One row per optimiser step; a step without a rollout of its own (``updates_per_generation`` > 1) trains on
        the last rollout's completions and repeats its reward and length."""

        def __init__(self) -> None:
            self.t0 = time.perf_counter()
            self.rollout: dict | None = None

        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001 - TRL callback signature
            logs = logs or {}
            if "reward" in logs:
                self.rollout = {"reward_mean": logs["reward"], "reward_std": logs.get("reward_std"),
                                "completion_length": logs.get("completions/mean_length")}
            elif "loss" not in logs or self.rollout is None:
                return
            row = {
                "step": state.global_step - 1,
                "reward_mean": self.rollout["reward_mean"],
                "reward_std": self.rollout["reward_std"],
                "loss": logs.get("loss"),
                "entropy": logs.get("entropy"),
                "completion_length": self.rollout["completion_length"],
                "learning_rate": logs.get("learning_rate"),
                "seconds": time.perf_counter() - self.t0,
            }
            if "kl" in logs:
                row["kl"] = logs["kl"]
            rows.append(row)
            self.t0 = time.perf_counter()

    class _Snapshot(TrainerCallback):
        """Keep the policy (a peft policy: its adapter) every ``keep_every`` steps under ``snapshot_dir/iterNNNNNN``
        (not the final one); under FSDP every process takes part in gathering it."""

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001 - TRL callback signature
            every = settings.get("keep_every")
            if snapshot_dir is None or not every or state.global_step % every or state.global_step >= steps:
                return
            from esrepro.io import atomic_path
            from esrepro.paths import snapshot_name

            whole = _whole_policy(trainer, model_dir) if fsdp else model
            if here.is_main:
                with atomic_path(Path(snapshot_dir) / snapshot_name(state.global_step), is_dir=True) as out:
                    save_policy(whole, tokenizer, out)

    class _Periodic(TrainerCallback):
        """Greedy test accuracy of the policy before training and every ``eval_every`` optimiser steps, on the main
        process; under FSDP every process takes part in gathering the policy into a registry-dtype copy on the
        main process's device, which is evaluated and dropped."""

        def _point(self, step: int, model) -> None:  # noqa: ANN001
            from esrepro.train.periodic import policy_point

            phases.enter(phases.EVALUATE)
            if fsdp:
                model = _whole_policy(trainer, model_dir, dtype=dtype, device=str(trainer.args.device))
            if not here.is_main:
                return
            evaluation, per_step = periodic
            policy_point(evaluation, step, per_step, model, tokenizer, str(next(model.parameters()).device),
                         settings.get("eval_batch_size"), chat)
            if fsdp:
                del model
                torch.cuda.empty_cache()

        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001 - TRL callback signature
            if periodic is not None and model is not None and state.global_step == 0:
                self._point(0, model)

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001 - TRL callback signature
            if periodic is not None and model is not None and periodic[0].due(state.global_step):
                self._point(state.global_step, model)

    callbacks = [_Log(), _Snapshot(), _Periodic()]
    if resume_dir is not None:
        callbacks.append(trl_resume.callback(key, rows, periodic_rows))
    fsdp_layers = None
    if fsdp:
        from esrepro.rl.grpo_parallel import decoder_layer_classes

        fsdp_layers = decoder_layer_classes(model_dir)
    with tempfile.TemporaryDirectory(prefix="grpo-") as tmp:
        out_dir = str(resume_dir) if resume_dir is not None else tmp
        prompt_tokens = None
        if settings.get("use_vllm") and not on_cpu:
            prompt_tokens = longest_prompt_tokens(tokenizer, sorted({task.prompt(e) for e in examples}), chat)
        config_kwargs = grpo_config_kwargs(settings, steps=steps, seed=seed, output_dir=out_dir, on_cpu=on_cpu,
                                           world_size=here.world_size, fsdp_layers=fsdp_layers,
                                           resume=resume_dir is not None, prompt_tokens=prompt_tokens)
        trainer = make_trainer(model_dir, adapter_dir, dtype, config_kwargs,
                               device=process_device(on_cpu, here.local_rank), fsdp=fsdp,
                               sharded_reference=shards_reference(settings, fsdp, adapter_dir is not None),
                               resumable=resume_dir is not None, reward_funcs=[trl_reward_func(task)],
                               train_dataset=_dataset(task, training_examples(examples, settings), chat),
                               processing_class=tokenizer, callbacks=callbacks)
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        model = _whole_policy(trainer, model_dir) if fsdp else trainer.model
    if len(rows) != steps:
        raise RuntimeError(f"GRPO logged {len(rows)} of its {steps} steps (TRL stopped early); nothing was saved")
    if here.is_main and not is_peft(model) and model.dtype != DTYPES[dtype]:
        model.to(DTYPES[dtype])  # saved in the registry dtype, as every method's checkpoint
    model.eval()
    return model, tokenizer, rows


def _whole_policy(trainer: Any, model_dir: str | Path, dtype: str = MASTER_DTYPE, device: str = "cpu"
                  ) -> torch.nn.Module:
    """The FSDP-sharded policy gathered whole (a collective: every process calls it): on the main process a fresh
    copy of the model in ``dtype`` on ``device`` with the gathered weights, on the others the unwrapped (sharded)
    module."""
    from esrepro.runtime.distributed import world

    state = trainer.accelerator.get_state_dict(trainer.model)  # full state dict, on the main process only
    if not world().is_main:
        return trainer.accelerator.unwrap_model(trainer.model)
    model = load_model(model_dir, dtype=dtype, device=device)
    model.load_state_dict(state)
    return model
