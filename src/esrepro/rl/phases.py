"""The phases of an RL training job, in the order its code runs them: the one order the memory model
(esrepro.planning.plan_check) counts and the phase trace (esrepro.rl.phase_trace) observes in a real run.

A phase begins where the code path that allocates its memory begins and lasts until the next one begins:

- ``load``: the policy read onto the process's device (GRPO: whole in float32 master weights, by TRL or by
  :func:`esrepro.rl.grpo._policy`; PPO under FSDP: built on the meta device and filled shard by shard), the
  reference with it (whole, or on the meta device).
- ``shard reference``: GRPO's reference sharded, by :func:`esrepro.rl.meta_load.shard_reference` as TRL assigns it
  (before the engine) or, loaded whole, by TRL's ``prepare_fsdp`` (after it: trl/trainer/grpo_trainer.py:1186).
- ``start vLLM``: TRL's colocated engine (``VLLMGeneration``, grpo_trainer.py:1107), its share of the GPU taken.
- ``shard policy``: accelerate's ``fsdp2_prepare_model`` when ``Trainer.train`` starts.
- ``periodic evaluation``: greedy evaluation of the policy before training and every ``eval_every`` steps (the
  main process generates; esrepro.rl.grpo, esrepro.rl.ppo).
- ``rollout``: the step's completions (TRL's ``_generate``: the colocated engine after the weight sync, or
  transformers ``generate``; PPO: ``generate`` on the gathered actor).
- ``old log-probabilities``: the policy's forward without gradient over the rollout (TRL 1.16 when the rollout
  serves several optimiser steps or corrects vLLM's sampling; PPO always, with the critic's values).
- ``reference forward``: the reference's forward without gradient over the rollout (``beta > 0``).
- ``policy forward and backward``: the training passes and the optimiser step.
- ``resume-state save``: the resume state written every ``resume_every`` steps.

:func:`enter` lets the code announce a phase that no library function marks (a trace installed by
esrepro.rl.phase_trace records it; without one it does nothing).
"""

from __future__ import annotations

from typing import Callable

LOAD = "load"
SHARD_REFERENCE = "shard reference"
START_VLLM = "start vLLM"
SHARD_POLICY = "shard policy"
EVALUATE = "periodic evaluation"
ROLLOUT = "rollout"
OLD_LOGPS = "old log-probabilities"
REFERENCE_FORWARD = "reference forward"
POLICY_PASS = "policy forward and backward"
SAVE = "resume-state save"

#: The reference's state when a GRPO job builds its trainer: none (beta 0 or a peft policy's adapter copy), built
#: on the meta device and sharded before the engine (esrepro.rl.meta_load), or loaded whole by TRL.
REFERENCE_STATES = ("none", "sharded", "whole")

_listener: Callable[[str], None] | None = None


def enter(name: str) -> None:
    """The code enters phase ``name`` (recorded by an installed trace; nothing otherwise)."""
    if _listener is not None:
        _listener(name)


def listen(listener: Callable[[str], None] | None) -> None:
    """Install (or with None remove) the function :func:`enter` calls: esrepro.rl.phase_trace's."""
    global _listener
    _listener = listener


def trl_old_logps(kw: dict) -> bool:
    """Whether TRL 1.16's GRPOTrainer computes the policy's old log-probabilities over each rollout, from the
    ``GRPOConfig`` arguments ``kw`` (grpo_trainer.py, ``_generate_and_score_completions``: when a rollout is not
    consumed by exactly one optimiser step's accumulation, or when vLLM's sampling is corrected by importance
    sampling, TRL's default)."""
    generate_every = int(kw.get("steps_per_generation") or kw["gradient_accumulation_steps"]) * \
        int(kw.get("num_iterations", 1) or 1)
    corrected = bool(kw.get("use_vllm")) and kw.get("vllm_importance_sampling_correction", True) is not False
    return int(kw["gradient_accumulation_steps"]) % generate_every != 0 or corrected


def grpo_order(*, use_vllm: bool, fsdp: bool, reference: str, old_logps: bool, periodic: bool,
               resume: bool) -> list[str]:
    """The phases of a GRPO job (TRL 1.16's GRPOTrainer as esrepro.rl.grpo builds it), from the start to the end of
    its first rollout's step: ``reference`` one of :data:`REFERENCE_STATES`."""
    if reference not in REFERENCE_STATES:
        raise ValueError(f"reference {reference!r}: one of {REFERENCE_STATES}")
    order = [LOAD]
    if reference == "sharded":
        order.append(SHARD_REFERENCE)
    if use_vllm:
        order.append(START_VLLM)
    if reference == "whole" and fsdp:
        order.append(SHARD_REFERENCE)
    if fsdp:
        order.append(SHARD_POLICY)
    return order + _step(periodic, old_logps, reference != "none", resume)


def ppo_order(*, reference: bool, periodic: bool, resume: bool) -> list[str]:
    """The phases of a PPO job (esrepro.rl.ppo) to the end of its first step (the reference loaded and sharded with
    the actor and critic, in ``load``)."""
    return [LOAD] + _step(periodic, True, reference, resume)


def _step(periodic: bool, old_logps: bool, reference: bool, resume: bool) -> list[str]:
    """Evaluation before training, then one step: rollout, its scoring passes, the training passes, the
    evaluation and the save at its end (callbacks' ``on_step_end`` before the Trainer's checkpoint)."""
    return ([EVALUATE] if periodic else []) + [ROLLOUT] + ([OLD_LOGPS] if old_logps else []) + \
        ([REFERENCE_FORWARD] if reference else []) + [POLICY_PASS] + ([EVALUATE] if periodic else []) + \
        ([SAVE] if resume else [])
