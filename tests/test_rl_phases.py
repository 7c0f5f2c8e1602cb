"""An RL job's phases in the code's order: a real GRPO (TRL's GRPOTrainer) and a real PPO run on CPU enter exactly the
phases esrepro.rl.phases declares, in its order, and the plan check counts those phases in that order for every
paper RL job (the memory model follows the code, not a description of it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from esrepro.models import memory as M
from esrepro.planning import plan_check as pc
from esrepro.rl import phases as PH
from esrepro.rl.grpo import grpo_config_kwargs, reference_state, train_grpo
from esrepro.rl.phase_trace import PhaseTrace
from esrepro.rl.ppo import train_ppo
from esrepro.train.periodic import PeriodicEval
from test_rl_trainers import SHORT, LengthTask  # a reward that varies on an untrained model

REPO = Path(__file__).resolve().parents[1]


#: beta > 0 (a reference), a rollout serving two optimiser steps (TRL computes old log-probabilities), periodic
#: evaluation and resume states every two steps.
GRPO = dict(algorithm="grpo", loss_type="grpo", scale_rewards="group", beta=0.1, num_generations=2,
            learning_rate=1e-3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6,
            per_device_train_batch_size=4, gradient_accumulation_steps=1, updates_per_generation=2, epsilon=0.2,
            num_iterations=1, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            bf16=False, gradient_checkpointing=False, disable_dropout=True, mask_truncated_completions=False,
            importance_sampling_level="token", train_examples=4, resume_every=2)
PPO = dict(algorithm="ppo", actor_learning_rate=1e-3, critic_learning_rate=1e-3, beta=0.05, prompts_per_step=4,
           mini_batch_size=4, micro_batch_size=4, ppo_epochs=1, clip_ratio=0.2, value_clip=0.5, gamma=1.0, lam=1.0,
           entropy_coef=0.001, max_grad_norm=1.0, weight_decay=0.0, max_new_tokens=6, temperature=1.0,
           train_examples=4, resume_every=1)


def _periodic(every: int) -> tuple[PeriodicEval, int]:
    return PeriodicEval(LengthTask(), SHORT[:2], every, 4), 8


def test_grpo_enters_the_declared_phases_in_order(tiny_model_dir, tmp_path):
    kw = grpo_config_kwargs(GRPO, steps=2, seed=0, output_dir=str(tmp_path), on_cpu=True, resume=True)
    assert PH.trl_old_logps(kw)  # a rollout for two optimiser steps: TRL keeps the old log-probabilities
    with PhaseTrace().installed() as trace:  # two rollouts; a resume state after the first (none after the last)
        train_grpo(tiny_model_dir, LengthTask(), SHORT, GRPO, steps=4, seed=0, periodic=_periodic(2),
                   resume_dir=tmp_path / "resume")
    want = PH.grpo_order(use_vllm=False, fsdp=False, reference=reference_state(GRPO, False, False),
                         old_logps=True, periodic=True, resume=True)
    assert want == [PH.LOAD, PH.EVALUATE, PH.ROLLOUT, PH.OLD_LOGPS, PH.REFERENCE_FORWARD, PH.POLICY_PASS,
                    PH.EVALUATE, PH.SAVE]
    assert trace.order == want + want[2:-1]


def test_ppo_enters_the_declared_phases_in_order(tiny_model_dir, tmp_path):
    with PhaseTrace().installed() as trace:
        train_ppo(tiny_model_dir, LengthTask(), SHORT, PPO, steps=1, seed=0, progress=False,
                  periodic=_periodic(1), resume_dir=tmp_path / "resume")
    assert trace.order == PH.ppo_order(reference=True, periodic=True, resume=True)


def test_a_trace_without_evaluation_or_resume_has_neither_phase(tiny_model_dir, tmp_path):
    settings = {**GRPO, "beta": 0.0, "updates_per_generation": 1}
    with PhaseTrace().installed() as trace:
        train_grpo(tiny_model_dir, LengthTask(), SHORT, settings, steps=1, seed=0)
    kw = grpo_config_kwargs(settings, steps=1, seed=0, output_dir=str(tmp_path), on_cpu=True)
    assert trace.order == PH.grpo_order(use_vllm=False, fsdp=False, reference="none",
                                        old_logps=PH.trl_old_logps(kw), periodic=False, resume=False)
    assert trace.order == [PH.LOAD, PH.ROLLOUT, PH.POLICY_PASS]


def test_trl_old_logps_follows_trl():
    assert PH.trl_old_logps({"gradient_accumulation_steps": 2, "steps_per_generation": 8})
    assert not PH.trl_old_logps({"gradient_accumulation_steps": 8, "steps_per_generation": 8})
    assert PH.trl_old_logps({"gradient_accumulation_steps": 8, "steps_per_generation": 8, "use_vllm": True})
    assert not PH.trl_old_logps({"gradient_accumulation_steps": 8, "steps_per_generation": 8, "use_vllm": True,
                                 "vllm_importance_sampling_correction": False})


def test_trl_fused_head_constants_are_trls():
    """The fused LM head's tile sizes the memory model counts are TRL's own."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    assert M.TRL_TOKEN_CHUNK == chunked_logprob.TOKEN_CHUNK_SIZE
    assert M.TRL_VOCAB_CHUNK == utils._CHUNKED_LOGPROB_CHUNK_SIZE


