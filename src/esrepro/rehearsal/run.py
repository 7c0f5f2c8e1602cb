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

from esrepro.rehearsal.mirror_layout import PINS
from esrepro.rehearsal.report import (Job, dag_jobs, local_jobs, local_rules, outputs_work, report_rows,
                                      slurm_jobs, write_report)

CONFIG = "config/rehearsal.yaml"
PAPER = "config/paper.yaml"
WORKSPACE = "work/rehearsal"
#: A token the mirror accepts for its gated (meta-llama) repositories, as the hub accepts a user's.
TOKEN = "hf_rehearsal"
#: What a machine without slurmdbd needs beside the profile (as tests/test_slurm.py runs it).
LOCAL_CLUSTER_ARGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
                      "--default-resources", "slurm_partition='local'"]
#: A rehearsal shows each defect once: no resubmission of a failed job (the profile's retries: 2).
NO_RETRIES = ["--retries", "0"]
#: The slice CI runs: one Qwen2 and one Llama replica, ES on vLLM engines and GRPO, their evaluation and KL.
SLICE_MODELS = ("qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct")
SLICE_METHODS = ("es", "grpo8")


def slice_targets(workspace: str = WORKSPACE) -> list[str]:
    """Snakemake targets of the slice (their runs, fetches and data come with them)."""
    out = []
    for model in SLICE_MODELS:
        for method in SLICE_METHODS:
            out.append(f"{workspace}/results/eval/countdown/{model}/{method}/seed0/test/metrics.json")
            out.append(f"{workspace}/results/kl/countdown/{model}/{method}/seed0/kl.json")
    return out


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
def slurm_cluster(repo: Path) -> Iterator[dict[str, str]]:
    """A single-node SLURM cluster (scripts/slurm-local) for as long as the block runs; yields its environment.
    Its state lives in a new temporary folder of the script's choosing, whose parents user munge can traverse
    (a checkout's may not be)."""
    script = repo / "scripts" / "slurm-local"
    state = Path(subprocess.run([str(script), "start"], check=True, capture_output=True, text=True).stdout.strip())
    try:
        yield {"SLURM_CONF": str(state / "slurm.conf"), "PATH": f"{state / 'bin'}:{os.environ['PATH']}"}
    finally:
        subprocess.run([str(script), "stop", str(state), "--purge"], check=False, capture_output=True)


def rehearse(repo: Path, *, slice_only: bool = False, shared_data: str | None = None, jobs: int = 4,
             slurm: bool = True, snakemake: str = "snakemake") -> int:
    """Run the rehearsal from ``repo``; returns Snakemake's exit status (the report is written either way)."""
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
    with ExitStack() as stack:
        url = stack.enter_context(serving(mirror, logs / "mirror.log"))
        env.update({"HF_ENDPOINT": url, "ESREPRO_URL_MIRROR": url})
        cmd = [snakemake, "--jobs", str(jobs), *NO_RETRIES, "--configfile", *configs]
        if slurm:
            env.update(stack.enter_context(slurm_cluster(repo)))
            cmd = [snakemake, "--profile", "workflow/profiles/slurm", *LOCAL_CLUSTER_ARGS, "--jobs", str(jobs),
                   *NO_RETRIES, "--configfile", *configs]
        if slice_only:
            cmd += ["--", *slice_targets()]
        print("+ " + " ".join(cmd), flush=True)
        began = time.time()
        status = subprocess.run(cmd, cwd=repo, env=env).returncode
        if slurm:  # before the cluster stops: its records of every job it ran
            shown = subprocess.run(["scontrol", "show", "job", "-o"], env=env, capture_output=True, text=True)
            submitted = slurm_jobs(shown.stdout, repo)
    wall = time.monotonic() - started
    planned = dag_jobs(configs, snakemake, repo, env, slice_targets() if slice_only else ())
    paper = dag_jobs([PAPER], snakemake, repo, env)
    if slice_only:
        paper = {r: n for r, n in paper.items() if r in planned}
    on_host = local_rules(_latest_log(repo)) if slurm else set(planned)
    ran = submitted + local_jobs(repo / ".snakemake" / "metadata", WORKSPACE, on_host, since=began)
    rows = report_rows(paper, planned, ran, outputs_work(work), finished=status == 0)
    stem = work / "results" / ("rehearsal_slice" if slice_only else "rehearsal")
    print(write_report(rows, stem, wall))
    print(f"rehearsal: {'slice ' if slice_only else ''}finished in {wall / 60:.1f} min (Snakemake exit status "
          f"{status}); report: {stem}.csv, {stem}.md", flush=True)
    return status


def _latest_log(repo: Path) -> str:
    """The text of Snakemake's log of its latest run in ``repo`` (.snakemake/log/)."""
    logs = sorted((repo / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda f: f.stat().st_mtime)
    return logs[-1].read_text() if logs else ""
