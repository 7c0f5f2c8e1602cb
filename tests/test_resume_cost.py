"""Resume states at the paper's scale (esrepro.planning.resume_cost): their size, an interval that keeps saving within 3% of a
run, a process-group timeout above the longest save, docs/scaling.md's table of them, and the timeout in effect."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch.multiprocessing as mp

from conftest import REPO
from esrepro.config import load_yaml
from esrepro.planning.load import load_pipeline
from esrepro.planning.resume_cost import (
    MAX_SAVE_SHARE,
    MIN_TIMEOUT_S,
    interval,
    job_settings,
    markdown_table,
    resume_cost,
    rl_runs,
    save_seconds,
    state_bytes,
)
from esrepro.rl.grpo import grpo_config_kwargs


@pytest.fixture(scope="module")
def paper():
    return load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)


def test_docs_table_is_the_codes(paper):
    table = markdown_table([resume_cost(paper, *r) for r in rl_runs(paper)])
    assert table in (REPO / "docs" / "scaling.md").read_text(), \
        "docs/scaling.md's resume-state table is stale: regenerate it from esrepro.planning.resume_cost.markdown_table"


def test_paper_runs_save_within_three_percent_and_wait_longer_than_a_save(paper):
    costs = {(r[1], r[2]): resume_cost(paper, *r) for r in rl_runs(paper)}
    assert len(costs) == 37
    for c in costs.values():
        assert c.save_share <= MAX_SAVE_SHARE + 1e-12 or c.interval == 1, c
        assert c.timeout_s >= max(MIN_TIMEOUT_S, 3 * c.save_seconds)
    ppo8 = costs["llama-3.1-8b-instruct", "ppo"]  # actor and critic, float32 weights and AdamW: 24 bytes a parameter
    params = 8_030_261_248  # Llama-3.1-8B-Instruct, counted from its config
    assert ppo8.state_bytes == 24 * params and ppo8.bytes_per_rank == 24 * params / 8  # sharded: no rank writes it all
    assert ppo8.interval > 50 and ppo8.saves <= 60  # not every 50 steps
    assert costs["qwen2.5-7b-instruct", "grpo8"].state_bytes == 12 * 7_615_616_512  # one copy of the model, not two


def test_interval_follows_the_save_and_step_times():
    assert state_bytes("ppo", 1e9) == 24e9 and state_bytes("grpo", 1e9) == 12e9 and state_bytes("grpo", 1e9, True) == 0
    assert save_seconds(100e9, 1) == pytest.approx(110) and save_seconds(100e9, 2) == pytest.approx(60)
    assert interval(save_s=30, step_s=10, steps=10_000, attempt_s=1e9) == 100  # 30 s every 100 x 10 s: 3%
    assert interval(save_s=30, step_s=10, steps=40, attempt_s=1e9) == 40  # never beyond the run
    assert interval(save_s=30, step_s=10, steps=10_000, attempt_s=2000) == 50  # a quarter of an attempt at most
    # GRPO-v's rollouts of 4 optimiser steps: saves on rollout boundaries, up where the attempt allows, else down
    assert interval(save_s=30, step_s=10, steps=10_000, attempt_s=1e9, multiple=4) == 100
    assert interval(save_s=33, step_s=10, steps=10_000, attempt_s=1e9, multiple=4) == 112  # 110 up to 112
    assert interval(save_s=30, step_s=10, steps=10_000, attempt_s=2000, multiple=4) == 48  # 50 down to 48
    assert interval(save_s=1, step_s=10, steps=10_000, attempt_s=1e9, multiple=4) == 4  # one rollout at least


def test_paper_grpo_runs_resume_on_rollout_boundaries(paper):
    for task, model, method in rl_runs(paper):
        per_rollout = int(paper.method_settings(model, task, method).as_dict().get("updates_per_generation") or 1)
        assert resume_cost(paper, task, model, method).interval % per_rollout == 0, (model, method)


def test_paper_jobs_get_the_derived_interval_and_timeout(paper):
    from esrepro.planning.specs import method_spec

    c = resume_cost(paper, "countdown", "llama-3.1-8b-instruct", "ppo")
    spec = method_spec(paper, "llama-3.1-8b-instruct", "countdown", "ppo")  # what the job is given
    assert (spec["resume_every"], spec["collective_timeout"]) == (c.interval, c.timeout_s)
    # the settings keep auto (their resolution never asks the cost model); the job's settings price it
    assert paper.method_settings("llama-3.1-8b-instruct", "countdown", "grpo8").resume_every == "auto"
    grpo = job_settings(paper, "llama-3.1-8b-instruct", "countdown", "grpo8").as_dict()
    kw = grpo_config_kwargs({**grpo, "use_vllm": False}, steps=10, seed=0, output_dir="/tmp/unused", on_cpu=True,
                            resume=True)
    cost = resume_cost(paper, "countdown", "llama-3.1-8b-instruct", "grpo8")
    assert (kw["save_steps"], kw["ddp_timeout"]) == (cost.interval, cost.timeout_s)
    with pytest.raises(ValueError, match="resume_every: auto is resolved by the plan"):
        grpo_config_kwargs({**grpo, "use_vllm": False, "resume_every": "auto"}, steps=10, seed=0,
                           output_dir="/tmp/unused", on_cpu=True, resume=True)


def _late(rank: int, port: int, out: dict) -> None:
    from esrepro.runtime.distributed import init_process_group

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch.distributed as dist

    init_process_group("cpu", timeout_s=2)
    if rank == 1:
        time.sleep(8)  # rank 0 waits in the barrier longer than the timeout
    t0 = time.perf_counter()
    try:
        dist.barrier()
        out[rank] = ("passed", time.perf_counter() - t0)
    except RuntimeError:
        out[rank] = ("timed out", time.perf_counter() - t0)


@pytest.mark.slow
def test_the_process_group_waits_as_long_as_told():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_late, args=(port, out), nprocs=2, join=True, start_method="spawn")
        result = dict(out)
    assert result[0][0] == "timed out" and result[0][1] < 7  # torch's default would have waited 30 minutes
