"""Audit of a synthetic manifest chain: table -> eval -> train -> base model / prepared data / config."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

import esrepro.provenance.audit as audit_mod
from esrepro.io import write_json, write_jsonl, write_text
from esrepro.provenance.audit import AuditError, audit
from esrepro.provenance.manifest import build_manifest, now
from esrepro.steps.provenance import main_audit

DATA = "data/prepared/countdown"
BASE = "results/models/tiny/base"
RUN = "results/runs/countdown/tiny/es/seed0"
CKPT = f"{RUN}/checkpoint"
EVAL_ES = "results/eval/countdown/tiny/es/seed0/test"
EVAL_BASE = "results/eval/countdown/tiny/base/seed0/test"
TABLE = "results/tables/table1_countdown"
FIGURE = "results/figures/countdown_curves"


def _build_chain() -> None:
    """Write the mini pipeline into the current directory, manifests as cli.py writes them."""
    t = now()
    write_jsonl(f"{DATA}/train.jsonl", [{"numbers": [1, 2], "target": 3}])
    write_jsonl(f"{DATA}/test.jsonl", [{"numbers": [2, 2], "target": 4}])
    write_json(f"{DATA}/manifest.json", build_manifest(
        "prepare_data", {}, {"task": "countdown", "seed": 0}, t,
        outputs={"train.jsonl": f"{DATA}/train.jsonl", "test.jsonl": f"{DATA}/test.jsonl"}))

    write_json(f"{BASE}/config.json", {"hidden_size": 8})
    write_text(f"{BASE}/model.safetensors", "base-weights")
    write_text(f"{BASE}/tokenizer/vocab.txt", "a\nb\n")
    write_json(f"{BASE}/manifest.json", build_manifest(
        "build_tiny", {"excluded_test": f"{DATA}/test.jsonl"}, {"model": "tiny"}, t, outputs={"model": BASE}))

    write_json(f"{CKPT}/config.json", {"hidden_size": 8})
    write_text(f"{CKPT}/model.safetensors", "trained-weights")
    write_jsonl(f"{RUN}/log.jsonl", [{"iteration": 0, "reward": 0.1}, {"iteration": 1, "reward": 0.2}])
    write_json(f"{RUN}/manifest.json", build_manifest(
        "train", {"base_model": BASE, "train_data": Path(DATA) / "train.jsonl"},
        {"method": "es", "task": "countdown", "model": "tiny"}, t,
        outputs={"checkpoint": Path(RUN) / "checkpoint", "log": Path(RUN) / "log.jsonl"}, extra={"seed": 0}))

    for out, model, method in ((EVAL_ES, CKPT, "es"), (EVAL_BASE, BASE, "base")):
        labels = {"task": "countdown", "split": "test", "model": "tiny", "method": method, "seed": 0}
        write_jsonl(f"{out}/responses.jsonl", [{"response": "2 + 2"}])
        write_json(f"{out}/metrics.json", {**labels, "accuracy": 0.5})
        write_json(f"{out}/manifest.json", build_manifest(
            "evaluate", {"model": model, "data": Path(DATA) / "test.jsonl"}, labels, t,
            outputs={"metrics": f"{out}/metrics.json", "responses": f"{out}/responses.jsonl"}))

    write_text("config/models.yaml", "tiny:\n  family: qwen2\n")
    write_text("config/published.yaml", "countdown: {}\n")
    for ext in (".csv", ".md", ".tex"):
        write_text(f"{TABLE}{ext}", f"table {ext}\n")
    metrics = [f"{EVAL_ES}/metrics.json", f"{EVAL_BASE}/metrics.json"]
    write_json(f"{TABLE}.manifest.json", build_manifest(
        "table1", {**{m: m for m in metrics}, "published": "config/published.yaml", "registry": "config/models.yaml"},
        {"task": "countdown", "split": "test"}, t,
        outputs={f"table1_countdown{e}": f"{TABLE}{e}" for e in (".csv", ".md", ".tex")}))

    write_text(f"{FIGURE}.png", "png")
    write_json(f"{FIGURE}.manifest.json", build_manifest(
        "curves", {f"{RUN}/log.jsonl": f"{RUN}/log.jsonl"}, {"labels": ["es"]}, t,
        outputs={"countdown_curves.png": f"{FIGURE}.png"}))


@pytest.fixture(scope="module")
def _template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("chain")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(src)
        _build_chain()
    return src


@pytest.fixture
def chain(_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of the mini chain; the working directory is its root, as in the pipeline."""
    root = tmp_path / "repo"
    shutil.copytree(_template, root)
    monkeypatch.chdir(root)
    return root


