"""PPO at the paper's scale, checked on CPU: float32 master weights take updates bf16 weights round away;
per-process shares; a killed run resumes bit for bit; two processes (DDP, FSDP2) score the one-process budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import kill_once_resumable
from esrepro.rl.ppo import load_master
from esrepro.rl.ppo_parallel import shares
from esrepro.runtime import numerics
from esrepro.settings.methods import PPOSettings

JOB = Path(__file__).with_name("ppo_job.py")
REPO = Path(__file__).resolve().parents[1]
BASE = dict(algorithm="ppo", actor_learning_rate=1e-3, critic_learning_rate=1e-3, beta=0.01, prompts_per_step=4,
            mini_batch_size=2, micro_batch_size=1, max_new_tokens=8, weight_decay=0.0, train_examples=4)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "OMP_NUM_THREADS": "1"}


def _step(model: torch.nn.Module) -> None:
    ids = torch.tensor([[5, 17, 42, 9, 3, 11]])
    model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    numerics.adamw(model.parameters(), lr=1e-6, weight_decay=0.0).step()


def test_float32_master_weights_take_an_update_that_bf16_weights_round_away(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    master = load_master(tiny_model_dir, "cpu")
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    before_m = {k: v.detach().clone() for k, v in master.named_parameters()}
    before_b = {k: v.detach().clone() for k, v in bf16.named_parameters()}
    _step(master)
    _step(bf16)
    moved_m = moved_b = considered = 0
    for k, p in master.named_parameters():
        big = (before_m[k].abs() >= 0.01) & (before_m[k].abs() <= 1) & (p.grad != 0)
        considered += int(big.sum())
        moved_m += int((p.detach() != before_m[k])[big].sum())
        moved_b += int((dict(bf16.named_parameters())[k].detach() != before_b[k])[big].sum())
    assert master.dtype == torch.float32 and considered > 1000
    assert moved_m == considered  # every float32 master weight moved by ~1e-6
    assert moved_b == 0  # every bf16 weight rounded back to where it was


def test_shares_split_the_totals_and_name_the_field():
    cfg = PPOSettings(prompts_per_step=256, mini_batch_size=128, micro_batch_size=8)
    s = shares(cfg, 8)
    assert (s.prompts_per_process, s.mini_batch_per_process, s.rollout_batch_size, s.generate_calls) == (32, 16, 32, 1)
    assert shares(PPOSettings(prompts_per_step=256, mini_batch_size=128, rollout_batch_size=24), 4).generate_calls == 3
    with pytest.raises(ValueError, match="prompts_per_step"):
        shares(PPOSettings(prompts_per_step=12, mini_batch_size=4, micro_batch_size=4), 8)
    with pytest.raises(ValueError, match="micro_batch_size"):
        shares(PPOSettings(prompts_per_step=256, mini_batch_size=128, micro_batch_size=32), 8)


def _job(model_dir: Path, out: Path, settings: dict, steps: int, resume: Path | None = None) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    return [sys.executable, str(JOB), str(model_dir), str(out), json.dumps(settings), str(steps),
            *([str(resume)] if resume else [])]


def _result(out: Path) -> tuple[list[dict], dict, list[int]]:
    ranks = sorted(out.glob("rank*.json"))
    records = [json.loads(p.read_text()) for p in ranks]
    return records[0]["rows"], torch.load(out / "weights.pt"), [r["scored"] for r in records]


@pytest.mark.slow
def test_a_killed_run_resumes_bit_for_bit(tiny_model_dir, tmp_path):
    settings = {**BASE, "resume_every": 1, "max_new_tokens": 24}
    whole = tmp_path / "whole"
    subprocess.run(_job(tiny_model_dir, whole, settings, 4), env=_env(), check=True, timeout=300)
    run = tmp_path / "run"
    cmd = _job(tiny_model_dir, run, settings, 4, run / "resume")
    done = kill_once_resumable(cmd, _env(), run, "completed_steps", at_least=2)
    assert 2 <= done < 4
    rerun = subprocess.run(cmd, env=_env(), check=True, timeout=300, capture_output=True, text=True)
    assert f"PPO: resuming from the state in {run / 'resume'}: {done} of 4 steps done" in rerun.stdout
    rows, weights, scored = _result(run)
    rows_w, weights_w, scored_w = _result(whole)
    assert rows == rows_w and [r["step"] for r in rows] == [0, 1, 2, 3]
    assert weights.keys() == weights_w.keys() and all(torch.equal(weights[k], weights_w[k]) for k in weights)
    assert scored_w == [4 * 4] and scored == [(4 - done) * 4]  # the rerun scores only the steps left
    with pytest.raises(subprocess.CalledProcessError):  # other settings: the state is refused
        subprocess.run(_job(tiny_model_dir, run, {**settings, "clip_ratio": 0.3}, 4, run / "resume"), env=_env(),
                       check=True, timeout=300, capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_processes_score_the_one_process_budget(tiny_model_dir, tmp_path, sharding):
    settings = {**BASE, "sharding": sharding}
    out = tmp_path / sharding
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = _job(tiny_model_dir, out, settings, 2, out / "resume")
    subprocess.run([str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", *cmd[1:]],
                   env=_env(), check=True, timeout=300)
    rows, weights, scored = _result(out)
    assert [r["step"] for r in rows] == [0, 1] and scored == [4, 4]  # 2 steps x 4 prompts, as one process
    assert json.loads((out / "resume" / "state.json").read_text())["completed_steps"] == 2
    from safetensors.torch import load_file

    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert all(weights[k].dtype == base[k].dtype for k in base)
    assert any(not torch.equal(weights[k], base[k]) for k in base)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_processes_resume_bit_for_bit_from_shards_each_wrote(tiny_model_dir, tmp_path, sharding):
    """At world size 2 the resume state is torch.distributed.checkpoint shards, each process writing its own
    (FSDP2: its half of the masters and AdamW moments), and a run continued from it ends where an uninterrupted one
    does."""
    settings = {**BASE, "sharding": sharding, "resume_every": 1}
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nnodes", "1",
                "--nproc-per-node", "2"]

    def run(out: Path, steps: int, resume: Path | None) -> None:
        subprocess.run([*torchrun, *_job(tiny_model_dir, out, settings, steps, resume)[1:]], env=_env(), check=True,
                       timeout=300)

    run(tmp_path / "whole", 3, None)
    state = tmp_path / "run" / "resume"
    run(tmp_path / "run", 2, state)  # stops after step 2 with its state written
    shards = sorted(p.name for p in (state / "weights").glob("*.distcp"))
    if sharding == "fsdp":
        assert shards == ["__0_0.distcp", "__1_0.distcp"]
        sizes = [(state / "weights" / n).stat().st_size for n in shards]
        assert max(sizes) < 0.75 * sum(sizes)  # each holds about half, not a gathered whole
    assert (state / "weights" / ".metadata").exists() and not list(state.glob("*.pt"))[1:]  # rng.pt only
    run(tmp_path / "run", 3, state)
    rows, weights, _ = _result(tmp_path / "run")
    rows_w, weights_w, _ = _result(tmp_path / "whole")
    assert [r["step"] for r in rows] == [0, 1, 2] and rows == rows_w
    assert weights.keys() == weights_w.keys() and all(torch.equal(weights[k], weights_w[k]) for k in weights)


@pytest.mark.slow
def test_a_sharded_actor_generates_in_step_and_evaluates_on_one_process(tiny_model_dir, tmp_path):
    """Under FSDP2 every forward gathers the shards of all processes: in a rollout, a process whose sequences all
    ended steps on while another's run; in the periodic evaluation, the main process generates alone from the
    gathered weights while the others wait, without stepping in sync with them."""
    torchrun = Path(sys.executable).with_name("torchrun")
    job = Path(__file__).with_name("fsdp_generate_job.py")
    subprocess.run([str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", str(job),
                    str(tiny_model_dir), str(tmp_path)], env=_env(), check=True, timeout=90)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["width"] for r in records] == [1, 12]  # rank 0 ended at its first token and stepped on with rank 1
    assert len(records[0]["evaluated"]) == 2 and "evaluated" not in records[1]


def _torchrun(cmd: list[str], procs: int, load: str) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--standalone", "--nnodes", "1", "--nproc-per-node", str(procs), *cmd[1:]],
                   env={**_env(), "PPO_LOAD": load}, check=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("procs", [2, 4, 8])
def test_a_sharded_load_trains_as_the_whole_load_does(tiny_model_dir, tmp_path, procs):
    """FSDP2 with the models built on the meta device, sharded, and filled from rank 0's one CPU copy (no process holds
    a whole model on its device; the reference sharded too) gives the rows and weights of every process loading whole
    copies first, bit for bit (beta > 0: the reference is used)."""
    per_step = max(4, procs)  # the paper's PPO jobs run 4 (0.5B-3B) or 8 (7B, 8B) processes
    settings = {**BASE, "sharding": "fsdp", "prompts_per_step": per_step, "mini_batch_size": per_step}
    results = {}
    for load in ("whole", "sharded"):
        out = tmp_path / load
        _torchrun(_job(tiny_model_dir, out, settings, 2), procs, load)
        results[load] = _result(out)
    (rows_w, weights_w, scored_w), (rows_s, weights_s, scored_s) = results["whole"], results["sharded"]
    assert rows_s == rows_w and [r["step"] for r in rows_s] == [0, 1] and "kl" in rows_s[0]
    assert weights_s.keys() == weights_w.keys() and all(torch.equal(weights_s[k], weights_w[k]) for k in weights_w)
    assert scored_s == scored_w == [2 * per_step // procs] * procs
