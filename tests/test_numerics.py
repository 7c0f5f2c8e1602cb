"""Same numbers everywhere: a tiny build and a short ES run give the same weights under two
instruction-set settings in portable numerics, and `esrepro compare` names where two trees part.

Each tree is made by real `esrepro` commands in subprocesses (prepare-data, build-tiny with a short
warm start, a 2-iteration ES run, an evaluation, Table 1). "Another CPU" is simulated by capping the
libraries at AVX2 (ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2);
on this machine's own setting they may use AVX-512.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from esrepro.provenance.golden import compare
from esrepro.runtime import numerics
from esrepro.steps.provenance import main_compare

REPO = Path(__file__).resolve().parents[1]
DATA = "data/prepared/countdown"
BASE = "results/models/tiny/base"
RUN = "results/runs/countdown/tiny/es/seed0"
EVAL = "results/eval/countdown/tiny/es/seed0/test"
TABLE = "results/tables/table1_countdown"

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
SOURCE = {"kind": "generated", "n_train": 16, "n_test": 20, "min_numbers": 3, "max_numbers": 3,
          "max_number": 20, "max_target": 100}
MODEL = {"display": "tiny", "dtype": "float32", "build": {
    "seed": 0, "tokenizer": {"vocab_size": 1024, "corpus_problems": 300},
    "architecture": {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 5, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "max_position_embeddings": 512},
    "sft": {"task": "countdown", "problems": 96, "epochs": 1, "learning_rate": 0.003, "prompts_per_step": 32}}}
ES = {"algorithm": "es", "iterations": 2, "population": 4, "sigma": 0.005, "alpha": 0.005, "train_examples": 8,
      "batch_size": 8, "max_new_tokens": 24, "task_options": {"reward": "authors"}}
EVAL_SPEC = {"split": "test", "limit": 20, "max_new_tokens": 24, "batch_size": 20, "task_options": {"reward": "authors"}}


def _esrepro(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "esrepro.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"esrepro {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def make_tree(root: Path, mode: str, isa: dict[str, str], threads: int = 1) -> Path:
    """Data, a tiny model, a short ES run, its evaluation and Table 1 under ``root``, in numerics ``mode``."""
    env = {k: v for k, v in os.environ.items() if k not in numerics.RECORDED}
    env.update({numerics.MODE_ENV: mode, **isa,
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])})
    root.mkdir(parents=True, exist_ok=True)
    js = json.dumps
    _esrepro(["prepare-data", "--task", "countdown", "--spec", js({"source": SOURCE, "seed": 0}), "--out", DATA],
             root, env)
    _esrepro(["build-tiny", "--model", "tiny", "--spec", js(MODEL), "--data-spec", js({"source": SOURCE, "seed": 0}),
              "--exclude", f"{DATA}/train.jsonl", f"{DATA}/test.jsonl", "--out", BASE, "--threads", str(threads)],
             root, env)
    _esrepro(["train", "--method", "es", "--task", "countdown", "--model", "tiny", "--model-dir", BASE, "--data-dir",
              DATA, "--spec", js(ES), "--out", RUN, "--threads", str(threads), "--device", "cpu"], root, env)
    _esrepro(["evaluate", "--task", "countdown", "--model", "tiny", "--method", "es", "--model-dir",
              f"{RUN}/checkpoint", "--data-dir", DATA, "--spec", js(EVAL_SPEC), "--out", EVAL,
              "--threads", str(threads), "--device", "cpu"], root, env)
    _esrepro(["table1", "--metrics", f"{EVAL}/metrics.json", "--published", str(REPO / "config/published.yaml"),
              "--registry", str(REPO / "config/models.yaml"), "--models", "tiny", "--out", TABLE], root, env)
    return root


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights(root: Path) -> tuple[str, str]:
    """sha256 of the built model's and the ES run's weights."""
    return sha(root / BASE / "model.safetensors"), sha(root / RUN / "checkpoint" / "model.safetensors")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same jobs in portable numerics under the machine's own and the AVX2-capped setting (2 threads there)."""
    top = tmp_path_factory.mktemp("numerics")
    return {"portable": make_tree(top / "portable", "portable", {}),
            "portable_avx2": make_tree(top / "portable_avx2", "portable", AVX2, threads=2)}


def _manifest(root: Path, rel: str) -> dict:
    return json.loads((root / rel / "manifest.json").read_text())


@pytest.mark.slow
def test_portable_numerics_give_the_same_weights_under_two_instruction_sets(trees):
    assert weights(trees["portable"]) == weights(trees["portable_avx2"])
    for tree in trees.values():
        for rel in (DATA, BASE, RUN, EVAL):
            rec = _manifest(tree, rel)["numerics"]
            assert rec["mode"] == "portable" and rec["cpu_capability"] == "DEFAULT"
            assert rec["env"]["MKL_CBWR"] == "COMPATIBLE"


