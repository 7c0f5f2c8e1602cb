"""The SLURM profile: registry resources in the paper's DAG, and a real single-node cluster.

The cluster (scripts/slurm-local: munged, slurmctld, slurmd, no slurmdbd) runs the
Countdown slice of a reduced tiny default through `--executor slurm --profile
workflow/profiles/slurm`; the training job is requeued after its first checkpoint, as a
preemption would (possible only because the profile submits with --requeue), and the
results must equal a local run's bit for bit.

scripts/ray-slurm (a Ray cluster across a job's nodes, for multi-node ES) is run under
sbatch, under srun and cancelled with scancel on that cluster, and one ES train job with
two Ray engines goes through Snakemake's SLURM executor under it; the dry run of the paper
config checks the 7B/8B models' two-node layout. The cluster has one node, so the workers
that ray-slurm starts on other nodes are not exercised here.

Without SLURM (no sbatch, or not root) these tests skip, except under CI=true, where they
fail: `make test` installs SLURM first (scripts/install-debs slurm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo
from test_workflow_resume import (
    BIN,
    RUN,
    SMALL_ES,
    assert_same_tensors,
    built_cache,
    completed_iterations,
    finish,
    keep_built,
    kill_group,
    load_tensors,
    output_of,
    read_log,
    reuse_built,
    run_snakemake,
    snakemake_env,
    start_snakemake,
    write_small_settings,
)

SLURM_LOCAL = REPO / "scripts" / "slurm-local"
PARTITION = "local"  # scripts/slurm-local's default partition
IN_CI = os.environ.get("CI", "").lower() == "true"
TARGETS = ["results/tables/table1_countdown.csv", "results/figures/countdown_curves.png"]
EVALS = [f"results/eval/countdown/tiny/{method}/seed0/test" for method in ("base", "es")]
# Only what a machine without slurmdbd needs; everything else comes from the profile.
LOCAL_CLUSTER_ARGS = [
    "--slurm-status-command", "squeue",                 # sacct needs slurmdbd
    "--slurm-init-seconds-before-status-checks", "2",   # default 40
    "--slurm-keep-successful-logs",                     # for the failure message below
    "--default-resources", f"slurm_partition='{PARTITION}'",
]


def _no_slurm_reason(need_cluster: bool) -> str | None:
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "snakemake-executor-plugin-slurm is not installed"
    if not need_cluster:
        return None
    if shutil.which("sbatch") is None:
        return "SLURM is not installed (no sbatch on PATH; scripts/install-debs slurm installs it as root)"
    if os.geteuid() != 0:
        return "scripts/slurm-local must run as root to start munged, slurmctld and slurmd"
    return None


def _require_slurm(need_cluster: bool) -> None:
    reason = _no_slurm_reason(need_cluster)
    if reason and IN_CI:
        pytest.fail(f"CI=true, and SLURM cannot be used: {reason}")
    if reason:
        pytest.skip(reason)


def _dry_run_jobs(out: str) -> list[dict]:
    """The jobs of a `snakemake -n` output: rule, wildcards, resources (strings) and shell command."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", out):
        head = re.match(r"(local)?rule (\w+):", block)
        if not head:
            continue
        wildcards = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        resources = re.search(r"^\s+resources: (.*)$", block, re.M)
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        jobs.append({"rule": head.group(2), "local": bool(head.group(1)),
                     "wildcards": dict(kv.split("=", 1) for kv in wildcards.group(1).split(", ")) if wildcards else {},
                     "resources": dict(kv.split("=", 1) for kv in resources.group(1).split(", ")) if resources else {},
                     "shell": shell.group(1) if shell else ""})
    return jobs


