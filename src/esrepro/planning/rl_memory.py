"""One RL training process's GPU memory, phase by phase, in the order its code runs (esrepro.rl.phases): what is
held in each phase (bytes per component) from the job's built arguments (GRPO: its ``GRPOConfig`` keyword
arguments, :func:`esrepro.rl.grpo.grpo_config_kwargs`; PPO: its per-process shares) and the model's shape.

Each phase is the state every earlier phase left (the policy and reference as loaded or sharded, the engine's
share once it has started, the optimiser's state once training runs) plus what the phase itself allocates. The
phase names and their order come from :func:`esrepro.rl.phases.grpo_order` / :func:`~esrepro.rl.phases.ppo_order`,
which a real run's trace is checked against (esrepro.rl.phase_trace); a phase the order names and this module
does not count is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from esrepro.models import memory as M
from esrepro.models.memory import Phase
from esrepro.rl import phases as PH


@dataclass(frozen=True)
class Evaluation:
    """A periodic evaluation's generation on the main process (transformers ``generate`` on the policy; under FSDP
    on a whole bf16 copy gathered beside everything the process holds): prompts per call and their tokens."""

    batch: int
    prompt: int
    new_tokens: int


def _gib(parts: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in parts.items() if v}


def _generate(m: M.ModelFacts, batch: int, prompt: int, new_tokens: int) -> dict[str, int]:
    """transformers ``generate``'s peak beyond the weights: the prompt's forward or the end of decoding."""
    fill = batch * prompt * m.kv_bytes_per_token + M.prefill(m, batch, prompt)
    decode = M.generate_kv(m, batch, prompt + new_tokens)
    return ({f"generate KV cache ({batch} x {prompt + new_tokens:,} tokens)": decode} if decode >= fill
            else {f"prompt forward ({batch} x {prompt:,} tokens)": fill})


def grpo_phases(m: M.ModelFacts, kw: dict, settings: dict, world: int, adapter: bool, prompt: int,
                reference: str, evaluation: Evaluation | None, resume: bool) -> tuple[list[Phase], M.VLLMFit | None]:
    """One GRPO process's phases (and the colocated engine's fit) from its built ``GRPOConfig`` arguments ``kw``:
    ``reference`` as :func:`esrepro.rl.phases.grpo_order` takes it (esrepro.rl.grpo.reference_state)."""
    fsdp = "fsdp_config" in kw
    n = world if fsdp else 1
    P = m.params
    micro = int(kw["per_device_train_batch_size"])
    completion = int(kw["max_completion_length"])
    seq = prompt + completion
    bf16 = bool(kw.get("bf16"))
    use_vllm = bool(kw.get("use_vllm"))
    vllm = None
    if use_vllm:
        tp = int(kw.get("vllm_tensor_parallel_size") or 1)
        vllm = M.vllm_fit(m, utilization=float(kw["vllm_gpu_memory_utilization"]), tp=tp,
                          max_model_len=kw.get("vllm_max_model_length"),
                          max_num_seqs=micro * tp * int(kw["steps_per_generation"]),
                          max_num_batched_tokens=M.TRL_VLLM_BATCHED_TOKENS)
    order = PH.grpo_order(use_vllm=use_vllm, fsdp=fsdp, reference=reference, old_logps=PH.trl_old_logps(kw),
                          periodic=evaluation is not None, resume=resume)
    held: dict[str, int] = {"CUDA context": int(M.CUDA_CONTEXT)}
    if adapter:
        held["frozen base (bf16)"] = 2 * P
    else:
        held["policy loaded whole (float32)"] = 4 * P
    if reference == "whole":
        held["reference loaded whole (float32)"] = 4 * P
    reserved = 0
    trained = False
    out: list[Phase] = []
    gathered_ref = 2 * P if reference == "whole" else M.fsdp_transient(m, n, grad=False)

    def policy_units(grad: bool) -> dict[str, int]:
        if fsdp:
            return {"FSDP gathered units": M.fsdp_transient(m, n, grad)}
        if not adapter and bf16 and grad:  # autocast keeps a bf16 copy of every weight for the backward
            return {"bf16 autocast copies of the weights": 2 * P}
        return {}

    for name in order:
        extra: dict[str, int] = {}
        if name == PH.LOAD:
            pass
        elif name == PH.SHARD_REFERENCE:
            held.pop("reference loaded whole (float32)", None)
            if reference == "whole":  # TRL's prepare_fsdp: the shards made while the whole copy is alive
                extra["reference loaded whole (float32)"] = 4 * P
            else:  # meta_load: filled tensor by tensor from rank 0's broadcast
                extra["one tensor broadcast (float32)"] = 4 * m.largest_tensor
            held[f"reference shard, float32 (1/{n})"] = 4 * P // n
        elif name == PH.START_VLLM:
            held["colocated vLLM (its share)"] = vllm.budget
            reserved = vllm.budget
        elif name == PH.SHARD_POLICY:  # accelerate 1.15's fsdp2_prepare_model keeps the whole state dict
            # (``original_sd``) while fully_shard makes every unit's shards
            extra["policy loaded whole (float32)"] = held.pop("policy loaded whole (float32)")
            extra[f"policy shards, float32 (1/{n})"] = 4 * P // n
        elif name == PH.EVALUATE:
            if not trained:
                _train_state(held, adapter, P, n)
                trained = True
            if fsdp:  # esrepro.rl.grpo._whole_policy: a registry-dtype copy on the main process's GPU
                extra["policy gathered whole for evaluation (bf16)"] = 2 * P
            extra.update(_generate(m, evaluation.batch, evaluation.prompt, evaluation.new_tokens))
        elif name == PH.ROLLOUT:
            if not trained:
                _train_state(held, adapter, P, n)
                trained = True
            if use_vllm:
                extra["weight sync (one tensor gathered, float32)"] = 4 * m.largest_tensor
            else:  # transformers generate on the policy, gathered whole under FSDP
                if fsdp:
                    extra["policy gathered whole for the rollout (bf16)"] = 2 * P
                extra.update(_generate(m, micro * int(kw["steps_per_generation"]), prompt, completion))
        elif name == PH.OLD_LOGPS:
            extra.update(policy_units(False))
            extra["forward activations (no gradient)"] = M.forward_activations(m, micro, seq)
            extra["fused LM head (no gradient)"] = M.trl_head(m, micro * completion, False)
        elif name == PH.REFERENCE_FORWARD:
            if fsdp:
                extra["reference gathered" + (" whole (bf16, one FSDP unit)" if reference == "whole"
                                              else " (bf16, two layers and the root)")] = gathered_ref
            extra["forward activations (no gradient)"] = M.forward_activations(m, micro, seq)
            extra["fused LM head (no gradient)"] = M.trl_head(m, micro * completion, False)
        elif name == PH.POLICY_PASS:
            extra.update(policy_units(True))
            extra["activations"] = M.training_activations(m, micro, seq, bool(settings.get("gradient_checkpointing")))
            extra["fused LM head and its gradients"] = M.trl_head(m, micro * completion, True)
        elif name == PH.SAVE:
            extra["one tensor staged for writing (float32)"] = 4 * m.largest_tensor
        else:
            raise ValueError(f"GRPO phase {name!r} (esrepro.rl.phases) is not counted by esrepro.planning.rl_memory")
        out.append(Phase(name, _gib({**held, **extra}), reserved=reserved))
    return _first_of_each(out), vllm


def _train_state(held: dict[str, int], adapter: bool, P: int, n: int) -> None:
    """The trained weights' state once training runs: float32 master, gradients and AdamW's moments (a 1/n share),
    or a peft adapter's (small: left to the margin)."""
    if adapter:
        return
    held.pop("policy loaded whole (float32)", None)
    held.pop(f"policy shards, float32 (1/{n})", None)
    held[f"float32 master, gradients, AdamW (1/{n})"] = 16 * P // n


