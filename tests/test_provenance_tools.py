"""Provenance tools: DVC records (push/pull round trip, metrics, plots), the papermill report,
and the Workflow Run RO-Crate. Small synthetic inputs; about half a minute in all.

DVC runs from its own environment (.venv-dvc, see esrepro.provenance.dvc). Each test skips
(visibly, with -ra) while what it needs (dvc, papermill, rocrate) is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import esrepro  # noqa: F401
except ImportError:  # not installed: run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from conftest import skip_or_fail_in_ci
from esrepro.io import write_json, write_jsonl, write_text
from esrepro.provenance.dvc import DvcError, dvc_command, read_pointer, record, run_dvc
from esrepro.provenance.rocrate import export_crate
from esrepro.report.notebook import (
    eval_summary,
    execute_report,
    load_eval_metrics,
    ours_vs_paper,
)
from esrepro.steps.report import main_eval_summary

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "workflow" / "notebooks" / "analysis.ipynb"


# --------------------------------------------------------------------------- helpers
def _need_dvc() -> None:
    try:
        dvc_command()
    except DvcError as exc:
        skip_or_fail_in_ci(str(exc))


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _dvc_repo(path: Path) -> Path:
    """A git repository with the project's .gitignore, DVC config, .dvcignore and dvc.yaml."""
    path.mkdir(parents=True, exist_ok=True)
    assert _git(["init", "-q"], path).returncode == 0
    run_dvc(["init", "--quiet"], path)
    for rel in (".gitignore", ".dvcignore", "dvc.yaml", ".dvc/config", ".dvc/.gitignore",
                ".dvc/plots/curves_by_label.json"):
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, path / rel)
    return path


def _metric(task: str, model: str, method: str, seed: int, acc: float, n: int = 200) -> dict:
    return {"task": task, "split": "test", "model": model, "method": method, "seed": seed, "n": n,
            "accuracy": acc, "mean_reward": acc / 2}


def _write_metrics(root: Path, rows: list[dict]) -> list[str]:
    paths = []
    for r in rows:
        p = root / f"results/eval/{r['task']}/{r['model']}/{r['method']}/seed{r['seed']}/test/metrics.json"
        write_json(p, r)
        write_jsonl(p.with_name("responses.jsonl"), [{"response": "x"}, {"response": "y"}])
        paths.append(p.relative_to(root).as_posix())
    return paths


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- (a) DVC round trip
def test_dvc_record_push_delete_pull_restores_bytes(tmp_path):
    _need_dvc()
    repo = _dvc_repo(tmp_path / "repo")
    store = tmp_path / "store"
    run_dvc(["remote", "add", "-d", "store", str(store)], repo)

    prepared = repo / "data/prepared/countdown"
    write_jsonl(prepared / "train.jsonl", [{"nums": [1, 2, 3], "target": 6}] * 5)
    write_jsonl(prepared / "test.jsonl", [{"nums": [4, 5], "target": 9}] * 3)
    write_json(prepared / "manifest.json", {"kind": "prepare_data"})
    run = repo / "results/runs/countdown/tiny/es/seed0"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "model.safetensors").write_bytes(os.urandom(50_000))
    write_jsonl(run / "log.jsonl", [{"iteration": i, "reward_mean": i / 10} for i in range(3)])
    (run / "resume").mkdir()  # an unfinished run's state: .dvcignore keeps it out
    (run / "resume" / "state.pt").write_bytes(b"partial")
    (run / ".checkpoint.abc.tmp").mkdir()  # an atomic_path temporary: also kept out
    (run / ".checkpoint.abc.tmp" / "x").write_bytes(b"half")

    mtime = (prepared / "train.jsonl").stat().st_mtime_ns
    dvc_files = record(["data/prepared", "results/runs"], repo)
    assert dvc_files == ["data/prepared.dvc", "results/runs.dvc"]
    assert (prepared / "train.jsonl").stat().st_mtime_ns == mtime  # Snakemake sees nothing new
    for f in dvc_files:
        assert (repo / f).is_file()
        assert _git(["check-ignore", "-q", f], repo).returncode == 1, f"{f} is git-ignored"
    assert _git(["add", *dvc_files], repo).returncode == 0  # committable without -f
    assert read_pointer(repo / "results/runs.dvc")["nfiles"] == 2  # checkpoint and log: resume/, .tmp/ left out

    expected = {**{f"data/prepared/{k}": v for k, v in _tree(repo / "data/prepared").items()},
                **{f"results/runs/{k}": v for k, v in _tree(repo / "results/runs").items()
                   if "resume/" not in k and ".tmp/" not in k}}
    # A bare `dvc push`/`dvc pull` must find every pointer file: with `/results/*` in .gitignore
    # DVC skips the whole results/ folder (it asks git about "results/" itself).
    run_dvc(["push", "--quiet"], repo)
    assert store.is_dir()
    for rel in ("data/prepared", "results/runs", ".dvc/cache"):
        shutil.rmtree(repo / rel)
    run_dvc(["pull", "--quiet"], repo)
    restored = {**{f"data/prepared/{k}": v for k, v in _tree(repo / "data/prepared").items()},
                **{f"results/runs/{k}": v for k, v in _tree(repo / "results/runs").items()}}
    assert restored == expected


