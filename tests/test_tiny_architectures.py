"""The tiny path on other architectures: a registry build naming a ``model_type`` (and its ``options``) is built
by the real build step (tokenizer, model, warm-start SFT), trained by ES on Countdown and evaluated, as the tiny
default's Qwen2 is; a build naming an architecture that is not a causal LM is refused before any job."""

from __future__ import annotations

import copy
import json

import pytest

from esrepro.config import ConfigError
from esrepro.planning.load import load_pipeline
from families import FAMILIES
from model_folders import esrepro, run_config, write_registry
from test_numerics import ES, EVAL_SPEC, MODEL, SOURCE

DATA, BASE, RUN = "data/prepared/countdown", "results/models/tiny/base", "results/runs/countdown/tiny/es/seed0"
EVAL = "results/eval/countdown/tiny/es/seed0/test"
#: Two layers of two 32-wide heads (vLLM's CPU attention needs at least 32), one key/value head.
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 512}


def build_spec(model_type: str) -> dict:
    """test_numerics' short build with ``model_type``'s architecture (tests/families.py's options)."""
    spec = copy.deepcopy(MODEL)
    spec["build"]["architecture"] = {**SHAPE, "model_type": model_type, "options": dict(FAMILIES[model_type])}
    return spec


def _ok(proc) -> None:
    assert proc.returncode == 0, f"{proc.args[3:5]}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("model_type", ["qwen3", "mistral"])
@pytest.mark.slow
def test_a_tiny_build_of_another_family_trains_by_es_and_evaluates(model_type, tmp_path):
    js = json.dumps
    spec = build_spec(model_type)
    _ok(esrepro(["prepare-data", "--task", "countdown", "--spec", js({"source": SOURCE, "seed": 0}), "--out", DATA],
                tmp_path))
    _ok(esrepro(["build-tiny", "--model", "tiny", "--spec", js(spec), "--data-spec", js({"source": SOURCE, "seed": 0}),
                 "--exclude", f"{DATA}/train.jsonl", f"{DATA}/test.jsonl", "--out", BASE], tmp_path))
    config = json.loads((tmp_path / BASE / "config.json").read_text())
    assert config["model_type"] == model_type and config["head_dim"] == 32
    assert config["tie_word_embeddings"] is FAMILIES[model_type]["tie_word_embeddings"]
    manifest = json.loads((tmp_path / BASE / "manifest.json").read_text())
    assert manifest["settings"]["build"]["architecture"]["model_type"] == model_type

    _ok(esrepro(["train", "--method", "es", "--task", "countdown", "--model", "tiny", "--model-dir", BASE,
                 "--data-dir", DATA, "--spec", js(ES), "--out", RUN, "--device", "cpu"], tmp_path))
    log = [json.loads(line) for line in (tmp_path / RUN / "log.jsonl").open()]
    assert len(log) == ES["iterations"] and all(len(row["rewards"]) == ES["population"] for row in log)
    trained = json.loads((tmp_path / RUN / "checkpoint" / "config.json").read_text())
    assert trained["model_type"] == model_type
    _ok(esrepro(["evaluate", "--task", "countdown", "--model", "tiny", "--method", "es", "--model-dir",
                 f"{RUN}/checkpoint", "--data-dir", DATA, "--spec", js(EVAL_SPEC), "--out", EVAL, "--device", "cpu"],
                tmp_path))
    metrics = json.loads((tmp_path / EVAL / "metrics.json").read_text())
    assert metrics["n"] == EVAL_SPEC["limit"] and 0.0 <= metrics["accuracy"] <= 1.0


def test_a_build_of_another_family_validates(tmp_path):
    build = build_spec("qwen3")
    write_registry(tmp_path / "config/models.yaml", {"tiny3": {"build": build["build"]}})
    assert load_pipeline(run_config("config/models.yaml", "tiny3"), "run.yaml", root=tmp_path).model("tiny3")


@pytest.mark.parametrize("model_type, expected", [
    ("bert", "model_type 'bert' is an encoder"),
    ("qwen-nonesuch", "model_type 'qwen-nonesuch' is not an architecture transformers"),
])
def test_a_build_that_is_not_a_causal_lm_is_refused_before_any_job(model_type, expected, tmp_path):
    build = copy.deepcopy(MODEL)["build"]
    build["architecture"]["model_type"] = model_type
    write_registry(tmp_path / "config/models.yaml", {"enc": {"build": build}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(run_config("config/models.yaml", "enc"), "run.yaml", root=tmp_path)
    assert any(p.startswith(f"config/models.yaml: models.enc.build.architecture.model_type: {expected}")
               for p in err.value.problems), err.value.problems
