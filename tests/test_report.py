"""Tests of the report layer: Table 1, the table writers, training-curve figures."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from esrepro.io import write_json, write_jsonl
from esrepro.report.figures import build_countdown_curves, training_curves
from esrepro.report.tables import (
    METHOD_COLUMNS,
    build_table1,
    load_metrics,
    load_published,
    table1,
    write_table,
)

PUBLISHED = Path(__file__).resolve().parents[1] / "config" / "published.yaml"
SEVEN = [
    "qwen2.5-0.5b-instruct",
    "qwen2.5-1.5b-instruct",
    "qwen2.5-3b-instruct",
    "qwen2.5-7b-instruct",
    "llama-3.2-1b-instruct",
    "llama-3.2-3b-instruct",
    "llama-3.1-8b-instruct",
]
MODELS = {
    "tiny": {"display": "Tiny-Test"},
    "qwen2.5-0.5b-instruct": {"display": "Qwen2.5-0.5B-Instruct"},
    "qwen2.5-1.5b-instruct": {"display": "Qwen2.5-1.5B-Instruct"},
    "llama-3.2-1b-instruct": {"display": "Llama-3.2-1B-Instruct"},
}


def _metric(model: str, method: str, seed: int, acc: float, task="countdown", split="test") -> dict:
    return {"task": task, "split": split, "model": model, "method": method, "seed": seed,
            "n": 2000, "accuracy": acc, "mean_reward": acc / 2}


RUNS = [
    _metric("tiny", "base", 0, 0.010),
    _metric("tiny", "es", 0, 0.100),
    _metric("tiny", "es", 1, 0.120),
    _metric("tiny", "es", 2, 0.170),
    _metric("qwen2.5-0.5b-instruct", "es", 0, 0.144),
    _metric("qwen2.5-0.5b-instruct", "grpo8", 0, 0.002),
    _metric("qwen2.5-0.5b-instruct", "grpo8", 1, 0.004),
    _metric("qwen2.5-0.5b-instruct", "es", 0, 0.9, split="val"),  # other split: ignored
    _metric("tiny", "es", 0, 0.9, task="other"),  # other task: ignored
]


@pytest.fixture()
def metric_paths(tmp_path: Path) -> list[Path]:
    paths = []
    for i, rec in enumerate(RUNS):
        p = tmp_path / "metrics" / f"m{i}.json"
        write_json(p, rec)
        paths.append(p)
    return paths


@pytest.fixture()
def published() -> dict:
    return load_published(PUBLISHED)


@pytest.fixture()
def t1(metric_paths: list[Path], published: dict) -> pd.DataFrame:
    return table1(load_metrics(metric_paths), published, MODELS)


# --------------------------------------------------------------------------- published.yaml


def test_published_yaml_has_v2_table1_seven_models_with_seven_numbers(published: dict) -> None:
    """v2 Table 1: Original, PPO-z, GRPO-z (8), GRPO-z (30), GRPO-v, Dr.GRPO-v, ES for seven models."""
    block = published["tables"]["table1_countdown"]
    assert block["provenance"]["arxiv"] == "2509.24372"
    assert (block["provenance"]["version"], block["provenance"]["table"]) == ("v2", "Table 1")
    assert list(block["models"]) == SEVEN
    for key in SEVEN:
        row = block["models"][key]
        assert list(row) == ["base", "ppo", "grpo8", "grpo30", "grpov", "drgrpov", "es"]
        assert all(isinstance(v, float) for v in row.values())
        assert set(row) == set(METHOD_COLUMNS)
    assert block["models"]["qwen2.5-3b-instruct"] == {"base": 10.0, "ppo": 20.1, "grpo8": 30.9, "grpo30": 32.5,
                                                      "grpov": 37.8, "drgrpov": 43.8, "es": 60.5}
    assert block["models"]["llama-3.1-8b-instruct"] == {"base": 8.1, "ppo": 42.8, "grpo8": 49.9, "grpo30": 51.3,
                                                        "grpov": 46.9, "drgrpov": 50.2, "es": 61.2}
    assert "best_rl" not in block  # derived from the RL columns (table1)
    assert list(METHOD_COLUMNS.values()) == ["Original", "PPO-z", "GRPO-z (8)", "GRPO-z (30)", "GRPO-v",
                                             "Dr.GRPO-v", "ES"]  # v2 Table 1's order


# --------------------------------------------------------------------------- table1


def test_table1_rows_and_order(t1: pd.DataFrame) -> None:
    # Registry order, only models with metrics (qwen 1.5b / llama have none).
    assert list(t1.index) == ["tiny", "qwen2.5-0.5b-instruct"]
    assert list(t1["Model"]) == ["Tiny-Test", "Qwen2.5-0.5B-Instruct"]


def test_table1_mean_std_and_blanks(t1: pd.DataFrame) -> None:
    es = [10.0, 12.0, 17.0]
    assert t1.loc["tiny", "ES (ours)"] == pytest.approx(statistics.mean(es))
    assert t1.loc["tiny", "ES (ours) std"] == pytest.approx(statistics.stdev(es))
    assert t1.loc["tiny", "Original (ours)"] == pytest.approx(1.0)
    assert math.isnan(t1.loc["tiny", "Original (ours) std"])  # one seed: no std
    # Other split / task ignored.
    assert t1.loc["qwen2.5-0.5b-instruct", "ES (ours)"] == pytest.approx(14.4)
    assert t1.loc["qwen2.5-0.5b-instruct", "GRPO-z (8) (ours)"] == pytest.approx(0.3)
    assert t1.loc["qwen2.5-0.5b-instruct", "GRPO-z (8) (ours) std"] == pytest.approx(statistics.stdev([0.2, 0.4]))
    # A method with no runs is blank (NaN), not 0.
    for col in ("PPO-z (ours)", "GRPO-z (30) (ours)", "GRPO-v (ours)", "Dr.GRPO-v (ours)"):
        assert t1[col].isna().all()
    assert t1.loc["qwen2.5-0.5b-instruct", "Original (ours)"] != 0
    assert math.isnan(t1.loc["qwen2.5-0.5b-instruct", "Original (ours)"])
    # Numbers stay numeric.
    assert pd.api.types.is_float_dtype(t1["ES (ours)"])
    assert pd.api.types.is_float_dtype(t1["ES (paper)"])


def test_table1_published_columns(t1: pd.DataFrame) -> None:
    q = t1.loc["qwen2.5-0.5b-instruct"]
    assert q["Original (paper)"] == pytest.approx(0.1)
    assert q["PPO-z (paper)"] == pytest.approx(0.3)
    assert q["GRPO-z (30) (paper)"] == pytest.approx(0.5)
    assert q["GRPO-v (paper)"] == pytest.approx(13.0)
    assert q["Dr.GRPO-v (paper)"] == pytest.approx(13.5)
    assert q["ES (paper)"] == pytest.approx(14.4)
    # best RL: the best of the paper's five RL columns
    assert q["Best RL (paper)"] == pytest.approx(13.5)
    assert q["Best RL method (paper)"] == "Dr.GRPO-v"
    # The tiny model is not in the paper: every paper cell blank.
    tiny = t1.loc["tiny"]
    paper_cols = [c for c in t1.columns if c.endswith("(paper)")]
    assert len(paper_cols) == len(METHOD_COLUMNS) + 2
    assert all(pd.isna(tiny[c]) for c in paper_cols)


def test_table1_include_adds_rows_without_runs(metric_paths: list[Path], published: dict) -> None:
    df = table1(load_metrics(metric_paths), published, MODELS, include=["llama-3.2-1b-instruct", "unregistered"])
    assert list(df.index) == ["tiny", "qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct", "unregistered"]
    llama = df.loc["llama-3.2-1b-instruct"]
    assert llama["ES (paper)"] == pytest.approx(16.8)
    assert (llama["Best RL (paper)"], llama["Best RL method (paper)"]) == (14.9, "GRPO-v")
    assert all(pd.isna(llama[f"{label} (ours)"]) for label in METHOD_COLUMNS.values())
    assert df.loc["unregistered", "Model"] == "unregistered"


def test_table1_duplicate_runs_raise(tmp_path: Path, published: dict) -> None:
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"d{i}.json")
        write_json(paths[-1], _metric("tiny", "es", 0, 0.1))
    with pytest.raises(ValueError, match="d1.json"):
        table1(load_metrics(paths), published, MODELS)


def test_table1_empty_metrics(published: dict) -> None:
    df = table1(load_metrics([]), published, MODELS, include=["qwen2.5-1.5b-instruct"])
    assert list(df.index) == ["qwen2.5-1.5b-instruct"]
    assert df.loc["qwen2.5-1.5b-instruct", "ES (paper)"] == pytest.approx(37.3)
    assert math.isnan(df.loc["qwen2.5-1.5b-instruct", "ES (ours)"])


# --------------------------------------------------------------------------- load_metrics


def test_load_metrics_missing_accuracy_names_file(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    bad = tmp_path / "no_accuracy_here.json"
    write_json(good, _metric("tiny", "es", 0, 0.1))
    rec = _metric("tiny", "es", 1, 0.1)
    del rec["accuracy"]
    write_json(bad, rec)
    with pytest.raises(ValueError, match=r"no_accuracy_here\.json.*accuracy"):
        load_metrics([good, bad])


def test_load_metrics_rejects_percent_accuracy(tmp_path: Path) -> None:
    p = tmp_path / "pct.json"
    write_json(p, _metric("tiny", "es", 0, 14.4))
    with pytest.raises(ValueError, match="pct.json"):
        load_metrics([p])


def test_load_metrics_one_row_per_file(metric_paths: list[Path]) -> None:
    df = load_metrics(metric_paths)
    assert len(df) == len(RUNS)
    assert list(df["path"]) == [str(p) for p in metric_paths]
    assert "mean_reward" in df.columns


# --------------------------------------------------------------------------- writing


def test_write_table_three_files(t1: pd.DataFrame, tmp_path: Path) -> None:
    stem = tmp_path / "out" / "table1"
    notes = ["Note one: 50% of runs_done & more.", "Note two."]
    write_table(t1, stem, "Countdown accuracy (%)", notes)
    csv = pd.read_csv(stem.with_suffix(".csv"))
    assert list(csv["model"]) == ["tiny", "qwen2.5-0.5b-instruct"]
    assert csv.loc[0, "ES (ours)"] == pytest.approx(13.0)
    assert csv.loc[0, "ES (ours) std"] == pytest.approx(3.6)  # one decimal
    assert pd.isna(csv.loc[0, "PPO-z (ours)"])  # blank, not 0
    assert csv.loc[1, "ES (paper)"] == pytest.approx(14.4)

    md = stem.with_suffix(".md").read_text(encoding="utf-8")
    assert "| Model" in md and "ES (ours)" in md and "ES (paper)" in md
    assert "13.0 ± 3.6" in md  # mean ± std folded into one cell
    assert "ES (ours) std" not in md
    assert " 0.1 |" in md  # paper's 0.1 kept at one decimal
    assert md.rstrip().endswith("Note two.") and "Note one" in md
    assert not list(stem.parent.glob(".*tmp*"))  # no temporaries left behind

    tex = stem.with_suffix(".tex").read_text(encoding="utf-8")
    assert r"\begin{tabular}" in tex and r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"13.0 $\pm$ 3.6" in tex
    assert r"50\% of runs\_done \& more." in tex
    assert r"\multicolumn{2}{c}{ES}" in tex and r"\cmidrule(lr)" in tex  # method spans ours/paper
    lines = tex.splitlines()
    spec = next(line for line in lines if line.startswith(r"\begin{tabular}"))
    n_cols = len(spec.removeprefix(r"\begin{tabular}{").removesuffix("}"))
    header = next(line for line in lines if line.startswith("Model"))
    body = lines[lines.index(r"\midrule") + 1 : lines.index(r"\bottomrule")]
    assert len(body) == 2
    assert all(line.count("&") + 1 == n_cols for line in [header, *body])


def test_build_table1(metric_paths: list[Path], tmp_path: Path) -> None:
    stem = tmp_path / "tables" / "table1"
    df = build_table1(metric_paths, PUBLISHED, MODELS, stem, notes=["extra note"])
    assert list(df.index) == ["tiny", "qwen2.5-0.5b-instruct"]
    md = stem.with_suffix(".md").read_text(encoding="utf-8")
    assert "2509.24372" in md and "extra note" in md
    for ext in (".csv", ".md", ".tex"):
        assert stem.with_suffix(ext).stat().st_size > 0


# --------------------------------------------------------------------------- figures


def _logs() -> dict[str, list[dict]]:
    def rec(i: int, base: float) -> dict:
        m = base + 0.02 * i
        return {"iteration": i, "reward_mean": m, "reward_std": 0.05, "reward_min": m - 0.1,
                "reward_max": m + 0.1, "seconds_generation": 1.0, "seconds_perturb": 0.1,
                "seconds_restore": 0.1, "seconds_update": 0.1, "seconds_total": 1.3}

    return {
        "tiny / ES / seed 0": [rec(i, 0.1) for i in range(15)],
        "tiny / ES / seed 1": [rec(i, 0.2) for i in reversed(range(15))],  # unsorted input
    }


def test_training_curves_png_pdf(tmp_path: Path) -> None:
    paths = training_curves(_logs(), tmp_path / "fig" / "curves", "tiny")
    png, pdf = tmp_path / "fig" / "curves.png", tmp_path / "fig" / "curves.pdf"
    assert paths == [png, pdf]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pdf.read_bytes()[:4] == b"%PDF"
    assert b"CreationDate" not in pdf.read_bytes()
    assert b"Software" not in png.read_bytes()


def test_training_curves_byte_identical(tmp_path: Path) -> None:
    training_curves(_logs(), tmp_path / "a" / "c", "same")
    training_curves(_logs(), tmp_path / "b" / "c", "same")
    for ext in ("png", "pdf"):
        assert (tmp_path / "a" / f"c.{ext}").read_bytes() == (tmp_path / "b" / f"c.{ext}").read_bytes()


def test_training_curves_rejects_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        training_curves({}, tmp_path / "x", "empty")


def test_build_countdown_curves(tmp_path: Path) -> None:
    logs = _logs()
    paths = {}
    for i, (label, rows) in enumerate(logs.items()):
        paths[label] = tmp_path / f"run{i}" / "log.jsonl"
        write_jsonl(paths[label], rows)
    build_countdown_curves(paths, tmp_path / "countdown_curves")
    assert (tmp_path / "countdown_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "countdown_curves.pdf").read_bytes()[:4] == b"%PDF"
