"""The pipeline as Snakemake runs it: the paper's DAG, lint, and the embedded default end to end."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, copy_repo, skip_or_fail_in_ci

BIN = Path(sys.executable).parent


def _snakemake(args: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_paper_dag_lists_every_model(tmp_path):
    repo = copy_repo(tmp_path)
    proc = _snakemake(["-n", "--configfile", "config/paper.yaml"], repo, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.M))
    # Countdown: ES per model (+ 3 stability seeds of Qwen2.5-3B-Instruct); v2: ES on MATH (Qwen2.5-Math-7B),
    # Sudoku and ARC (Qwen2.5-3B-Instruct); conciseness study: (3 sigmas + 11 betas) x 4 seeds, and the
    # learning-rate sweep: 4 betas x 4 learning rates x 4 seeds, on Qwen2.5-7B-Instruct; ESSA study on GSM8K:
    # Qwen2.5-Math-7B's reference + 3 populations + 4 ranks + 4 GPU counts + 1 resampling run (Figs. 2, 4, 7;
    # Sec. 5.4) and Qwen2.5-32B's reference (Fig. 6 right) + 2 precisions (Fig. 9) by the train rule, the GRPO
    # baseline (Fig. 8, Qwen2.5-Math-7B) by its own rule; on PRM800K (Fig. 6 left) Llama-3.1-8B's reference run
    essa = (1 + 3 + 4 + 4 + 1) + (1 + 2)
    scaling = 1
    # v2 Fig. 2: ES on MATH and its continuation from the 160-iteration snapshot (ESCHKPT-2); the three released RL
    # checkpoints are fetched and evaluated only; ARC-AGI's Qwen2.5-14B-Instruct is fetched too
    assert stats["train"] == str(7 + 4 + 3 + 14 * 4 + 16 * 4 + essa + scaling) and stats["fetch_model"] == "14"
    assert stats["essa_grpo"] == "1"
    # Countdown: base + 6 methods per model (+ 3 x 6 stability runs); GSM8K and conciseness: the base models;
    # the five math sets: v2 Fig. 2's seven bars (Qwen2.5-Math-7B's base, the three RL checkpoints, ESCHKPT-1/2/3);
    # Sudoku: Qwen2.5-3B-Instruct's base and ES; ARC: Qwen2.5-14B-Instruct's;
    # ESSA: every run and the baseline, and the base models of Qwen2.5-Math-7B and Qwen2.5-32B on GSM8K;
    # PRM800K (an evaluate entry): every base model of the config, Llama-3.1-8B's and its scaling run
    assert stats["evaluate"] == str(7 * 7 + 3 * 6 + 7 * 2 + 5 * 7 + 2 * 2 + essa + 1 + 2 + 7 + 1 + scaling)
    # KL: every Countdown run and base model, every study run and the study's base model
    assert stats["kl"] == str(7 * 7 + 3 * 6 + 1 + 14 * 4 + 16 * 4)
    for rule in ("table2_conciseness", "conciseness_stability", "conciseness_pareto", "conciseness_distribution"):
        assert stats[rule] == "1"
    for method in ("es_sigma0.0005", "es_sigma0.001", "es_sigma0.0015", "grpo_beta0", "grpo_beta0.01",
                   "grpo_beta0.0167", "grpo_beta0.0278", "grpo_beta0.0464", "grpo_beta0.129", "grpo_beta1"):
        assert f"results/kl/conciseness/qwen2.5-7b-instruct/{method}/seed3/kl.json" in out
    assert "results/kl/countdown/llama-3.1-8b-instruct/grpo30/seed0/kl.json" in out
    # data that downloads (Countdown's, the hub sets, PRM800K) is prepared on the submitting host by download_data
    assert stats["prepare_data"] == "4" and stats["download_data"] == "8"
    # RL (v2 Table 4, App. A.2): the four (beta, lr) cells of PPO-z, GRPO-z (8) and GRPO-z (30) and one cell each of
    # GRPO-v and Dr.GRPO-v per model, one selection each (and again for 3 stability seeds); no Dr.GRPO on TRL
    assert stats["train_cell"] == str((7 + 3) * (3 * 4 + 2)) and stats["select_rl"] == str((7 + 3) * 5)
    assert stats["table3_rl_hyperparameters"] == "1"
    for model in ("qwen2.5-0.5b-instruct", "qwen2.5-7b-instruct", "llama-3.2-1b-instruct", "llama-3.1-8b-instruct"):
        assert f"results/runs/countdown/{model}/es/seed0/checkpoint" in out
        for method in ("ppo", "grpo8", "grpo30", "grpov", "drgrpov"):
            assert f"results/runs/countdown/{model}/{method}/seed0/selection.json" in out
        assert f"results/runs/countdown/{model}/drgrpo/" not in out
    assert "results/runs/countdown/llama-3.1-8b-instruct/grpo30/grid/lr1e-05_beta0.005/seed0/checkpoint" in out
    assert "results/runs/countdown/llama-3.1-8b-instruct/ppo/grid/alr1e-06_kl0.005/seed0/checkpoint" in out
    assert "results/runs/countdown/llama-3.1-8b-instruct/drgrpov/grid/default/seed0/checkpoint" in out
    assert "build_tiny" not in out  # nothing of the tiny default leaks into the paper run
    assert "gpu=8" in out  # the registry's resources reach the jobs
    assert "nodes=16, gres=gpu:h100:8, tasks=16" in out  # ESSA's 128-GPU run: 16 of the 7B entry's 8-GPU nodes
    # ESSA Fig. 6: Llama-3.1-8B on PRM800K (8 GPUs, ESSA alone) and Qwen2.5-32B on GSM8K (16 GPUs); Fig. 9:
    # Qwen2.5-32B at bf16 (its reference run), INT8 and INT4
    assert "results/eval/prm800k/llama-3.1-8b/essa_ref/seed0/test/metrics.json" in out
    assert "results/eval/prm800k/llama-3.1-8b/essa_grpo/" not in out
    for method in ("essa_ref", "essa_int8", "essa_int4"):
        assert f"results/eval/gsm8k/qwen2.5-32b/{method}/seed0/test/metrics.json" in out
    assert "results/eval/gsm8k/qwen2.5-32b/essa_pop96/" not in out
    assert "results/figures/essa_scaling.png" in out


def test_lint_is_clean():
    proc = _snakemake(["--lint"], REPO, timeout=120)
    assert proc.returncode == 0
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    """The README's main job, run once on a copy of the repository."""
    repo = copy_repo(tmp_path_factory.mktemp("pipeline"))
    proc = _snakemake(["--profile", "workflow/profiles/default"], repo, timeout=3000)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    report = _snakemake(["--report", "results/reports/workflow_report.html"], repo, timeout=300)  # as `make reproduce`
    assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
    return repo