def _poke(path: str) -> None:
    p = Path(path)
    data = bytearray(p.read_bytes())
    data[0] ^= 1
    p.write_bytes(bytes(data))


def test_intact_table_passes_and_lists_whole_chain(chain: Path) -> None:
    report = audit(f"{TABLE}.csv")
    assert report.ok and report.first_failure is None
    steps = [s.manifest for s in report.steps]
    assert steps == [
        f"{TABLE}.manifest.json", f"{EVAL_BASE}/manifest.json", f"{DATA}/manifest.json",
        f"{BASE}/manifest.json", f"{EVAL_ES}/manifest.json", f"{RUN}/manifest.json",
    ]  # inputs are walked in the manifest's (key-sorted) order, depth-first
    assert [s.kind for s in report.steps] == ["table1", "evaluate", "prepare_data", "build_tiny", "evaluate", "train"]
    train = report.steps[5]
    assert train.summary == {"task": "countdown", "model": "tiny", "method": "es", "seed": 0}
    checked = {f.path for f in report.files}
    assert {f"{TABLE}.csv", CKPT, BASE, f"{DATA}/train.jsonl", f"{DATA}/test.jsonl",
            "config/models.yaml", "config/published.yaml"} <= checked
    assert f"{TABLE}.md" not in checked  # siblings the target does not depend on are not checked
    sources = {f.path for f in report.files if f.source}
    assert sources == {"config/models.yaml", "config/published.yaml"}
    text = report.format()
    for s in steps:
        assert s in text
    assert "[prepare_data]" in text and "[build_tiny]" in text and "code " in text
    assert "source: no producer manifest" in text
    assert text.rstrip().endswith("all ok")


@pytest.mark.parametrize("path, recorded_as", [
    (f"{DATA}/train.jsonl", f"{DATA}/train.jsonl"),
    (f"{DATA}/test.jsonl", f"{DATA}/test.jsonl"),
    (f"{CKPT}/model.safetensors", CKPT),  # only the directory's hash is recorded
    (f"{BASE}/tokenizer/vocab.txt", BASE),
    (f"{TABLE}.csv", f"{TABLE}.csv"),
    ("config/models.yaml", "config/models.yaml"),
])
def test_changed_byte_is_first_failure(chain: Path, path: str, recorded_as: str) -> None:
    _poke(path)
    report = audit(f"{TABLE}.csv")
    assert not report.ok
    bad = report.first_failure
    assert bad is not None and bad.path == recorded_as and bad.status == "changed"
    assert bad.actual is not None and bad.actual != bad.recorded
    assert "CHANGED" in report.format()


@pytest.mark.parametrize("path, recorded_as, status", [
    (f"{DATA}/train.jsonl", f"{DATA}/train.jsonl", "missing"),
    (f"{TABLE}.csv", f"{TABLE}.csv", "missing"),
    (CKPT, CKPT, "missing"),
    (f"{CKPT}/config.json", CKPT, "changed"),
    (f"{EVAL_BASE}/metrics.json", f"{EVAL_BASE}/metrics.json", "missing"),
])
def test_deleted_file_is_named(chain: Path, path: str, recorded_as: str, status: str) -> None:
    p = Path(path)
    shutil.rmtree(p) if p.is_dir() else p.unlink()
    bad = audit(f"{TABLE}.csv").first_failure
    assert bad is not None and (bad.path, bad.status) == (recorded_as, status)