def _first_of_each(phases: list[Phase]) -> list[Phase]:
    """One row per phase name (a phase that recurs, such as evaluation, at its largest)."""
    best: dict[str, Phase] = {}
    for ph in phases:
        if ph.name not in best or ph.with_margin > best[ph.name].with_margin:
            best[ph.name] = ph
    return [best[name] for name in dict.fromkeys(ph.name for ph in phases)]


def ppo_phases(m: M.ModelFacts, cfg, share: dict, world: int, sharded_load: bool, prompt: int,
               evaluation: Evaluation | None = None, resume: bool = False) -> list[Phase]:
    """One PPO process's phases (``share``: its per-process batch, esrepro.rl.shares.per_process)."""
    fsdp = cfg.sharding == "fsdp"
    n = world if fsdp else 1
    P = m.params
    beta = cfg.beta > 0
    ref_sharded = fsdp and sharded_load
    seq = prompt + cfg.max_new_tokens
    mb = share["micro_batch_size"]
    held: dict[str, int] = {"CUDA context": int(M.CUDA_CONTEXT),
                            f"actor and critic: float32 master, gradients, AdamW (1/{n})": 2 * 16 * P // n}
    if beta:
        held["reference, bf16" + (f" (1/{n})" if ref_sharded else " (whole)")] = 2 * P // (n if ref_sharded else 1)
    if sharded_load:
        load = {"CUDA context": int(M.CUDA_CONTEXT), f"actor, critic shards, float32 (1/{n})": 2 * 4 * P // n,
                **({f"reference shard, bf16 (1/{n})": 2 * P // n} if beta else {}),
                "one unit gathered": M.fsdp_transient(m, n)}
    else:
        load = {"CUDA context": int(M.CUDA_CONTEXT), "actor loaded whole (float32)": 4 * P,
                "critic loaded whole (float32)": 4 * P, **({"reference loaded whole (bf16)": 2 * P} if beta else {})}
    gathered = {"actor gathered whole (bf16)": 2 * P} if fsdp else \
        ({"bf16 autocast copies of the weights": 2 * P} if cfg.bf16 else {})
    out = []
    for name in PH.ppo_order(reference=beta, periodic=evaluation is not None, resume=resume):
        if name == PH.LOAD:
            out.append(Phase(name, _gib(load)))
            continue
        extra: dict[str, int] = {}
        if name == PH.EVALUATE:
            extra.update(gathered if fsdp else {})
            extra.update(_generate(m, evaluation.batch, evaluation.prompt, evaluation.new_tokens))
        elif name == PH.ROLLOUT:
            extra.update(gathered if fsdp else {})
            extra.update(_generate(m, share["rollout_batch_size"], prompt, cfg.max_new_tokens))
        elif name in (PH.OLD_LOGPS, PH.REFERENCE_FORWARD):  # actor, critic and reference in turn per micro-batch
            if fsdp:
                extra["FSDP gathered units"] = M.fsdp_transient(m, n, grad=False)
            extra["forward activations (no gradient)"] = M.forward_activations(m, mb, seq)
            extra["logits (no gradient)"] = M.ppo_logits(m, mb, seq, cfg.max_new_tokens, False)
        elif name == PH.POLICY_PASS:
            if fsdp:
                extra["FSDP gathered units"] = M.fsdp_transient(m, n)
            elif cfg.bf16:
                extra.update(gathered)
            extra["activations"] = M.training_activations(m, mb, seq, cfg.gradient_checkpointing)
            extra["logits and their gradients"] = M.ppo_logits(m, mb, seq, cfg.max_new_tokens, True)
        elif name == PH.SAVE:
            extra["one tensor staged for writing (float32)"] = 4 * m.largest_tensor
        else:
            raise ValueError(f"PPO phase {name!r} (esrepro.rl.phases) is not counted by esrepro.planning.rl_memory")
        out.append(Phase(name, _gib({**held, **extra})))
    return _first_of_each(out)