def test_record_refuses_a_git_ignored_pointer_and_names_the_fix(tmp_path):
    _need_dvc()
    repo = _dvc_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("/results/*\n")
    write_json(repo / "results/models/tiny/base/config.json", {"a": 1})
    with pytest.raises(DvcError, match=r"!/results/models\.dvc"):
        record(["results/models"], repo)
    with pytest.raises(FileNotFoundError):
        record(["results/missing"], repo)


# --------------------------------------------------------------------------- (b) metrics and plots
def test_dvc_metrics_and_plots_show_the_headline_numbers(tmp_path, monkeypatch):
    _need_dvc()
    repo = _dvc_repo(tmp_path / "repo")
    paths = _write_metrics(repo, [
        _metric("countdown", "tiny", "base", 0, 0.11), _metric("countdown", "tiny", "es", 0, 0.15),
        _metric("countdown", "tiny", "es", 1, 0.17), _metric("gsm8k", "tiny", "base", 0, 0.25),
    ])
    monkeypatch.chdir(repo)  # metrics paths are relative, as Snakemake passes them
    summary = main_eval_summary(paths, "results/reports/eval_summary.metrics.json")
    assert summary == {"countdown": {"tiny": {"base": 11.0, "es": 16.0}}, "gsm8k": {"tiny": {"base": 25.0}}}
    write_json(repo / "results/tables/table1_countdown.metrics.json", {"tiny": {"base": 11.0, "es": 16.0}})
    write_text(repo / "results/figures/countdown_curves.csv",
               "label,iteration,reward_mean\n" + "".join(f"tiny / ES / {s},{i},{0.2 + i / 100 + s / 50}\n"
                                                         for s in (0, 1) for i in range(4)))

    shown = json.loads(run_dvc(["metrics", "show", "--json"], repo).stdout)
    data = {path: v["data"] for rev in shown.values() for path, v in rev["data"].items()}
    assert data["results/tables/table1_countdown.metrics.json"] == {"tiny": {"base": 11.0, "es": 16.0}}
    assert data["results/reports/eval_summary.metrics.json"]["gsm8k"]["tiny"]["base"] == 25.0
    text = run_dvc(["metrics", "show"], repo).stdout
    assert "countdown.tiny.es" in text and "16.0" in text and "25.0" in text

    plots = json.loads(run_dvc(["plots", "show", "--json", "-o", str(tmp_path / "plots")], repo).stdout)["data"]
    curve = plots["results/figures/countdown_curves.csv"][0]["content"]
    assert curve["encoding"]["color"]["field"] == "label"  # one line per run, not one zig-zag
    assert {r["label"] for r in curve["data"]["values"]} == {"tiny / ES / 0", "tiny / ES / 1"}


# --------------------------------------------------------------------------- (c) the papermill report
@pytest.fixture()
def report_inputs(tmp_path):
    from esrepro.report.figures import training_curves
    from esrepro.report.tables import build_table1

    root = tmp_path / "run"
    metrics = _write_metrics(root, [
        _metric("countdown", "tiny", "base", 0, 0.11), _metric("countdown", "tiny", "es", 0, 0.163),
        _metric("countdown", "qwen2.5-0.5b-instruct", "es", 0, 0.131),
        _metric("math500", "tiny", "base", 0, 0.02, n=50),
    ])
    registry = {"models": {"tiny": {"display": "Tiny-Test"},
                           "qwen2.5-0.5b-instruct": {"display": "Qwen2.5-0.5B-Instruct"}}}
    (root / "config").mkdir()
    (root / "config/models.yaml").write_text(json.dumps(registry))  # JSON is YAML
    shutil.copyfile(REPO / "config/published.yaml", root / "config/published.yaml")
    build_table1([root / m for m in metrics], root / "config/published.yaml", registry["models"],
                 root / "results/tables/table1_countdown")
    training_curves({"Tiny-Test / ES / seed0": [{"iteration": i, "reward_mean": 0.2 + i / 50} for i in range(5)]},
                    root / "results/figures/countdown_curves", "Countdown: training reward")
    return root