@pytest.mark.slow
def test_slurm_profile_dry_run_requests_each_models_registry_resources(tmp_path):
    """`snakemake -n --profile workflow/profiles/slurm` needs no cluster: the registry's
    GPUs, GPU model, CPUs, memory and runtime reach every model's jobs; the 7B/8B models'
    ES jobs span two nodes under scripts/ray-slurm, with their GPUs per node and their Ray
    layout in the shell command."""
    _require_slurm(need_cluster=False)
    from esrepro.planning.cluster import train_resources_key
    from esrepro.planning.job_time import timed_job, timed_step
    from esrepro.planning.load import load_pipeline

    repo = copy_repo(tmp_path)
    env = snakemake_env()
    env.pop("SLURM_CONF", None)
    out = run_snakemake(["-n", "--profile", "workflow/profiles/slurm", "--configfile", "config/paper.yaml"],
                        repo, timeout=300, env=env)

    config = yaml.safe_load((repo / "config/paper.yaml").read_text())
    pipeline = load_pipeline(config, "config/paper.yaml", root=repo)
    registry_rule = {"train": "train", "train_cell": "train", "evaluate": "evaluate", "fetch_model": "fetch"}
    seen: dict[str, set[str]] = {rule: set() for rule in registry_rule}
    layouts: dict[tuple[str, str], str] = {}  # (model, method) -> the Ray layout of its train job
    for job in _dry_run_jobs(out):
        rule = job["rule"]
        if rule not in registry_rule:
            continue
        model, method = job["wildcards"]["model"], job["wildcards"].get("method")
        key = registry_rule[rule]
        if rule == "train":  # an ES run's own layout where the entry has one (train_es_<task>, train_es)
            key = train_resources_key(pipeline, job["wildcards"]["task"], model, method)
        # a train job's resources as the Snakefile asks for them (an ESSA run with more engines than the entry's
        # GPUs takes more of its nodes, an RL run as many GPUs as share its batch: esrepro.planning.cluster.train_job, rl_job),
        # its runtime from its estimate, at most the registry's (esrepro.planning.job_time.timed_job)
        if rule in ("train", "train_cell"):
            res = timed_job(pipeline, job["wildcards"]["task"], model, method, job["wildcards"].get("cell"))
            assert res.runtime <= pipeline.resources(model, key).runtime
        else:  # evaluation and download: their runtime from their estimate too (esrepro.planning.job_time.timed_step)
            res = timed_step(pipeline, rule, job["wildcards"])
            assert res.runtime <= pipeline.resources(model, key).runtime
            assert res.model_copy(update={"runtime": None}) == \
                pipeline.resources(model, key).model_copy(update={"runtime": None})
        expected = res.model_dump(exclude_none=True, exclude={"ray_cluster", "processes"})
        resources = job["resources"]
        if expected["nodes"] > 1:
            # several nodes: GPUs per node (gres), one task per node, the plugin's mpi path
            gpus = f"gpu:{expected.pop('gpu_model')}:{expected.pop('gpu')}"
            expected.update(gres=gpus, tasks=expected["nodes"], tasks_per_gpu=0, mpi="srun")
            assert "gpu" not in resources and "gpu_model" not in resources, (rule, model, resources)
            launcher = re.match(r"(?:ESREPRO_TRAIN_PROCESSES=\d+ )?(\S+/scripts/ray-slurm) --cluster "
                                r"--layout '([^']+)' -- esrepro train ", job["shell"])
            assert launcher, job["shell"][:300]
            assert os.access(launcher.group(1), os.X_OK)
            layouts[job["wildcards"].get("task", ""), model, method] = launcher.group(2)
        else:
            assert "gres" not in resources and "mpi" not in resources and "tasks" not in resources
            # one process (or torchrun's one per GPU for PPO and GRPO; an ESSA job's SFT processes)
            prefix = r"(ESREPRO_TRAIN_PROCESSES=\d+ |torchrun --standalone --nnodes 1 --nproc-per-node \d+ " \
                     r"--no-python )?"
            assert "ray-slurm" not in job["shell"] and re.match(prefix + "esrepro ", job["shell"]), job["shell"][:200]
        for k, value in expected.items():
            assert resources.get(k) == str(value), (rule, model, k, resources)
        assert "slurm_extra" not in resources
        seen[rule].add(model)
    # the ESSA study's models, its scaling runs' (Fig. 6: Llama-3.1-8B on PRM800K) included
    studied = {m for task in pipeline.essa_tasks() for m in pipeline.essa_models(task)}
    evaluated_only = {m for task in pipeline.cfg.train for m in pipeline.eval_models(task)}  # v2 Fig. 2's RL checkpoints
    assert evaluated_only == {"simplerl-zero-7b", "open-reasoner-zero-7b", "oat-zero-7b"}
    trained = {m for task in pipeline.cfg.train for m in pipeline.train_models(task)}  # ARC's Qwen2.5-14B-Instruct too
    assert "qwen2.5-14b-instruct" in trained
    assert seen["train"] == set(config["models"]) | studied | trained, seen["train"]
    for rule in ("evaluate", "fetch_model"):
        assert seen[rule] == set(config["models"]) | studied | trained | evaluated_only, (rule, seen[rule])
    assert pipeline.resources("qwen2.5-7b-instruct", "train").gpu == 8  # the checks above are not vacuous

    # every ES job of the 7B/8B and 14B models, and Sudoku's (v2 App. A.8: 2,500 iterations on 800 puzzles, the 3B
    # entry's train_es_sudoku), and only those, runs on 2 nodes x 4 GPUs as 8 vLLM engines
    big = {"qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "qwen2.5-math-7b", "qwen2.5-14b-instruct"}
    es_jobs = {(task, m, meth) for task in pipeline.cfg.train for m in pipeline.train_models(task)
               if m in big or task == "sudoku"
               for meth in pipeline.train_methods(task) if pipeline.algorithm_of(task, meth).name == "es"}
    es_jobs |= {("conciseness", "qwen2.5-7b-instruct", meth)
                for meth, found in pipeline.study_methods("conciseness").items() if found.algorithm == "es"}
    # Countdown x 2 models, MATH (Qwen2.5-Math-7B: ESCHKPT-1's run and ESCHKPT-2's continuation), the conciseness
    # study's three sigmas, ARC-AGI (Qwen2.5-14B-Instruct) and Sudoku (Qwen2.5-3B-Instruct)
    es_layouts = {k: v for k, v in layouts.items() if not k[2].startswith("essa")}
    assert set(es_layouts) == es_jobs and len(es_jobs) == 2 + 2 + 3 + 1 + 1, sorted(layouts)
    assert set(es_layouts.values()) == {"2 nodes x 4 GPUs: 8 vllm engines, tp 1"}
    # the ESSA runs beyond one node, 8 GPUs per node, one engine each: the GPU sweep (ESSA Fig. 2: up to 128
    # GPUs) and Qwen2.5-32B's 16 GPUs (Figs. 6 and 9)
    essa_layouts = {k[1:]: v for k, v in layouts.items() if k[2].startswith("essa")}
    engines = {(m, meth): pipeline.method_settings(m, task, meth).engines or 8 for task in pipeline.essa_tasks()
               for m in pipeline.essa_models(task) for meth in pipeline.essa_methods(task, m) if meth != "essa_grpo"}
    sweep = {k: n for k, n in engines.items() if n > 8}
    assert ("qwen2.5-math-7b", "essa_eng128") in sweep and sweep[("qwen2.5-32b", "essa_int4")] == 16
    assert set(essa_layouts) == set(sweep), sorted(essa_layouts)
    for key, layout in essa_layouts.items():
        n = sweep[key]
        assert layout.startswith(f"{n // 8} nodes x 8 GPUs: {n} "), (key, layout)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A single-node SLURM cluster for this module (the environment to use it); its daemons
    stop in teardown."""
    _require_slurm(need_cluster=True)
    # under /tmp: munged runs as user munge and must traverse every parent directory
    state = Path(tempfile.mkdtemp(prefix="esrepro-slurm-", dir="/tmp"))
    start = subprocess.run([str(SLURM_LOCAL), "start", str(state)], capture_output=True, text=True, timeout=300)
    try:
        assert start.returncode == 0, f"scripts/slurm-local start failed:\n{start.stdout}\n{start.stderr}"
        # STATE/bin: sbatch, srun, ... wrappers that find this cluster even where SLURM_CONF
        # is dropped (the slurm-jobstep plugin drops it for the srun inside each job)
        env = snakemake_env(SLURM_CONF=str(state / "slurm.conf"))
        env["PATH"] = os.pathsep.join([str(BIN), str(state / "bin"), os.environ.get("PATH", "")])
        yield env
    finally:
        stop = subprocess.run([str(SLURM_LOCAL), "stop", str(state), "--purge"], capture_output=True,
                              text=True, timeout=300)
        assert stop.returncode == 0, f"scripts/slurm-local stop failed:\n{stop.stdout}\n{stop.stderr}"


def _slurm(args: list[str], env: dict) -> str:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=True).stdout


def _requeue_training_after_first_checkpoint(run: Path, proc, env: dict) -> tuple[str, int, list[dict]]:
    """Requeue the training job (as a preemption does) once its first checkpoint is written.

    Returns its SLURM job id, the checkpointed iterations and the log rows written so far.
    """
    deadline = time.monotonic() + 480
    while completed_iterations(run) < 1:
        assert proc.poll() is None, f"snakemake ended before training checkpointed:\n{output_of(proc)[-6000:]}"
        assert time.monotonic() < deadline, "no training checkpoint within 480 s"
        time.sleep(0.2)
    jobs = _slurm(["squeue", "-h", "-t", "R", "-o", "%i %k"], env).split("\n")
    (job_id,) = [line.split()[0] for line in jobs if line.endswith("rule_train_wildcards_countdown_tiny_es_0")]
    # scripts/slurm-local sets JobRequeue=0: only a job submitted with --requeue (the
    # profile's slurm-requeue) may be requeued
    requeue = subprocess.run(["scontrol", "requeue", job_id], env=env, capture_output=True, text=True, timeout=60)
    assert requeue.returncode == 0, f"SLURM refused to requeue the training job: {requeue.stderr}"
    done = completed_iterations(run)
    before = read_log(run / "resume/log.jsonl")[:done]
    assert done < SMALL_ES["iterations"], "training finished before the requeue"
    # Once its processes are gone the job is PENDING again, held back for two minutes
    # (BeginTime): release it, and wait until it runs again.
    deadline, pending = time.monotonic() + 240, False
    while True:
        state = _slurm(["squeue", "-h", "-j", job_id, "-o", "%T"], env).strip()
        if state == "PENDING":
            pending = True
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], env=env,
                           capture_output=True, timeout=60)
        elif pending:
            break
        assert time.monotonic() < deadline, f"requeued job {job_id} did not start again (state {state})"
        time.sleep(0.5)
    return job_id, done, before


@pytest.mark.slow
def test_slurm_countdown_slice_runs_through_sbatch_and_matches_a_local_run(slurm_cluster, tmp_path,
                                                                         tmp_path_factory):
    env = slurm_cluster
    slurm_repo = copy_repo(tmp_path / "slurm")
    config = write_small_settings(slurm_repo)
    run = slurm_repo / RUN

    proc = start_snakemake(["--profile", "workflow/profiles/slurm", "--configfile", config,
                            *LOCAL_CLUSTER_ARGS, "--", *TARGETS], slurm_repo, env)
    try:
        train_job, done, before = _requeue_training_after_first_checkpoint(run, proc, env)
    except BaseException:
        kill_group(proc)
        subprocess.run(["scancel", "--partition", PARTITION], env=env, timeout=60)
        raise
    try:
        out = finish(proc, timeout=540)
    finally:
        subprocess.run(["scancel", "--partition", PARTITION], env=env, timeout=60)
    submitted = set(re.findall(r"has been submitted with SLURM jobid (\d+)", out))
    assert len(submitted) == 7, out[-6000:]  # data, build, train, 2 evaluations, table, figure

    # every job ran under SLURM: its manifest records the SLURM job it ran in
    manifests = [run / "manifest.json", *(slurm_repo / e / "manifest.json" for e in EVALS)]
    job_ids = [json.loads(p.read_text())["host"]["slurm_job_id"] for p in manifests]
    assert set(job_ids) <= submitted and len(set(job_ids)) == 3, job_ids
    assert job_ids[0] == train_job
    # the training job was requeued once and its second start resumed from the checkpoint
    assert "Restarts=1" in _slurm(["scontrol", "show", "job", train_job], env)
    slurm_log = read_log(run / "log.jsonl")
    assert slurm_log[:done] == before  # timings included: those iterations did not run again

    keep_built(slurm_repo, built_cache(tmp_path_factory))  # for tests/test_workflow_resume.py

    # the same settings without SLURM, from the same base model and data
    local_repo = copy_repo(tmp_path / "local")
    write_small_settings(local_repo)
    for built in ("data/prepared/countdown", "results/models/tiny/base"):
        shutil.copytree(slurm_repo / built, local_repo / built)  # copy2: mtimes kept
    local_env = {k: v for k, v in snakemake_env().items() if not k.startswith("SLURM_")}
    out = run_snakemake(["--profile", "workflow/profiles/default", "--configfile", config, "--", *TARGETS],
                        local_repo, timeout=600, env=local_env)
    assert "build_tiny" not in out and "prepare_data" not in out  # reused, not rebuilt

    assert_same_tensors(load_tensors(run / "checkpoint"), load_tensors(local_repo / RUN / "checkpoint"))
    local_log = read_log(local_repo / RUN / "log.jsonl")
    for a, b in zip(slurm_log, local_log, strict=True):
        assert (a["iteration"], a["seeds"], a["rewards"]) == (b["iteration"], b["seeds"], b["rewards"])
    for e in EVALS:
        ours, theirs = (json.loads((r / e / "metrics.json").read_text()) for r in (slurm_repo, local_repo))
        assert ours == theirs and {"accuracy", "mean_reward"} <= set(ours)
        assert (slurm_repo / e / "responses.jsonl").read_bytes() == (local_repo / e / "responses.jsonl").read_bytes()
    assert json.loads((local_repo / RUN / "manifest.json").read_text())["host"]["slurm_job_id"] is None


# --- scripts/ray-slurm: a Ray cluster across a job's nodes ---------------------------------------

RAY_SLURM = REPO / "scripts" / "ray-slurm"
# A job's command that joins the cluster ray-slurm started as esrepro.population.ray_session
# does (ray.init(address="auto") with RAY_ADDRESS set), prints what it sees as one JSON line,
# sleeps argv[2] seconds and exits with argv[1].
RAY_PROBE = """
import json, os, sys, time
import ray
ray.init(address="auto", log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"]]
print("PROBE " + json.dumps({"address": os.environ["RAY_ADDRESS"], "nodes": len(nodes),
                             "resources": ray.cluster_resources(), "slurm_cpus": os.environ["SLURM_CPUS_ON_NODE"]}),
      flush=True)
ray.shutdown()
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
sys.exit(int(sys.argv[1]))
"""


def _probe(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("PROBE ")]
    assert len(lines) == 1, output[-4000:]
    return json.loads(lines[0][len("PROBE "):])


def _ray_processes(address: str) -> list[str]:
    """Command lines of live processes of the Ray cluster at ``address`` (ip:port)."""
    port = address.rsplit(":", 1)[1]
    marks = (address, f"--gcs_server_port={port}", f"--port={port}")
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in cmdline for m in marks):
                found.append(cmdline)
    return found


def _assert_ray_stopped(address: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while (left := _ray_processes(address)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"Ray processes of {address} outlived the job: {left}"
    # nor does the cluster linger where a later ray.init() on the node would look for one to join
    current = Path("/tmp/ray/ray_current_cluster")
    assert not (current.exists() and address in current.read_text()), f"{current} still names {address}"


def _wait_for_job(job: str, env: dict, timeout: float = 300) -> tuple[str, str]:
    """Wait until a SLURM job has ended; its state and exit code (status:signal)."""
    deadline = time.monotonic() + timeout
    while True:
        show = _slurm(["scontrol", "show", "job", job], env)
        state = re.search(r"JobState=(\w+)", show).group(1)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state, re.search(r"\bExitCode=(\S+)", show).group(1)
        assert time.monotonic() < deadline, f"job {job} still {state} after {timeout:.0f} s"
        time.sleep(0.5)


def test_ray_slurm_outside_slurm_just_runs_the_command(tmp_path):
    env = {k: v for k, v in snakemake_env().items() if not k.startswith(("SLURM_", "RAY_"))}
    run = subprocess.run([str(RAY_SLURM), "--cluster", "--", "sh", "-c", 'test -z "$RAY_ADDRESS" && exit 4'],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 4, run.stderr
    assert "Ray cluster" not in run.stderr


@pytest.mark.slow
def test_ray_slurm_starts_ray_across_the_allocation_and_stops_it(slurm_cluster, tmp_path):
    """Under sbatch, and under srun (as Snakemake's job step runs a job), ray-slurm starts a
    Ray cluster with the job's CPUs, the command joins it with ray.init(address="auto"),
    its exit status comes back, and no Ray process outlives the job."""
    env = slurm_cluster
    probe = tmp_path / "probe.py"
    probe.write_text(RAY_PROBE)
    alloc = ["--cpus-per-task=2", "--mem=2000", f"--partition={PARTITION}"]

    log = tmp_path / "batch.out"
    job = _slurm(["sbatch", "--parsable", *alloc, f"--output={log}", "--wrap",
                  f"{RAY_SLURM} --cluster --layout 'one node' -- {sys.executable} {probe} 3"], env).strip()
    state, exit_code = _wait_for_job(job, env)
    out = log.read_text()
    assert (state, exit_code) == ("FAILED", "3:0"), out[-4000:]  # the command's exit status is the job's
    seen = _probe(out)
    assert seen["nodes"] == 1 and seen["resources"]["CPU"] == 2 == int(seen["slurm_cpus"]), seen
    assert seen["resources"].get("GPU", 0) == 0
    assert "(one node): head" in out and "ray-slurm: Ray cluster stopped" in out
    _assert_ray_stopped(seen["address"])
    assert f"ray-slurm: Ray's logs on this node: /tmp/ray-slurm-{job}" in out  # kept: the command failed
    shutil.rmtree(f"/tmp/ray-slurm-{job}")

    step = subprocess.run(["srun", *alloc, str(RAY_SLURM), "--cluster", "--", sys.executable, str(probe), "0"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert step.returncode == 0, step.stderr[-4000:]
    seen = _probe(step.stdout)
    assert seen["nodes"] == 1 and seen["resources"]["CPU"] == 2, seen
    _assert_ray_stopped(seen["address"])

    # one node and no --cluster: the command runs as it is (its evaluator starts a local Ray)
    plain = subprocess.run(["srun", *alloc, str(RAY_SLURM), "--", "sh", "-c", 'test -z "$RAY_ADDRESS" && exit 5'],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 5 and "Ray cluster" not in plain.stderr, plain.stderr


@pytest.mark.slow
def test_ray_slurm_stops_ray_when_the_job_is_cancelled(slurm_cluster, tmp_path):
    env = slurm_cluster
    probe = tmp_path / "probe.py"
    probe.write_text(RAY_PROBE)
    log = tmp_path / "job.out"
    job = _slurm(["sbatch", "--parsable", "--cpus-per-task=2", "--mem=2000", f"--partition={PARTITION}",
                  f"--output={log}", "--wrap", f"{RAY_SLURM} --cluster -- {sys.executable} {probe} 0 600"], env).strip()
    try:
        deadline = time.monotonic() + 240
        while "PROBE " not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, f"the job's command did not start:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
        address = _probe(log.read_text())["address"]
        assert _ray_processes(address)
    finally:
        _slurm(["scancel", job], env)
    _assert_ray_stopped(address)
    deadline = time.monotonic() + 60
    while _slurm(["squeue", "-h", "-j", job, "-t", "R,CG", "-o", "%T"], env).strip():
        assert time.monotonic() < deadline, f"job {job} did not end after scancel"
        time.sleep(0.5)
    assert "ray-slurm: SIGTERM: stopping the command and the Ray cluster" in log.read_text()
    shutil.rmtree(f"/tmp/ray-slurm-{job}", ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_engines_default_to_one_per_gpu_of_the_ray_cluster_a_job_joins(tmp_path):
    """engines: null on CUDA counts the GPUs of the whole cluster RAY_ADDRESS names (every node
    of a multi-node job), per tensor_parallel_size; here a Ray head that declares 8 GPUs, started
    as scripts/ray-slurm starts a job's head (its --node mode, on this machine's address)."""
    # the head declares its 8 GPUs itself: Ray refuses more GPUs than CUDA_VISIBLE_DEVICES lists
    env = {k: v for k, v in snakemake_env().items()
           if not k.startswith(("SLURM_", "RAY_")) and k != "CUDA_VISIBLE_DEVICES"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.urandom(32).hex())
    ip = subprocess.run([sys.executable, "-c", "import ray._private.services as s; print(s.get_node_ip_address())"],
                        env=env, capture_output=True, text=True, check=True).stdout.strip()
    address = f"{ip}:{_free_port()}"
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # not /tmp/ray (see scripts/ray-slurm); short
    log = tmp_path / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen([str(RAY_SLURM), "--node", "head", address], cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**env, "RAY": str(BIN / "ray"), "RAY_SLURM_TEMP_DIR": temp_dir,
                                     "SLURM_CPUS_PER_TASK": "1", "SLURM_GPUS_ON_NODE": "8",
                                     "SLURM_MEM_PER_NODE": "2000"})
    try:
        code = ("from esrepro.population.placement import engine_count; "
                "print(engine_count(None, 'cuda', 1), engine_count(None, 'cuda', 2), engine_count(3, 'cuda', 1))")
        deadline = time.monotonic() + 300  # a loaded machine starts the head slowly
        while True:  # until the head answers
            probe = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                                   env={**env, "RAY_ADDRESS": address}, timeout=150)
            if probe.returncode == 0 or time.monotonic() > deadline or head.poll() is not None:
                break
            time.sleep(1)
        assert probe.returncode == 0, (f"head exit status {head.poll()}; the probe:\n{probe.stderr[-3000:]}\n"
                                       f"the head:\n{log.read_text()[-3000:]}")
        assert probe.stdout.split() == ["8", "4", "3"]
    finally:
        head.terminate()
        head.wait(timeout=60)
    _assert_ray_stopped(address)
    shutil.rmtree(temp_dir, ignore_errors=True)


ES_ENGINES = 2


def _es_on_a_ray_cluster(repo: Path, config: str) -> None:
    """The small settings with ES_ENGINES CPU engines, and the tiny model's ES jobs under
    scripts/ray-slurm (ray_cluster) with one CPU per engine."""
    settings = yaml.safe_load((repo / config).read_text())
    settings["defaults"]["es"]["engines"] = ES_ENGINES
    (repo / config).write_text(yaml.safe_dump(settings, sort_keys=False))
    registry = yaml.safe_load((repo / settings["registry"]).read_text())
    registry["models"]["tiny"]["resources"]["train_es"] = {"cpus_per_task": ES_ENGINES, "ray_cluster": True}
    (repo / settings["registry"]).write_text(yaml.safe_dump(registry, sort_keys=False))


@pytest.mark.slow
def test_slurm_es_job_with_two_ray_engines_runs_through_sbatch(slurm_cluster, tmp_path, tmp_path_factory):
    """One ES train job, submitted with sbatch by Snakemake's SLURM executor, runs its two
    engines as Ray actors on the cluster scripts/ray-slurm starts in the job; the run equals
    a serial in-process run of the same settings bit for bit."""
    env = slurm_cluster
    repo = copy_repo(tmp_path / "repo")
    config = write_small_settings(repo)
    _es_on_a_ray_cluster(repo, config)
    cache = built_cache(tmp_path_factory)
    reuse_built(cache, repo)  # the data and base model an earlier test built, if any
    run = repo / RUN
    out = run_snakemake(["--profile", "workflow/profiles/slurm", "--configfile", config, *LOCAL_CLUSTER_ARGS,
                         "--", f"{RUN}/manifest.json"], repo, timeout=900, env=env)
    keep_built(repo, cache)
    submitted = set(re.findall(r"has been submitted with SLURM jobid (\d+)", out))

    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["host"]["slurm_job_id"] in submitted
    assert manifest["engines"] == ES_ENGINES
    log = read_log(run / "log.jsonl")
    assert [r["iteration"] for r in log] == list(range(SMALL_ES["iterations"]))
    assert all(r["engines"] == ES_ENGINES and r["checksum"] for r in log)
    rule_log = (repo / "results/logs/train/countdown/tiny/es/seed0.log").read_text()
    assert "ray-slurm: Ray cluster on 1 node(s) (1 node x 2 CPUs: 2 hf engines)" in rule_log, rule_log[-3000:]
    assert re.search(r"ray-slurm: node \S+ \(\S+\): 2 CPUs, 0 GPUs", rule_log)
    assert "ray-slurm: Ray cluster stopped" in rule_log

    # the same run in-process with one engine (one thread, as each Ray engine had one CPU)
    spec = {k: v for k, v in manifest["settings"].items() if k not in ("method", "task", "model", "dtype", "chat")}
    serial = tmp_path / "serial"
    local_env = {k: v for k, v in snakemake_env().items() if not k.startswith(("SLURM_", "RAY_"))}
    local_env["ESREPRO_NUMERICS"] = manifest["numerics"]["mode"]  # the job's CPU numerics (esrepro.runtime.numerics)
    subprocess.run([str(BIN / "esrepro"), "train", "--method", "es", "--task", "countdown", "--model", "tiny",
                    "--model-dir", str(repo / "results/models/tiny/base"), "--dtype", "float32",
                    "--data-dir", str(repo / "data/prepared/countdown"), "--spec", json.dumps({**spec, "engines": 1}),
                    "--seed", "0", "--out", str(serial), "--threads", "1", "--device", "cpu"],
                   env=local_env, check=True, capture_output=True, text=True, timeout=600)
    serial_log = read_log(serial / "log.jsonl")
    assert [(r["seeds"], r["rewards"], r["checksum"]) for r in log] == \
        [(r["seeds"], r["rewards"], r["checksum"]) for r in serial_log]
    assert any(r["reward_std"] > 0 for r in log)  # the weights moved: the comparison is not vacuous
    assert_same_tensors(load_tensors(run / "checkpoint"), load_tensors(serial / "checkpoint"))