def _esrepro(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "esrepro"), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


GOLDEN = REPO / "golden" / "tiny"


@pytest.mark.slow
def test_embedded_default_tables_are_the_golden_ones(default_run):
    """Tiny-scale numerics are pinned (esrepro.runtime.numerics), so the default's tables equal the committed golden ones byte
    for byte, but for columns of measured wall time (the ESSA summary's training seconds); a change that moves a
    table updates golden/tiny (`make golden`) in the same commit."""
    from esrepro.provenance.golden import same_content

    gold_dir, made_dir = GOLDEN / "results/tables", default_run / "results/tables"
    gold, made = sorted(p.name for p in gold_dir.glob("*.csv")), sorted(p.name for p in made_dir.glob("*.csv"))
    assert made == gold, f"tables without a golden file or golden files without a table: {set(made) ^ set(gold)}"
    diffs: list[str] = []
    for name in gold:
        if (made_dir / name).read_bytes() != (gold_dir / name).read_bytes() and not same_content(made_dir / name,
                                                                                               gold_dir / name):
            diffs += difflib.unified_diff((gold_dir / name).read_text().splitlines(),
                                          (made_dir / name).read_text().splitlines(),
                                          f"golden/tiny/results/tables/{name}", f"results/tables/{name}", lineterm="")
    compared = _esrepro(["compare", str(GOLDEN)], default_run)  # and where a difference arose, from the manifests
    assert not diffs, ("the tiny tables moved; if on purpose, run `make golden` and commit golden/tiny:\n"
                       + "\n".join(diffs) + "\n" + compared.stdout[-4000:])
    assert compared.returncode == 0, compared.stdout[-6000:] + compared.stderr[-2000:]