def test_main_audit_exit_status_and_last_line(chain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_audit(f"{TABLE}.csv") == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"audit ok: {TABLE}.csv"

    _poke("config/models.yaml")
    assert main_audit(f"{TABLE}.csv") == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("audit FAILED: config/models.yaml changed (recorded ")
    assert ", now " in last
    _poke("config/models.yaml")  # flip the byte back

    Path(f"{DATA}/train.jsonl").unlink()
    assert main_audit(f"{TABLE}.csv") == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"audit FAILED: {DATA}/train.jsonl is missing"


def test_target_without_producer(chain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_text("results/tables/stray.csv", "x\n")
    with pytest.raises(AuditError, match="no manifest records results/tables/stray.csv as an output"):
        audit("results/tables/stray.csv")
    assert main_audit("config/models.yaml") != 0
    assert "no manifest records config/models.yaml" in capsys.readouterr().out


def test_invalid_manifest_is_named(chain: Path) -> None:
    Path(f"{EVAL_BASE}/manifest.json").write_text("{not json")
    with pytest.raises(AuditError, match=f"{EVAL_BASE}/manifest.json is not valid JSON"):
        audit(f"{TABLE}.csv")


def test_other_targets_and_root(chain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fig = audit(f"{FIGURE}.png")
    assert fig.ok and [s.kind for s in fig.steps] == ["curves", "train", "build_tiny", "prepare_data"]
    inner = audit(f"{CKPT}/model.safetensors")  # a file inside a recorded output directory
    assert inner.ok and inner.steps[0].manifest == f"{RUN}/manifest.json"
    whole = audit(f"{RUN}/manifest.json")  # a manifest itself: all its outputs are checked
    assert {f.path for f in whole.files if f.role == "output" and f.depth == 1} == {CKPT, f"{RUN}/log.jsonl"}
    monkeypatch.chdir(tmp_path)
    assert audit(f"{TABLE}.csv", root=chain).ok
    assert audit(chain / f"{TABLE}.csv", root=chain).ok


def test_each_path_hashed_once(chain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    real = audit_mod.sha256_tree

    def counting(path):  # type: ignore[no-untyped-def]
        calls[str(path)] += 1
        return real(path)

    monkeypatch.setattr(audit_mod, "sha256_tree", counting)
    report = audit(f"{TABLE}.csv")
    assert report.ok and calls and max(calls.values()) == 1
    assert len(report.files) > len(calls)  # test.jsonl is checked against several manifests


def test_consumers_verify_the_producers_hash_and_audit_still_catches_a_change(chain: Path) -> None:
    """A consumer hashes what it reads and checks it against the producer's record, whatever the mtime says."""
    import json
    import os

    from esrepro.provenance.manifest import IntegrityError, input_record

    ev = json.loads(Path(f"{EVAL_ES}/manifest.json").read_text())
    produced = json.loads(Path(f"{RUN}/manifest.json").read_text())["outputs"]["checkpoint"]["sha256"]
    assert ev["inputs"]["model"]["sha256"] == produced
    assert ev["inputs"]["model"]["verified_against"] == f"{RUN}/manifest.json"
    assert input_record(f"{DATA}/test.jsonl")["verified_against"] == f"{DATA}/manifest.json"
    # a byte changed with the modification time kept is refused, naming the file and both hashes
    weights = f"{CKPT}/model.safetensors"
    kept = os.stat(weights)
    _poke(weights)
    os.utime(weights, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    with pytest.raises(IntegrityError, match=f"^{CKPT}: sha256 [0-9a-f]{{64}} does not match {produced} recorded in "):
        input_record(CKPT)
    assert audit(f"{TABLE}.csv").first_failure.path == CKPT
