"""The SLURM profile: registry resources in the paper's DAG, and a real single-node cluster.

The cluster (scripts/slurm-local: munged, slurmctld, slurmd, no slurmdbd) runs the
Countdown slice of a reduced tiny default through `--executor slurm --profile
workflow/profiles/slurm`; the training job is requeued after its first checkpoint, as a
preemption would (possible only because the profile submits with --requeue), and the
results must equal a local run's bit for bit.

Without SLURM (no sbatch, or not root) these tests skip, except under CI=true, where they
fail: `make test` installs SLURM first (scripts/install-slurm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
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
        return "SLURM is not installed (no sbatch on PATH; scripts/install-slurm installs it as root)"
    if os.geteuid() != 0:
        return "scripts/slurm-local must run as root to start munged, slurmctld and slurmd"
    return None


def _require_slurm(need_cluster: bool) -> None:
    reason = _no_slurm_reason(need_cluster)
    if reason and IN_CI:
        pytest.fail(f"CI=true, and SLURM cannot be used: {reason}")
    if reason:
        pytest.skip(reason)


def test_slurm_profile_dry_run_requests_each_models_registry_resources(tmp_path):
    """`snakemake -n --profile workflow/profiles/slurm` needs no cluster: the registry's
    GPUs, GPU model, CPUs, memory and runtime reach every model's jobs."""
    _require_slurm(need_cluster=False)
    from esrepro.config import load_pipeline

    repo = copy_repo(tmp_path)
    env = snakemake_env()
    env.pop("SLURM_CONF", None)
    out = run_snakemake(["-n", "--profile", "workflow/profiles/slurm", "--configfile", "config/paper.yaml"],
                        repo, timeout=300, env=env)

    config = yaml.safe_load((repo / "config/paper.yaml").read_text())
    pipeline = load_pipeline(config, "config/paper.yaml", root=repo)
    registry_rule = {"train": "train", "evaluate": "evaluate", "fetch_model": "fetch"}
    seen: dict[str, set[str]] = {rule: set() for rule in registry_rule}
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", out):
        head = re.match(r"(?:local)?rule (\w+):", block)
        if not head or head.group(1) not in registry_rule:
            continue
        rule = head.group(1)
        assert not block.startswith("localrule"), f"{rule} would run on the submitting host"
        model = re.search(r"^\s+wildcards: .*\bmodel=([^,\s]+)", block, re.M).group(1)
        resources = dict(kv.split("=", 1) for kv in
                         re.search(r"^\s+resources: (.*)$", block, re.M).group(1).split(", "))
        expected = pipeline.resources(model, registry_rule[rule]).model_dump(exclude_none=True)
        for key, value in expected.items():
            assert resources.get(key) == str(value), (rule, model, key, resources)
        assert "slurm_extra" not in resources and "gres" not in resources
        assert resources.get("nodes") == "1"  # the profile keeps a job's GPUs on one node
        seen[rule].add(model)
    for rule, models in seen.items():
        assert models == set(config["models"]), (rule, models)
    assert pipeline.resources("qwen2.5-7b-instruct", "train").gpu == 8  # the check above is not vacuous


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
