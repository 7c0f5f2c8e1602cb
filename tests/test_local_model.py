"""A model folder on disk as a registry model (``path``): its base folder links the folder's files, the manifest
records each file's sha256, a job reading the model stops naming the entry and the file that changed, and a folder
that is not a causal LM transformers can load is refused before any job. The last test runs it through Snakemake:
ES on Countdown and its evaluation."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo
from esrepro.config import ConfigError
from esrepro.planning.load import load_pipeline
from esrepro.provenance.manifest import IntegrityError, verify_inputs
from esrepro.steps.models import local_model
from model_folders import CPU, bert_dir, causal_dir, esrepro, run_config, write_registry

BIN = Path(sys.executable).parent


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal LM folder, plus what the pipeline does not load: a subfolder and PyTorch weights."""
    path = causal_dir(tmp_path_factory.mktemp("local") / "my-model")
    (path / "original").mkdir()
    (path / "original" / "consolidated.00.pth").write_bytes(b"not loaded")
    (path / "pytorch_model.bin").write_bytes(b"not loaded either: safetensors are here")
    (path / "README.md").write_text("a model card")
    return path


def _link(folder: Path, work: Path, model: str = "mine") -> Path:
    """The local_model step in ``work`` (a job's working directory is the repository); the base folder, relative."""
    with contextlib.chdir(work):
        local_model(model, {"display": model, "dtype": "float32", "path": str(folder)}, f"results/models/{model}/base")
    return Path(f"results/models/{model}/base")


def test_the_base_folder_links_each_model_file_and_the_manifest_records_its_sha256(folder, tmp_path):
    from esrepro.models.loading import load_model, load_tokenizer

    base = tmp_path / _link(folder, tmp_path)
    loaded = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert {p.name for p in base.iterdir()} == loaded | {"manifest.json"}
    for name in loaded:  # links, no copies
        assert (base / name).is_symlink() and (base / name).resolve() == (folder / name).resolve()
    manifest = json.loads((base / "manifest.json").read_text())
    assert manifest["kind"] == "local_model" and manifest["settings"]["model"] == "mine"
    assert manifest["resolved"]["path"] == str(folder)
    assert manifest["resolved"]["files"] == {name: sha(folder / name) for name in loaded}
    assert manifest["outputs"]["model"]["files"] == manifest["resolved"]["files"]
    # what a job records of its input is the folder's content, checked against the manifest
    with contextlib.chdir(tmp_path):
        record = verify_inputs({"base_model": "results/models/mine/base"})["base_model"]
    assert record["sha256"] == manifest["outputs"]["model"]["sha256"] == manifest["resolved"]["sha256"]
    assert "verified_against" in record
    assert type(load_model(base)).__name__ == "Qwen2ForCausalLM" and len(load_tokenizer(base)) == 302


def test_a_changed_or_missing_file_stops_a_job_naming_the_entry_and_the_file(folder, tmp_path):
    own = tmp_path / "copy"
    shutil.copytree(folder, own)
    base = _link(own, tmp_path)
    original = (own / "tokenizer.json").read_bytes()
    with contextlib.chdir(tmp_path):
        (own / "tokenizer.json").write_bytes(original + b" ")
        with pytest.raises(IntegrityError) as err:
            verify_inputs({"base_model": base})
        text = str(err.value)
        assert text.startswith(f"model 'mine': the folder {own} (its registry path) changed since {base}")
        assert f"{own / 'tokenizer.json'} changed (sha256 {sha(own / 'tokenizer.json')}" in text
        assert "model.safetensors" not in text  # only the file that changed
        (own / "tokenizer.json").write_bytes(original)
        verify_inputs({"base_model": base})  # restored: the job runs
        (own / "model.safetensors").unlink()
        with pytest.raises(IntegrityError, match=r"model 'mine': .*model\.safetensors is missing"):
            verify_inputs({"base_model": base})
        shutil.rmtree(base)  # removing the base folder (as Snakemake does before a rerun) removes links only
    assert (own / "tokenizer.json").read_bytes() == original