@pytest.mark.slow
def test_embedded_default_writes_every_output(default_run):
    repo = default_run
    table = pd.read_csv(repo / "results/tables/table1_countdown.csv")
    row = table[table["model"] == "tiny"].iloc[0]
    assert 0 <= row["Original (ours)"] <= 100 and 0 <= row["ES (ours)"] <= 100
    assert "ES" in (repo / "results/tables/table1_countdown.md").read_text()
    assert "\\begin{tabular}" in (repo / "results/tables/table1_countdown.tex").read_text()
    assert (repo / "results/figures/countdown_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (repo / "results/figures/countdown_curves.pdf").read_bytes()[:4] == b"%PDF"

    run = repo / "results/runs/countdown/tiny/es/seed0"
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in log] == list(range(len(log))) and len(log) > 0
    assert {"reward_mean", "reward_std", "seconds_generation", "seconds_update"} <= set(log[0])
    manifest = json.loads((run / "manifest.json").read_text())
    assert len(manifest["inputs"]["train_data"]["sha256"]) == 64
    for method in ("base", "es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov"):
        metrics = json.loads((repo / f"results/eval/countdown/tiny/{method}/seed0/test/metrics.json").read_text())
        assert metrics["n"] == 200 and metrics["method"] == method
    table = pd.read_csv(repo / "results/tables/table1_countdown.csv")
    for col in ("Original", "PPO-z", "GRPO-z (8)", "GRPO-z (30)", "GRPO-v", "Dr.GRPO-v", "ES"):
        assert table[f"{col} (ours)"].notna().all(), col
    assert "Equal sample budgets" in (repo / "results/tables/table1_countdown.md").read_text()
    for method in ("ppo", "grpo8", "grpo30", "grpov", "drgrpov"):
        rl = json.loads((repo / f"results/runs/countdown/tiny/{method}/seed0/manifest.json").read_text())
        assert rl["budget"]["samples_used"] <= rl["budget"]["sample_budget"]
    t3 = pd.read_csv(repo / "results/tables/table3_rl_hyperparameters.csv")
    assert set(t3["Method"]) == {"PPO-z", "GRPO-z (8)", "GRPO-z (30)", "GRPO-v", "Dr.GRPO-v"}
    # the math sets and puzzles score tiny-v2, the model trained on them; the other sets the Countdown model
    for task, model in [*((t, "tiny") for t in ("gsm8k", "conciseness")),
                        *((t, "tiny-v2") for t in ("math500", "minerva", "olympiad_bench", "aime24", "amc23", "sudoku",
                                                   "arc"))]:
        metrics = json.loads((repo / f"results/eval/{task}/{model}/base/seed0/test/metrics.json").read_text())
        assert metrics["task"] == task and metrics["n"] > 0
        rows = [json.loads(x) for x in (repo / f"results/eval/{task}/{model}/base/seed0/test/responses.jsonl").read_text().splitlines()]
        assert len(rows) == metrics["n"]

    assert "table1_countdown.csv" in (repo / "results/reports/workflow_report.html").read_text()
    html = (repo / "results/reports/analysis.html").read_text()
    assert "Table 1" in html and "Traceback" not in html
    assert json.loads((repo / "results/reports/analysis.ipynb").read_text())["cells"]
    crate = json.loads((repo / "results/ro-crate/ro-crate-metadata.json").read_text())
    assert any("CreateAction" in str(e.get("@type")) for e in crate["@graph"])
    headline = json.loads((repo / "results/tables/table1_countdown.metrics.json").read_text())
    assert set(headline["tiny"]) >= {"base", "es"}
    # KL and the conciseness study (Table 2, Pareto and reward-distribution figures)
    for method in ("base", "es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov"):
        kl = json.loads((repo / f"results/kl/countdown/tiny/{method}/seed0/kl.json").read_text())
        assert kl["k3"] >= 0 and kl["exact"] >= 0 and (method != "base" or kl["k1"] == kl["k3"] == kl["exact"] == 0)
    t2 = pd.read_csv(repo / "results/tables/table2_conciseness.csv")
    ours = t2[t2["Status"] != "not run"]  # v2 Table 2's layout: our configurations, then the paper's rows not run
    assert set(ours["Method"]) <= {"ES", "GRPO"} and len(ours) and ours["Reward (ours)"].notna().all()
    assert (ours["Seeds"] == 2).all() and set(t2.loc[t2["Status"] == "not run", "Method"]) == {"ES", "GRPO"}
    md = (repo / "results/tables/table2_conciseness.md").read_text()
    assert "Cut-off (v2 Sec. 4.2)" in md and "ES sigma = 0.005" in md  # a configuration kept or left out, by name
    for fig in ("conciseness_pareto", "conciseness_distribution"):
        assert (repo / f"results/figures/{fig}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (repo / f"results/figures/{fig}.pdf").read_bytes()[:4] == b"%PDF"
        assert len(pd.read_csv(repo / f"results/figures/{fig}.csv")) > 0  # the plotted numbers
    run = json.loads((repo / "results/kl/conciseness/tiny/es_sigma0.005/seed0/kl.json").read_text())
    assert [c["iteration"] for c in run["checkpoints"]] == [4, 8]

    # beyond the papers: low-rank ES beside full-rank ES at the same samples and seeds, and its claims row
    variants = pd.read_csv(repo / "results/tables/es_variants.csv")
    assert list(variants["Method"]) == ["ES", "EGGROLL (rank 1)", "EGGROLL (rank 4)", "ES, linear projections only"]
    assert set(variants["Samples"]) == {768} and set(variants["Seeds"]) == {3} and variants["Accuracy"].notna().all()
    for method, rank in (("eggroll1", 1), ("eggroll4", 4)):
        egg = json.loads((repo / f"results/runs/countdown/tiny/{method}/seed1/manifest.json").read_text())
        assert egg["settings"]["algorithm"] == "eggroll" and egg["settings"]["rank"] == rank
    claims = pd.read_csv(repo / "results/tables/claims.csv").set_index("Id")
    assert claims.loc["eggroll_matches_es", "Rule on this run"] in ("holds", "does not hold", "not resolved")

    # every job's command ran in the preloaded interpreter (esrepro.runtime.forkserver); none was declined
    server_log = (repo / "results/logs/forkserver.log").read_text()
    served = re.findall(r"stopped; served (\d+) jobs, declined (\d+)", server_log)
    assert len(served) == 1 and int(served[0][0]) > 100 and served[0][1] == "0", served

    again = _snakemake(["-n", "--profile", "workflow/profiles/default"], repo, timeout=120)
    assert "Nothing to be done" in again.stdout + again.stderr


#: A slice of the default that runs in seconds: three data sets that are generated or bundled, one job each.
SLICE = ["data/prepared/gsm8k", "data/prepared/conciseness", "data/prepared/amc23"]
#: The embedded default started as the README says, from a bash that sourced the venv's `activate` (which exports
#: PS1; the bash that runs each job drops it), and as `make reproduce` starts it (MAKEFLAGS, MAKELEVEL).
STARTS = {
    "activated-venv": ["bash", "-c", 'source "$0" && snakemake --profile workflow/profiles/default --cores 1 "$@"',
                       str(BIN / "activate"), *SLICE],
    "make": ["make", "--no-print-directory", "-f", "slice.mk"],
}


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.slow
def test_the_preloaded_interpreter_serves_every_job_however_the_run_is_started(tmp_path, start):
    """Every job of a run runs in the preloaded interpreter (esrepro.runtime.forkserver), none declined, whether the
    default is started from an activated venv or by make; the server's counts end its log."""
    if not (BIN / "activate").exists():
        pytest.skip(f"no venv activate script beside {sys.executable}")
    repo = copy_repo(tmp_path)
    (repo / "slice.mk").write_text(  # the recipe of the Makefile's reproduce target, on the slice
        f"slice:\n\tPATH=\"{BIN}:$$PATH\" {BIN}/snakemake --profile workflow/profiles/default --cores 1 {' '.join(SLICE)}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PS1", "MAKEFLAGS", "MAKELEVEL")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != BIN)
    proc = subprocess.run(STARTS[start], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "declined this job" not in out, out[-4000:]
    from esrepro.runtime import forkserver

    counts = forkserver.summary((repo / "results/logs/forkserver.log").read_text())
    assert counts == {"served": len(SLICE), "declined": 0, "reasons": {}}, counts


def _tree(repo: Path) -> dict[str, tuple[int, str]]:
    """(mtime, sha256) of every file under the repository's own data/ and results/."""
    return {str(f.relative_to(repo)): (f.stat().st_mtime_ns, hashlib.sha256(f.read_bytes()).hexdigest())
            for root in ("data", "results") for f in sorted((repo / root).rglob("*")) if f.is_file()}


SECOND = """scale: tiny
workspace: work/second
registry: config/second_models.yaml
models: [tiny]
data: {countdown: {source: {kind: generated, n_train: 16, n_test: 20}}}
evaluate: {countdown: {batch_size: 20}}
task_options: {countdown: {reward: authors}}
"""


@pytest.mark.slow
def test_a_second_config_in_its_own_workspace_leaves_the_first_alone(default_run):
    """Two configs in one checkout: the second, with a workspace, writes every output under it (its own data,
    its own tiny model of the same registry key, its own Table 1); the default's data and results are neither
    touched nor rescheduled, and each config then has nothing left to do."""
    repo = default_run
    before = _tree(repo)
    registry = yaml.safe_load((repo / "config/models.yaml").read_text())
    tiny = registry["models"]["tiny"]
    tiny["build"]["sft"].update(problems=200, epochs=1)  # a quicker warm start: this test is about paths
    tiny["build"]["tokenizer"]["corpus_problems"] = 300
    (repo / "config/second_models.yaml").write_text(yaml.safe_dump({"models": {"tiny": tiny}}, sort_keys=False))
    (repo / "config/second.yaml").write_text(SECOND)
    second = ["--profile", "workflow/profiles/default", "--configfile", "config/second.yaml"]
    dry = _snakemake(["-n", *second], repo, timeout=120)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    jobs = re.findall(r"^\s+(?:output|log): (.*)$", dry.stdout + dry.stderr, re.M)
    written = [p for line in jobs for p in line.split(", ")]
    assert len(written) > 10 and all(p.startswith("work/second/") for p in written), written
    proc = _snakemake(second, repo, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    table = repo / "work/second/results/tables/table1_countdown.md"
    assert table.is_file() and table.read_text() != (repo / "results/tables/table1_countdown.md").read_text()
    assert _tree(repo) == before
    for config in ([], ["--configfile", "config/second.yaml"]):
        again = _snakemake(["-n", "--profile", "workflow/profiles/default", *config], repo, timeout=120)
        assert "Nothing to be done" in again.stdout + again.stderr, config


@pytest.mark.slow
@pytest.mark.parametrize(
    "victim",
    [
        "data/prepared/countdown/test.jsonl",
        "results/runs/countdown/tiny/es/seed0/checkpoint/model.safetensors",
        "results/tables/table1_countdown.csv",
    ],
)
def test_audit_passes_then_names_the_changed_file(default_run, victim):
    repo = default_run
    ok = _esrepro(["audit", "results/tables/table1_countdown.csv"], repo)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr
    assert "results/models/tiny/base" in ok.stdout and "data/prepared/countdown/train.jsonl" in ok.stdout
    path = repo / victim
    original = path.read_bytes()
    try:
        path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        bad = _esrepro(["audit", "results/tables/table1_countdown.csv"], repo)
        assert bad.returncode != 0
        last = bad.stdout.strip().splitlines()[-1]
        named = victim if "checkpoint" not in victim else victim.rsplit("/", 1)[0]  # directories hash as one
        assert last.startswith(f"audit FAILED: {named} changed"), last
    finally:
        path.write_bytes(original)


@pytest.mark.slow
def test_dvc_push_delete_pull_then_audit_passes(default_run, tmp_path):
    """The recorded state survives a round trip through a local-folder DVC remote."""
    from esrepro.provenance.dvc import DvcError, dvc_command, run_dvc

    try:
        dvc_command()
    except DvcError as exc:
        skip_or_fail_in_ci(str(exc))
    repo = Path(shutil.copytree(default_run, tmp_path / "repo", symlinks=True))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    run_dvc(["init", "--quiet", "--force"], repo)
    run_dvc(["remote", "add", "-d", "store", str(tmp_path / "store")], repo)
    proc = _snakemake(["--cores", "1", "dvc_record"], repo, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    recorded = json.loads((repo / "results/dvc_record.json").read_text())
    assert recorded
    run_dvc(["push", "--quiet"], repo)
    tracked = ["data/prepared", "results/models", "results/runs", "results/eval"]
    for rel in [*tracked, ".dvc/cache"]:
        shutil.rmtree(repo / rel)
    gone = _esrepro(["audit", "results/tables/table1_countdown.csv"], repo)
    assert gone.returncode != 0 and "missing" in gone.stdout.strip().splitlines()[-1]
    run_dvc(["pull", "--quiet"], repo)
    ok = _esrepro(["audit", "results/tables/table1_countdown.csv"], repo)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr
