"""``esrepro rehearse``: the paper's DAG at toy size on this machine, through the SLURM profile, then the report.

It builds the local mirror (replicas of the hub models, copies or labelled stand-ins of the data files), serves
it, starts a single-node SLURM cluster (scripts/slurm-local), runs Snakemake with the SLURM profile on
config/rehearsal.yaml, and writes the report. The jobs see the mirror through the download code's own
switches: ``HF_ENDPOINT`` (huggingface_hub) and ``ESREPRO_URL_MIRROR`` (esrepro.data.fetch).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from esrepro import paths as P
from esrepro.config import read_config
from esrepro.pipeline import BASE, Pipeline
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import Plan
from esrepro.rehearsal.mirror_layout import PINS
from esrepro.rehearsal.report import (
    Job,
    dag_jobs,
    local_jobs,
    local_rules,
    outputs_work,
    report_rows,
    slurm_jobs,
    write_report,
)

CONFIG = "config/rehearsal.yaml"
PAPER = "config/paper.yaml"
WORKSPACE = "work/rehearsal"
#: A token the mirror accepts for its gated repositories (the registry's gated entries), as the hub accepts a
#: user's.
TOKEN = "hf_rehearsal"
#: What a machine without slurmdbd needs beside the profile (as tests/test_slurm.py runs it).
LOCAL_CLUSTER_ARGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
                      "--default-resources", "slurm_partition='local'"]
#: A rehearsal shows each defect once: no resubmission of a failed job (the profile's retries: 2).
NO_RETRIES = ["--retries", "0"]
#: The slice CI runs, at its core: one Qwen2 and one Llama replica, ES on vLLM engines and GRPO on Countdown, their
#: evaluation and KL (:data:`SLICE_TASK`, :data:`SLICE_MODELS`, :data:`SLICE_METHODS`); then one base-model
#: evaluation of every other evaluated task, and the prepared data of a task only trained on (:func:`slice_targets`).
SLICE_TASK = "countdown"
SLICE_MODELS = ("qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct")
SLICE_METHODS = ("es", "grpo8")


def slice_targets(p: Pipeline) -> list[str]:
    """Snakemake targets of the slice of ``p`` (the rehearsal's pipeline), each reaching its fetches and data.

    Every task of the DAG is reached once, as cheaply as it can be: the Countdown core, then for each other
    evaluated task its base-model evaluation (a slice model where the task evaluates one, else the task's first:
    no training, at most one more replica fetched), then the prepared data of each task that is only trained on
    (MATH training: it grades as the math sets do, which the evaluations reach)."""
    plan = Plan(p)
    out = []
    for model in SLICE_MODELS:
        for method in SLICE_METHODS:
            out.append(f"{plan.eval_dir(SLICE_TASK, model, method, 0)}/metrics.json")
            out.append(f"{P.fill(plan.paths.KL, task=SLICE_TASK, model=model, method=method, seed=0)}/kl.json")
    for task in p.evaluated_tasks():
        if task == SLICE_TASK:
            continue
        bases = [model for model, method, _ in plan.runs(task) if method == BASE]
        model = next((m for m in bases if m in SLICE_MODELS), bases[0])
        out.append(f"{plan.eval_dir(task, model, BASE, 0)}/metrics.json")
    evaluated = {P.fill(plan.paths.PREPARED, task=t) for t in p.evaluated_tasks()}
    out += [d for d in plan.datasets() if d not in evaluated]
    return out


def rehearsal_slice(repo: Path) -> list[str]:
    """The slice's targets of config/rehearsal.yaml in ``repo`` (:func:`slice_targets`)."""
    return slice_targets(load_pipeline(read_config(CONFIG, repo), CONFIG, repo))


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float, what: str) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it was ready")
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


@contextmanager
def serving(mirror: Path, log: Path) -> Iterator[str]:
    """The mirror served over HTTP for as long as the block runs; yields its URL."""
    url_file = mirror / "url"
    url_file.unlink(missing_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "esrepro.cli", "mirror-serve", str(mirror), "--port", "0",
                                 "--url-file", str(url_file)], stdout=out, stderr=subprocess.STDOUT)
    try:
        yield _wait_for_file(url_file, proc, 60, "the mirror server")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def slurm_cluster(repo: Path, cpus: int = 2) -> Iterator[dict[str, str]]:
    """A single-node SLURM cluster (scripts/slurm-local) for as long as the block runs; yields its environment.
    Its node offers at least ``cpus`` CPUs, whatever the machine has. Its state lives in a new temporary folder of
    the script's choosing, whose parents user munge can traverse (a checkout's may not be)."""
    script = repo / "scripts" / "slurm-local"
    env = {**os.environ, "SLURM_LOCAL_MIN_CPUS": str(max(2, cpus))}
    state = Path(subprocess.run([str(script), "start"], check=True, capture_output=True, text=True,
                                env=env).stdout.strip())
    try:
        yield {"SLURM_CONF": str(state / "slurm.conf"), "PATH": f"{state / 'bin'}:{os.environ['PATH']}"}
    finally:
        subprocess.run([str(script), "stop", str(state), "--purge"], check=False, capture_output=True)


def rehearse(repo: Path, *, slice_only: bool = False, only: list[str] | tuple[str, ...] = (),
             shared_data: str | None = None, jobs: int = 4, slurm: bool = True, snakemake: str = "snakemake") -> int:
    """Run the rehearsal from ``repo``: the whole DAG, its slice (:func:`slice_targets`) or ``only`` these targets
    (and the jobs they need); returns Snakemake's exit status (the report is written either way)."""
    if slice_only and only:
        raise ValueError("rehearse: the slice or some targets, not both")
    work = repo / WORKSPACE
    mirror, logs = work / "mirror", work / "results" / "logs" / "rehearsal"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    build = [sys.executable, "-m", "esrepro.cli", "mirror-build", str(mirror), "--run-config", PAPER]
    if shared_data:
        build += ["--shared-data", shared_data]
    subprocess.run(build, cwd=repo, check=True)
    configs = [CONFIG, str((mirror / PINS).relative_to(repo))]
    env = {**os.environ, "HF_TOKEN": TOKEN, "HF_HOME": str(work / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("HF_HUB_OFFLINE", None)
    submitted: list[Job] = []
    targets = rehearsal_slice(repo) if slice_only else list(only)
    with ExitStack() as stack:
        url = stack.enter_context(serving(mirror, logs / "mirror.log"))
        env.update({"HF_ENDPOINT": url, "ESREPRO_URL_MIRROR": url})
        cmd = [snakemake, "--jobs", str(jobs), *NO_RETRIES, "--configfile", *configs]
        if slurm:
            # as many one-CPU jobs at once as are submitted, on any machine: a toy job is mostly starting Python and
            # waiting for the next status check, so on 2 cores, 4 jobs side by side fill the time 2 would leave idle
            env.update(stack.enter_context(slurm_cluster(repo, cpus=jobs)))
            cmd = [snakemake, "--profile", "workflow/profiles/slurm", *LOCAL_CLUSTER_ARGS, "--jobs", str(jobs),
                   *NO_RETRIES, "--configfile", *configs]
        if targets:
            cmd += ["--", *targets]
        print("+ " + " ".join(cmd), flush=True)
        began = time.time()
        status = subprocess.run(cmd, cwd=repo, env=env).returncode
        if slurm:  # before the cluster stops: its records of every job it ran
            shown = subprocess.run(["scontrol", "show", "job", "-o"], env=env, capture_output=True, text=True)
            submitted = slurm_jobs(shown.stdout, repo)
    wall = time.monotonic() - started
    planned = dag_jobs(configs, snakemake, repo, env, targets)
    paper = dag_jobs([PAPER], snakemake, repo, env)
    if targets:
        paper = {r: n for r, n in paper.items() if r in planned}
    on_host = local_rules(_latest_log(repo)) if slurm else set(planned)
    ran = submitted + local_jobs(repo / ".snakemake" / "metadata", WORKSPACE, on_host, since=began)
    rows = report_rows(paper, planned, ran, outputs_work(work), finished=status == 0)
    part = "slice " if slice_only else "part " if targets else ""
    stem = work / "results" / ("rehearsal_slice" if slice_only else "rehearsal_part" if targets else "rehearsal")
    print(write_report(rows, stem, wall))
    print(f"rehearsal: {part}finished in {wall / 60:.1f} min (Snakemake exit status "
          f"{status}); report: {stem}.csv, {stem}.md", flush=True)
    return status


def _latest_log(repo: Path) -> str:
    """The text of Snakemake's log of its latest run in ``repo`` (.snakemake/log/)."""
    logs = sorted((repo / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda f: f.stat().st_mtime)
    return logs[-1].read_text() if logs else ""
