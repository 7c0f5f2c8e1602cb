"""Pinned builds: the tiny default copies its shipped models, checked file by file, instead of building them, and
`verify_models` rebuilds them from scratch and compares.

A short build (test_numerics' spec) is pinned, copied, tampered with and rebuilt; the last test rebuilds the two
models config/models.yaml pins, through Snakemake as a user runs it, and requires their sha256.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo
from esrepro.models import pinned as pins
from esrepro.planning import preflight
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import Plan
from esrepro.provenance.manifest import IntegrityError, sha256_tree
from esrepro.settings.registry import ModelEntry
from esrepro.steps.data import prepare_data
from esrepro.steps.models import build_tiny, pin_model, verify_build
from test_numerics import MODEL, SOURCE

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Prepared Countdown data, a model built from scratch and its pin, in one folder (the working directory of the
    steps, as Snakemake's is the repository)."""
    root = tmp_path_factory.mktemp("pins")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        prepare_data("countdown", {"source": SOURCE, "seed": 0}, "data/prepared/countdown")
        exclude = ["data/prepared/countdown/train.jsonl", "data/prepared/countdown/test.jsonl"]
        build_tiny("tiny", MODEL, {"source": SOURCE, "seed": 0}, exclude, "results/models/tiny/base")
        pin_model("tiny", "results/models/tiny/base", "data/pinned/tiny")
    finally:
        os.chdir(cwd)
    digest = sha256_tree(root / "results/models/tiny/base")
    return {"root": root, "exclude": exclude, "pinned": {"path": "data/pinned/tiny", "sha256": digest}}


def _in(root: Path, func, *args, **kwargs):
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return func(*args, **kwargs)
    finally:
        os.chdir(cwd)


def test_a_pinned_build_is_copied_with_the_built_models_sha256(built, capsys):
    root = built["root"]
    _in(root, build_tiny, "tiny", MODEL, {"source": SOURCE, "seed": 0}, built["exclude"], "copy/base",
        pinned=built["pinned"])
    assert "copied the pinned build data/pinned/tiny" in capsys.readouterr().out
    assert sha256_tree(root / "copy/base") == built["pinned"]["sha256"]
    manifest = json.loads((root / "copy/base/manifest.json").read_text())
    built_manifest = json.loads((root / "results/models/tiny/base/manifest.json").read_text())
    assert manifest["outputs"]["model"]["sha256"] == built_manifest["outputs"]["model"]["sha256"]
    assert manifest["pinned"] == built["pinned"] and manifest["inputs"]["pinned"]["path"] == "data/pinned/tiny"
    assert manifest["summary"] == built_manifest["summary"]
    assert not (root / "copy/base" / pins.BUILT_FROM).exists()


def test_a_pin_built_from_other_settings_is_not_used(built, capsys):
    """Another warm-start length: the pin's record differs, so the step builds, and says which setting differs."""
    other = json.loads(json.dumps(MODEL))
    other["build"]["sft"]["problems"] = 64
    _in(built["root"], build_tiny, "tiny", other, {"source": SOURCE, "seed": 0}, built["exclude"], "other/base",
        pinned=built["pinned"])
    out = capsys.readouterr().out
    assert "was built from other inputs (build.sft.problems: 64 here, 96 in the pin); building" in out
    manifest = json.loads((built["root"] / "other/base/manifest.json").read_text())
    assert "pinned" not in manifest and manifest["summary"]["sft_problems"] == 64