def test_execute_report_runs_every_cell_and_renders_the_numbers(report_inputs, tmp_path):
    for module in ("papermill", "nbconvert", "ipykernel"):
        pytest.importorskip(module)
    root = report_inputs
    params = {"tables_dir": "results/tables", "figures_dir": "results/figures", "eval_dir": "results/eval",
              "published": "config/published.yaml", "registry": "config/models.yaml"}
    out = tmp_path / "out"
    execute_report(NOTEBOOK, out / "analysis.ipynb", out / "analysis.html", params, cwd=root)

    nb = json.loads((out / "analysis.ipynb").read_text())
    assert nb["metadata"]["papermill"]["exception"] in (None, False)
    assert nb["metadata"]["papermill"]["parameters"] == params
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["metadata"]["papermill"]["status"] == "completed" for c in code)
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    text = (out / "analysis.ipynb").read_text()
    assert "start_time" not in text and "end_time" not in text  # no wall-clock times
    assert '"id": "injected-parameters"' in text

    html = (out / "analysis.html").read_text()
    assert "16.3" in html and "13.1" in html  # ours
    assert "14.4" in html  # the paper's ES number for Qwen2.5-0.5B, beside ours
    assert "Tiny-Test" in html and "math500" in html
    assert html.count("data:image/png;base64,") >= 1  # the figure is embedded


def test_execute_report_failing_cell_raises_and_writes_nothing(report_inputs, tmp_path):
    for module in ("papermill", "nbconvert", "ipykernel"):
        pytest.importorskip(module)
    from papermill.exceptions import PapermillExecutionError

    (report_inputs / "results/tables/broken.csv").write_text("")  # pandas: no columns to parse
    out = tmp_path / "out"
    with pytest.raises(PapermillExecutionError, match="EmptyDataError"):
        execute_report(NOTEBOOK, out / "analysis.ipynb", out / "analysis.html",
                       {"tables_dir": str(report_inputs / "results/tables")}, cwd=report_inputs)
    assert not (out / "analysis.ipynb").exists() and not (out / "analysis.html").exists()


def test_notebook_helpers(tmp_path):
    _write_metrics(tmp_path, [_metric("countdown", "tiny", "es", 0, 0.10), _metric("countdown", "tiny", "es", 1, 0.20)])
    runs = load_eval_metrics(tmp_path / "results/eval")
    assert list(runs["seed"]) == [0, 1] and "path" in runs
    assert eval_summary(runs) == {"countdown": {"tiny": {"es": 15.0}}}
    import pandas as pd

    table = pd.DataFrame({"model": ["tiny"], "Model": ["Tiny"], "ES (ours)": [16.0], "ES (ours) std": [1.0],
                          "ES (paper)": [14.4], "PPO (ours)": [float("nan")], "PPO (paper)": [float("nan")],
                          "Best RL (paper)": [13.5], "Best RL method (paper)": ["Dr.GRPO"]})
    pairs = ours_vs_paper(table)
    assert list(pairs["Method"]) == ["ES", "Best RL"]
    es = pairs.iloc[0]
    assert (es["ours"], es["ours std"], es["paper"]) == (16.0, 1.0, 14.4)
    assert es["ours - paper"] == pytest.approx(1.6)