def test_linking_a_folder_without_weights_writes_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^the registry: models\.mine\.path: .*empty holds no weights"):
        _link(empty, tmp_path)
    assert not (tmp_path / "results/models/mine/base").exists()


# ------------------------------------------------------------------ checked before any job


def _pipeline(tmp_path: Path, entries: dict, model: str):
    write_registry(tmp_path / "config" / "models.yaml", entries)
    return load_pipeline(run_config("config/models.yaml", model), "run.yaml", root=tmp_path)


def _problems(tmp_path: Path, entries: dict, model: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        _pipeline(tmp_path, entries, model)
    return err.value.problems


def test_a_causal_lm_folder_validates_with_or_without_its_config_stated(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text())
    p = _pipeline(tmp_path, {"a": {"path": str(folder)}, "b": {"path": str(folder), "config": config}}, "a")
    assert p.model("a").path == str(folder) and p.local_models() == ["a", "b"]
    _pipeline(tmp_path, {"b": {"path": str(folder), "config": config}}, "b")


def test_a_stated_config_that_differs_from_the_folders_names_each_field(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text())
    stated = {**config, "hidden_size": 64, "num_hidden_layers": 3}
    problems = _problems(tmp_path, {"mine": {"path": str(folder), "config": stated}}, "mine")
    assert len(problems) == 2
    assert problems[0].startswith("config/models.yaml: models.mine.config.hidden_size: stated 64, the model's "
                                  f"config.json has 32 ({folder / 'config.json'})")
    assert problems[1].startswith("config/models.yaml: models.mine.config.num_hidden_layers: stated 3")


def test_folders_that_are_not_a_causal_lm_are_refused_naming_the_entry(folder, tmp_path):
    no_config = tmp_path / "no-config"
    shutil.copytree(folder, no_config)
    (no_config / "config.json").unlink()
    unknown = tmp_path / "unknown-type"
    shutil.copytree(folder, unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "qwen-nonesuch"}))
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(folder, no_tokenizer)
    (no_tokenizer / "tokenizer_config.json").unlink()
    bert = bert_dir(tmp_path / "bert")
    cases = {
        "a": (no_config, f"models.a.path: no config.json in {no_config}"),
        "b": (unknown, f"models.b.path: {unknown / 'config.json'}: model_type: model_type 'qwen-nonesuch' is not "
                       "an architecture transformers"),
        "c": (no_tokenizer, f"models.c.path: {no_tokenizer} has no tokenizer (tokenizer_config.json)"),
        "d": (bert, f"models.d.path: {bert / 'config.json'}: model_type: model_type 'bert' is an encoder"),
        "e": (tmp_path / "nowhere", f"models.e.path: {tmp_path / 'nowhere'} is not a folder"),
    }
    for key, (path, expected) in cases.items():
        problems = _problems(tmp_path, {key: {"path": str(path)}}, key)
        assert any(p.startswith(f"config/models.yaml: {expected}") for p in problems), (key, problems)


def test_a_hub_entrys_config_must_build_a_causal_lm_in_transformers(tmp_path):
    qwen = json.loads((REPO / "config" / "model_configs" / "qwen2.5-0.5b-instruct.json").read_text())
    hub = {"hub_id": "Org/model", "revision": "main"}
    _pipeline(tmp_path, {"q": {**hub, "config": qwen}}, "q")
    cases = {
        "q": ({**qwen, "model_type": "nonesuch"}, "models.q.config.model_type: model_type 'nonesuch' is not an "
                                                  "architecture transformers"),
        "r": ({**qwen, "hidden_size": "wide"}, "models.r.config.hidden_size: transformers refuses it"),
        "s": ({**qwen, "architectures": ["Qwen2ForSequenceClassification"]},
              "models.s.config.architectures: architectures ['Qwen2ForSequenceClassification'] names no causal LM"),
        "t": ({"model_type": "t5"}, "models.t.config.model_type: model_type 't5' is an encoder-decoder model"),
    }
    for key, (config, expected) in cases.items():
        problems = _problems(tmp_path, {key: {**hub, "config": config}}, key)
        assert any(p.startswith(f"config/models.yaml: {expected}") for p in problems), (key, problems)