@pytest.fixture(scope="module")
def paper():
    return pc.check_config(str(REPO / "config" / "paper.yaml"))


def test_the_plan_check_counts_each_rl_job_in_the_code_order(paper):
    from esrepro.planning.resume_cost import job_settings
    from esrepro.rl.grpo import grpo_config_kwargs as kwargs_of

    p, checked = paper
    rl = [j for j in checked if j.kind in ("ppo", "grpo", "grpo_zero", "dr_grpo", "verl_grpo", "verl_dr_grpo")]
    assert rl
    for j in rl:
        w = j.wildcards
        s = job_settings(p, w["model"], w["task"], w["method"], w.get("cell")).as_dict()
        names = [ph.name for ph in j.phases]
        if j.kind == "ppo":
            want = PH.ppo_order(reference=s["beta"] > 0, periodic=s.get("eval_every") is not None, resume=True)
        else:
            fsdp = s.get("sharding") == "fsdp"
            adapter = "frozen base (bf16)" in j.phases[0].parts
            kw = kwargs_of(s, steps=1, seed=0, output_dir="x", on_cpu=False, world_size=j.processes,
                           fsdp_layers=["L"] if fsdp else None, prompt_tokens=M.prompt_tokens(w["task"]))
            want = PH.grpo_order(use_vllm=bool(s.get("use_vllm")), fsdp=fsdp,
                                 reference=reference_state(s, fsdp, adapter), old_logps=PH.trl_old_logps(kw),
                                 periodic=s.get("eval_every") is not None, resume=True)
        assert names == list(dict.fromkeys(want)), (j.label, names, want)


def test_the_8b_jobs_count_evaluation_beside_the_engine(paper):
    """Periodic evaluation under FSDP loads a whole bf16 policy on the main process beside the engine's share and
    the training state: counted, and it fits."""
    _, checked = paper
    job = next(j for j in checked if j.wildcards["model"] == "llama-3.1-8b-instruct" and j.kind == "grpo_zero")
    ev = next(ph for ph in job.phases if ph.name == PH.EVALUATE)
    assert ev.parts["policy gathered whole for evaluation (bf16)"] == 2 * M.entry_facts(
        paper[0].model("llama-3.1-8b-instruct")).params
    assert "colocated vLLM (its share)" in ev.parts and M.fits(ev)
    assert 65 * M.GiB < ev.total < 75 * M.GiB