@pytest.mark.slow
def test_compare_finds_identical_portable_trees(trees, capsys):
    result = compare(trees["portable_avx2"], trees["portable"])
    assert result.ok and not result.diffs, result.format()
    assert main_compare(str(trees["portable"]), str(trees["portable_avx2"])) == 0
    assert "compare ok" in capsys.readouterr().out


@pytest.mark.slow
def test_native_numerics_differ_and_compare_names_the_model_build(trees, tmp_path, capsys):
    """Without the settings the two instruction sets part at the model's build (on a CPU with AVX-512)."""
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("the AVX2 cap changes nothing on a CPU without AVX-512")
    native = make_tree(tmp_path / "native_avx2", "native", AVX2)
    assert weights(native)[0] != weights(trees["portable"])[0]
    result = compare(native, trees["portable"])
    firsts = result.first_differences()
    assert [f.manifest for f in firsts if not isinstance(f, str)] == [f"{BASE}/manifest.json"], result.format()
    build = firsts[0]
    assert build.stage == "model build" and build.outputs == ["model"]
    assert any(w.startswith("numerics.cpu_capability: 'DEFAULT' (golden) vs 'AVX2' (here)") for w in build.why)
    assert f"{DATA}/manifest.json" in result.same  # the data do not depend on the instruction set
    run = result.diffs[f"{RUN}/manifest.json"]
    assert run.stage == "run" and run.origins == [f"{BASE}/manifest.json"]
    assert main_compare(str(trees["portable"]), str(native)) == 1
    out = capsys.readouterr().out
    assert f"model build: [build_tiny] {BASE}/manifest.json: model" in out


@pytest.mark.slow
def test_compare_reports_a_changed_table_cell_and_a_missing_step(trees, tmp_path):
    """A golden tree whose table was edited by hand: the table step is its own origin, the cell is named."""
    import shutil

    if not (trees["portable"] / f"{TABLE}.csv").exists():
        pytest.skip("no table")
    here = shutil.copytree(trees["portable"], tmp_path / "here")
    csv_path = here / f"{TABLE}.csv"
    lines = csv_path.read_text().splitlines()
    assert len(lines) > 1
    cells = lines[1].split(",")
    cells[-1] = cells[-1] + "9"
    lines[1] = ",".join(cells)
    csv_path.write_text("\n".join(lines) + "\n")
    m = json.loads((here / f"{TABLE}.manifest.json").read_text())
    m["outputs"]["table1_countdown.csv"]["sha256"] = sha(csv_path)
    (here / f"{TABLE}.manifest.json").write_text(json.dumps(m))
    shutil.rmtree(here / EVAL)
    result = compare(here, trees["portable"])
    table = result.diffs[f"{TABLE}.manifest.json"]
    assert table.stage == "report" and table.cells and "(golden) vs" in table.cells[0]
    assert result.diffs[f"{EVAL}/manifest.json"].presence == "missing" and not result.ok


def test_numerics_modes_and_environment():
    assert numerics.mode_for("tiny") == "portable" and numerics.mode_for("paper") == "native"
    env = {"ATEN_CPU_CAPABILITY": "avx2"}
    assert numerics.set_scale("paper", env) == "native" and env == {"ATEN_CPU_CAPABILITY": "avx2",
                                                                     numerics.MODE_ENV: "native"}
    env = {"ATEN_CPU_CAPABILITY": "avx2"}
    assert numerics.set_scale("tiny", env) == "portable" and env == {numerics.MODE_ENV: "portable", **numerics.PORTABLE}
    assert not numerics.apply({numerics.MODE_ENV: "native"})
    env = {numerics.MODE_ENV: "portable", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert numerics.apply(env) and env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE"
    with pytest.raises(ValueError, match="ESREPRO_NUMERICS"):
        numerics.mode({numerics.MODE_ENV: "fast"})


def test_a_tables_renderings_are_compared_through_its_csv(tmp_path):
    """Measured wall times (the ESSA summary's training seconds) are left out of a table's comparison, and its
    Markdown and LaTeX, which print them, follow the CSV beside them; a changed number still differs."""
    from esrepro.provenance.golden import same_content

    here, gold = tmp_path / "here", tmp_path / "gold"
    for root, seconds, acc in ((here, 12.9, 0.5), (gold, 13.4, 0.5)):
        root.mkdir()
        (root / "t.csv").write_text(f"run,accuracy,train_seconds\nref,{acc},{seconds}\n")
        (root / "t.md").write_text(f"| run | accuracy | train_seconds |\n| ref | {acc} | {seconds} |\n")
    assert same_content(here / "t.csv", gold / "t.csv") and same_content(here / "t.md", gold / "t.md")
    (here / "t.csv").write_text("run,accuracy,train_seconds\nref,0.6,12.9\n")
    assert not same_content(here / "t.csv", gold / "t.csv") and not same_content(here / "t.md", gold / "t.md")
    (here / "t.csv").unlink()  # no CSV beside it: the Markdown alone, which differs
    assert not same_content(here / "t.md", gold / "t.md")
