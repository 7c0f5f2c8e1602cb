"""How the paper's training jobs are launched: PPO and GRPO as one torchrun process per GPU with the per-step batch
shared evenly, ES and ESSA under their Ray layouts, and no GPU for the steps that only read logs or checkpoints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from esrepro.config import load_yaml
from esrepro.planning.cluster import rl_job, torchrun
from esrepro.planning.load import load_pipeline
from esrepro.rl.budget import samples_per_step
from esrepro.rl.grpo_parallel import process_batch
from esrepro.rl.shares import per_process
from esrepro.runtime.distributed import split_batch, world
from esrepro.settings.registry import Resources


@pytest.fixture(scope="module")
def paper():
    return load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)


@pytest.fixture(scope="module")
def dry_run() -> str:
    """``snakemake -n -p`` of the paper configuration: every job's rule, resources and shell command."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--configfile", "config/paper.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _jobs(text: str) -> list[dict]:
    """The dry run's jobs: rule, wildcards, resources and shell command of each."""
    jobs, job = [], None
    for line in text.splitlines():
        if m := re.match(r"rule (\w+):", line):
            job = {"rule": m.group(1), "text": ""}
            jobs.append(job)
        elif job is not None:
            job["text"] += line + "\n"
    for job in jobs:
        res = re.search(r"resources: (.*)", job["text"])
        job["resources"] = dict(re.findall(r"(\w+)=([^,\s]+)", res.group(1))) if res else {}
        shell = re.search(r"Shell command: (.*)", job["text"])
        job["shell"] = shell.group(1) if shell else ""
    return jobs


def test_torchrun_prefix():
    assert torchrun(Resources()) == ""
    assert torchrun(Resources(gpu=1)) == ""
    assert torchrun(Resources(gpu=8)) == "torchrun --standalone --nnodes 1 --nproc-per-node 8 --no-python "
    assert torchrun(Resources(processes=2)).startswith("torchrun --standalone --nnodes 1 --nproc-per-node 2 ")
    two = torchrun(Resources(gpu=4, nodes=2))
    assert two.startswith("srun --nodes 2 --ntasks-per-node 1 ") and "--nnodes 2 --nproc-per-node 4" in two
    assert "--rdzv-backend c10d" in two and "$SLURM_JOB_NODELIST" in two


def test_a_multi_node_job_meets_on_a_port_of_its_own():
    """Two multi-node jobs whose first node is the same meet at different rendezvous ports: the port the command
    computes from $SLURM_JOB_ID (evaluated by bash, as the job's shell does), in 20000-29999."""
    command = torchrun(Resources(gpu=4, nodes=2))
    host, port_expression = re.search(r'--rdzv-endpoint (".*\)"):(.+) $', command).groups()
    assert host == '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"'
    ports = {}
    for job_id in (4242, 4243, 99_999):
        out = subprocess.run(["bash", "-c", f"echo {port_expression}"], env={"SLURM_JOB_ID": str(job_id)},
                             capture_output=True, text=True, check=True).stdout.strip()
        ports[job_id] = int(out)
    assert ports == {4242: 24242, 4243: 24243, 99_999: 29999}  # before: 29500 for every job

    from esrepro.planning.cluster import rdzv_port

    assert ports == {j: rdzv_port(j) for j in ports}


def test_an_rl_job_takes_as_many_processes_as_share_its_batch(paper):
    grpo = {"algorithm": "grpo", "per_device_train_batch_size": 60, "gradient_accumulation_steps": 1}
    res = rl_job(paper, "qwen2.5-7b-instruct", grpo)
    assert (res.processes, res.gpu, res.threads()) == (6, 6, 48)  # 60 completions: 6 x 10, not 8 x 7.5
    assert rl_job(paper, "qwen2.5-7b-instruct", {**grpo, "per_device_train_batch_size": 32,
                                                 "gradient_accumulation_steps": 8}).gpu == 8
    assert rl_job(paper, "qwen2.5-0.5b-instruct", {"algorithm": "ppo", "prompts_per_step": 256}).gpu == 4


def test_an_rl_job_takes_only_process_counts_its_training_accepts(paper):
    """15 prompts' completions x 4 accumulation steps = 60 a step: 6 divides 60 but neither 15 nor 4, so GRPO's
    process_batch refuses 6 processes; the job runs as 5 (3 x 4 each), the largest count it accepts."""
    grpo = {"algorithm": "grpo", "per_device_train_batch_size": 15, "gradient_accumulation_steps": 4}
    res = rl_job(paper, "qwen2.5-7b-instruct", grpo)
    assert (res.processes, res.gpu) == (5, 5)
    assert process_batch(grpo, res.processes) == {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 4}
    # PPO: 96 prompts split over 8, but its mini-batch of 24 over 8 leaves 3 responses, not a whole micro-batch of 2
    ppo = {"algorithm": "ppo", "prompts_per_step": 96, "mini_batch_size": 24, "micro_batch_size": 2}
    assert rl_job(paper, "qwen2.5-7b-instruct", ppo).processes == 6
    assert per_process(ppo, 6)["mini_batch_per_process"] == 4