# ------------------------------------------------------------------ through Snakemake

TARGETS = ["results/eval/countdown/mine/es/seed0/test/metrics.json",
           "results/eval/countdown/mine/base/seed0/test/metrics.json"]


def _snakemake(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/default",
                           "--configfile", "small.yaml", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_path_entry_trains_es_and_is_evaluated_then_a_changed_file_stops_its_jobs(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    folder = causal_dir(tmp_path / "my-model")
    shutil.copy(repo / "config" / "models.yaml", repo / "config" / "small_models.yaml")
    added = esrepro(["add-model", "mine", "--from-dir", str(folder), "--registry", "config/small_models.yaml"], repo)
    assert added.returncode == 0, added.stderr
    entry = yaml.safe_load((repo / "config" / "small_models.yaml").read_text())["models"]["mine"]
    assert entry["path"] == str(folder) and entry["resources"] == CPU
    config = run_config("config/small_models.yaml", "mine")
    config["published"] = "config/published.yaml"
    (repo / "small.yaml").write_text(yaml.safe_dump(config))

    proc = _snakemake(["--", *TARGETS], repo)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    base = repo / "results/models/mine/base"
    manifest = json.loads((base / "manifest.json").read_text())
    files = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert manifest["resolved"]["files"] == {f: sha(folder / f) for f in files}
    assert all((base / f).is_symlink() for f in files)
    log = [json.loads(line) for line in (repo / "results/runs/countdown/mine/es/seed0/log.jsonl").open()]
    assert len(log) == 2
    train = json.loads((repo / "results/runs/countdown/mine/es/seed0/manifest.json").read_text())
    assert train["inputs"]["base_model"]["sha256"] == manifest["outputs"]["model"]["sha256"]
    for target in TARGETS:
        assert json.loads((repo / target).read_text())["n"] == 10

    weights = bytearray((folder / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # one bit of the weights' last byte
    (folder / "model.safetensors").write_bytes(bytes(weights))
    proc = _snakemake(["--forcerun", TARGETS[1], "--", TARGETS[1]], repo)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"model 'mine': the folder {folder} (its registry path) changed" in out
    assert f"{folder / 'model.safetensors'} changed (sha256 {sha(folder / 'model.safetensors')}" in out


@pytest.mark.vllm
def test_a_linked_base_folder_loads_in_vllm_and_generates_as_the_folder_does(tmp_path):
    """vLLM's CPU build reads the links as the files: the ES vLLM engine on the base folder holds the folder's
    weights (the transformers engine's checksum on the folder itself) and generates its greedy tokens (a Qwen3 of
    32-wide heads, the smallest vLLM's CPU attention runs)."""
    pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")
    from esrepro.backends.hf import HFEngine
    from esrepro.backends.vllm_engine import VLLMEngine
    from families import make_family_dir

    folder = make_family_dir(tmp_path / "qwen3", "qwen3")
    base = tmp_path / _link(folder, tmp_path)
    assert all(p.is_symlink() for p in base.iterdir() if p.name != "manifest.json")
    prompts = ["Using the numbers [3 4], make 7.", "Using the numbers [5 9], make 14."]
    linked = VLLMEngine(base, dtype="float32", device="cpu", kv_cache_memory_bytes=32 * 2**20)
    own = HFEngine(folder, dtype="float32")
    assert linked.checksum() == own.checksum()
    assert linked.generate(prompts, 8) == own.generate(prompts, 8)