# --------------------------------------------------------------------------- (d) the RO-Crate
def test_export_crate_writes_a_workflow_run_crate(tmp_path):
    pytest.importorskip("rocrate")
    root = tmp_path / "repo"
    files = {
        "Snakefile": "rule all:\n    input: 'results/tables/t.csv'\n",
        "workflow/rules/report.smk": "# rules\n",
        "config/config.yaml": "models: [tiny]\n",
        "results/tables/t.csv": "model,ES (ours),ES (paper)\ntiny,16.0,14.4\n",
        "results/figures/f.png": "\x89PNG fake",
        "data/prepared/countdown/train.jsonl": '{"target": 6}\n',
    }
    for rel, text in files.items():
        write_text(root / rel, text)
    (root / "results/runs/countdown/tiny/es/seed0/checkpoint").mkdir(parents=True)
    (root / "results/runs/countdown/tiny/es/seed0/checkpoint/model.safetensors").write_bytes(b"\0" * 5000)
    write_text(root / "data/prepared.dvc", "outs:\n- md5: abc.dir\n  path: prepared\n")
    manifests = {
        "data/prepared/countdown/manifest.json": {"kind": "prepare_data", "started": "2026-01-01T10:00:00+00:00",
                                                  "ended": "2026-01-01T10:00:05+00:00", "inputs": {},
                                                  "outputs": {"train": {"path": "data/prepared/countdown/train.jsonl",
                                                                        "sha256": "a" * 64}}},
        "results/runs/countdown/tiny/es/seed0/manifest.json": {
            "kind": "train", "started": "2026-01-01T10:01:00+00:00", "ended": "2026-01-01T10:05:00+00:00",
            "inputs": {}, "outputs": {"checkpoint": {"path": "results/runs/countdown/tiny/es/seed0/checkpoint",
                                                     "sha256": "b" * 64}}},
    }
    for rel, doc in manifests.items():
        write_json(root / rel, doc)

    def export(out):
        return export_crate(out, ["Snakefile", "workflow/rules/report.smk"], ["config/config.yaml"],
                            ["data/prepared/countdown"],
                            ["results/runs/countdown/tiny/es/seed0/checkpoint", "results/tables/t.csv",
                             "results/figures/f.png"],
                            list(manifests), root=root, copy_max_bytes=1000)

    path = export(tmp_path / "crate")
    assert path == tmp_path / "crate" / "ro-crate-metadata.json"
    doc = json.loads(path.read_text())
    assert "https://w3id.org/ro/crate/1.1/context" in doc["@context"]
    graph = {e["@id"]: e for e in doc["@graph"]}
    ids = lambda v: [x["@id"] for x in (v if isinstance(v, list) else [v])]  # noqa: E731

    root_ds = graph["./"]
    assert {"https://w3id.org/ro/wfrun/workflow/0.5", "https://w3id.org/ro/wfrun/process/0.5",
            "https://w3id.org/workflowhub/workflow-ro-crate/1.0"} <= set(ids(root_ds["conformsTo"]))
    assert ids(root_ds["mainEntity"]) == ["Snakefile"]
    wf = graph["Snakefile"]
    assert set(wf["@type"]) >= {"File", "SoftwareSourceCode", "ComputationalWorkflow"}
    assert graph[ids(wf["programmingLanguage"])[0]]["name"] == "Snakemake"
    assert ids(wf["hasPart"]) == ["workflow/rules/report.smk"]

    action = graph[ids(root_ds["mentions"])[0]]
    assert action["@type"] == "CreateAction" and ids(action["instrument"]) == ["Snakefile"]
    assert ids(action["object"]) == ["config/config.yaml", "#data/prepared/countdown"]
    assert ids(action["result"]) == ["#results/runs/countdown/tiny/es/seed0/checkpoint", "results/tables/t.csv",
                                     "results/figures/f.png"]
    assert (action["startTime"], action["endTime"]) == ("2026-01-01T10:00:00+00:00", "2026-01-01T10:05:00+00:00")

    ckpt = graph["#results/runs/countdown/tiny/es/seed0/checkpoint"]  # referenced, not copied
    assert ckpt["@type"] == "Dataset" and ckpt["sha256"] == "b" * 64 and ckpt["contentSize"] == "5000"
    assert "dvc pull data/prepared.dvc" in graph["#data/prepared/countdown"]["description"]
    assert not (tmp_path / "crate/results/runs/countdown/tiny/es/seed0/checkpoint").exists()
    for rel in ("Snakefile", "config/config.yaml", "results/tables/t.csv", "README.md", *manifests):
        assert (tmp_path / "crate" / rel).is_file(), rel
    for m in manifests:
        assert ids(graph[m]["about"]) == [action["@id"]]

    def refs(value):
        if isinstance(value, dict):
            if set(value) == {"@id"}:
                yield value["@id"]
            for v in value.values():
                yield from refs(v)
        elif isinstance(value, list):
            for v in value:
                yield from refs(v)

    local = {r for e in doc["@graph"] for r in refs({k: v for k, v in e.items() if k != "@id"})
             if not r.startswith(("http://", "https://"))}
    assert local <= set(graph), local - set(graph)  # every local reference is described

    from rocrate.rocrate import ROCrate

    assert ROCrate(tmp_path / "crate").mainEntity.id == "Snakefile"  # the reference library reads it back
    assert export(tmp_path / "again").read_text() == path.read_text()  # deterministic


def test_the_package_finds_its_repository():
    """Where .venv-dvc is looked for and whose git commit manifests record: the repository root, not src/."""
    from esrepro.provenance import REPO as PACKAGE_REPO
    from esrepro.provenance.manifest import code_version

    assert PACKAGE_REPO == REPO.resolve() and (PACKAGE_REPO / "pyproject.toml").is_file()
    assert code_version()["git_commit"] == code_version(REPO)["git_commit"]