def test_split_batch_and_world(monkeypatch):
    assert split_batch(256, 8, "prompts_per_step") == 32
    with pytest.raises(ValueError, match="prompts_per_step: 60 .* 8 training processes"):
        split_batch(60, 8, "prompts_per_step")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = world()
    assert (w.rank, w.world_size, w.is_main, w.device("cuda"), w.device("cpu")) == (1, 2, False, "cuda:1", "cpu")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2"):
        world()


BARRIER_JOB = """
import os, sys, time
from pathlib import Path
from esrepro.runtime.distributed import barrier, init_process_group, world
flag = Path(sys.argv[1])
try:
    barrier()
except RuntimeError as e:
    print("refused:", e, flush=True)
else:
    raise SystemExit("a barrier before the process group was not refused")
init_process_group("cpu", 60)
if world().is_main:
    time.sleep(1.0)
    flag.write_text("written")
barrier()
assert flag.read_text() == "written", "the barrier let a process pass before the main process had written"
"""


@pytest.mark.slow
def test_a_barrier_waits_for_every_process_and_is_refused_before_their_group(tmp_path):
    """torchrun, 2 gloo processes: a barrier before the group would return at once, so it is refused; after it, the
    other process waits until the main process has written."""
    job = tmp_path / "job.py"
    job.write_text(BARRIER_JOB)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nnodes", "1",
                           "--nproc-per-node", "2", str(job), str(tmp_path / "flag")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("refused: barrier in a world of 2 processes") == 2


def test_a_one_process_barrier_has_nothing_to_wait_for():
    from esrepro.runtime.distributed import barrier

    barrier()


@pytest.mark.slow
def test_paper_jobs_are_launched_as_their_gpus_ask(dry_run, paper):
    """Every PPO and GRPO job of the paper's plan runs one torchrun process per GPU it asks for, and the processes
    share its per-step batch evenly; the CPU-only steps ask for no GPU."""
    jobs = _jobs(dry_run)
    rl = [j for j in jobs if j["rule"] in ("train_cell", "essa_grpo")
          or (j["rule"] == "train" and re.search(r'"algorithm": "(ppo|grpo|dr_grpo|verl_grpo|verl_dr_grpo)"',
                                                 j["shell"]))]
    assert len(rl) >= 220  # 140 Countdown cells (v2 Table 4 and GRPO-v / Dr.GRPO-v), ESSA's baseline, the studies' GRPO
    for job in rl:
        m = re.match(r"torchrun --standalone --nnodes 1 --nproc-per-node (\d+) --no-python esrepro (train|essa-grpo) ",
                     job["shell"])
        assert m, job["shell"][:200]
        assert int(m.group(1)) == int(job["resources"]["gpu"]) > 1, job["shell"][:200]
        spec = re.search(r"--spec '(\{.*?\})'", job["shell"]).group(1)
        import json

        settings = json.loads(spec)
        assert samples_per_step(settings) % int(m.group(1)) == 0
        per_process(settings, int(m.group(1)))  # what the job's training processes compute when they start
    cpu_only = [j for j in jobs if j["rule"] in ("select_rl", "param_shift_histogram")]
    assert cpu_only and all(int(j["resources"].get("gpu", 0)) == 0 for j in cpu_only)
    assert all("gpu_model" not in j["resources"] for j in cpu_only)


def test_paper_steps_ask_for_their_estimated_runtimes(dry_run, paper):
    """Evaluation, KL, download, selection and parameter-shift jobs ask for runtimes from their estimates
    (esrepro.planning.job_time.timed_step): at least the 15-minute floor, at most their registry runtime."""
    from esrepro.planning.scaling import STEP_FLOOR_MINUTES, STEP_RULES

    steps = [j for j in _jobs(dry_run) if j["rule"] in STEP_RULES]
    assert {j["rule"] for j in steps} == set(STEP_RULES)
    for job in steps:
        model = re.search(r"--model (\S+)", job["shell"]).group(1)
        ceiling = paper.resources(model, STEP_RULES[job["rule"]]).runtime
        assert STEP_FLOOR_MINUTES <= int(job["resources"]["runtime"]) <= ceiling, (job["rule"], model)
    gpu_steps = [j for j in steps if j["rule"] in ("evaluate", "kl")]
    assert max(int(j["resources"]["runtime"]) for j in gpu_steps) < 120  # far below the registry's 2-12 hours