def test_a_changed_file_in_the_pin_stops_the_copy_naming_it(built, tmp_path):
    root = built["root"]
    bad = tmp_path / "pin"
    pins.write_pinned(root / "results/models/tiny/base", bad, pins.read_pin(root / "data/pinned/tiny"))
    config = json.loads((bad / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(IntegrityError, match=r"config\.json differ"):
        _in(root, build_tiny, "tiny", MODEL, {"source": SOURCE, "seed": 0}, built["exclude"], "bad/base",
            pinned={"path": str(bad), "sha256": built["pinned"]["sha256"]})
    assert not (root / "bad/base").exists()  # nothing half-written
    with pytest.raises(IntegrityError, match="the registry's pinned.sha256 is 0+"):
        _in(root, build_tiny, "tiny", MODEL, {"source": SOURCE, "seed": 0}, built["exclude"], "bad/base",
            pinned={"path": "data/pinned/tiny", "sha256": "0" * 64})
    assert not (root / "bad/base").exists()


def test_verify_build_rebuilds_equal_and_names_a_file_that_differs(built, tmp_path, capsys):
    root = built["root"]
    args = ("tiny", MODEL, {"source": SOURCE, "seed": 0}, built["exclude"])
    assert _in(root, verify_build, *args, pinned=built["pinned"], out=str(tmp_path / "same.json")) == 0
    assert json.loads((tmp_path / "same.json").read_text())["same"] is True
    # a pin whose weights were changed by a later build (its record rewritten to match): the rebuild names the file
    drifted = tmp_path / "drifted"
    pins.write_pinned(root / "results/models/tiny/base", drifted, pins.read_pin(root / "data/pinned/tiny"))
    data = bytearray((drifted / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (drifted / "model.safetensors").write_bytes(bytes(data))
    record = pins.read_pin(drifted)
    record["files"]["model.safetensors"] = pins.model_files(drifted)["model.safetensors"]
    (drifted / pins.BUILT_FROM).write_text(json.dumps(record))
    status = _in(root, verify_build, *args, pinned={"path": str(drifted), "sha256": sha256_tree(drifted)},
                 out=str(tmp_path / "differ.json"))
    assert status == 1 and "files: model.safetensors;" in capsys.readouterr().out
    report = json.loads((tmp_path / "differ.json").read_text())
    assert report["same"] is False and report["files_differ"] == ["model.safetensors"]


def test_pinned_needs_a_built_model_and_a_sha256():
    entry = {"display": "x", "dtype": "float32", "resources": {"default": {}}}
    with pytest.raises(ValueError, match="pinned applies to a locally built model"):
        ModelEntry(**entry, hub_id="a/b", revision="main", config={"model_type": "qwen2"},
                   pinned={"path": "p", "sha256": "a" * 64})
    with pytest.raises(ValueError, match="sha256"):
        ModelEntry(**entry, build=MODEL["build"], pinned={"path": "p", "sha256": "abc"})


@pytest.mark.slow
def test_the_registrys_pinned_models_rebuild_to_their_pins(tmp_path):
    """Both models the embedded default copies, rebuilt from scratch as `make verify-models` runs it."""
    registry = yaml.safe_load((REPO / "config/models.yaml").read_text())["models"]
    pinned = {k: e["pinned"] for k, e in registry.items() if e.get("pinned")}
    assert set(pinned) == {"tiny", "tiny-v2"}
    repo = copy_repo(tmp_path)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/default",
                           "verify_models"], cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for model, pin in pinned.items():
        report = json.loads((repo / f"results/models/{model}/rebuild.json").read_text())
        assert report["same"] is True and report["rebuilt_sha256"] == pin["sha256"], report


def test_a_missing_pin_stops_the_build_before_any_job(tmp_path):
    p = load_pipeline(yaml.safe_load((REPO / "config/config.yaml").read_text()), "config/config.yaml", root=REPO)
    plan = Plan(p)
    assert preflight.pinned_problems(p, plan, REPO) == []
    problems = preflight.pinned_problems(p, plan, tmp_path)  # a checkout without data/pinned
    assert [sorted(x.jobs) for x in problems] == [[("build_tiny", "tiny")], [("build_tiny", "tiny-v2")]]
    assert "models.tiny.pinned.path: data/pinned/tiny is not a pinned build" in problems[0].text
    assert preflight.pinned_problems(p, plan, tmp_path, jobs={("evaluate", "countdown")}) == []
