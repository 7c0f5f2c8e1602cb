"""Tests of the paper-figure modules: gains (Fig. 5), sample curves (Fig. 6), parameter shifts
against a random walk (Figs. 7-9), the GRPO learning-rate sweep (Figs. 3, 4). Synthetic inputs in tmp_path."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from esrepro.io import write_json, write_jsonl
from esrepro.report.gains import build_gains, improvement_table
from esrepro.report.lr_sweep import (
    build_lr_distributions,
    build_lr_sweep,
    load_sweep,
    value_from_name,
)
from esrepro.report.param_shift import (
    Bins,
    DeltaHistogram,
    RandomWalk,
    build_param_shift,
    build_shift_histogram,
    half_normal_counts,
    histogram_checkpoints,
    ks_distance_half_normal,
    simulate_walk,
)
from esrepro.report.sample_curves import (
    build_sample_curves,
    curves_table,
    mean_curve,
    read_periodic_eval,
    run_key_from_path,
)
from esrepro.report.tables import load_metrics


def _assert_outputs(paths: list[Path], stem: Path) -> None:
    assert sorted(p.name for p in paths) == sorted(f"{stem.name}.{e}" for e in ("png", "pdf", "csv"))
    for p in paths:
        assert p.exists() and p.stat().st_size > 0
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ======================================================================= Figure 5: gains
def _metric(model: str, method: str, seed: int, acc: float, task="countdown", split="test") -> dict:
    return {"task": task, "split": split, "model": model, "method": method, "seed": seed, "n": 2000,
            "accuracy": acc}


def _write_metrics(tmp_path: Path, recs: list[dict]) -> list[Path]:
    paths = []
    for i, rec in enumerate(recs):
        write_json(tmp_path / "m" / f"{i}.json", rec)
        paths.append(tmp_path / "m" / f"{i}.json")
    return paths


# Table 1 of the paper, Qwen2.5-0.5B-Instruct: Original 0.1, PPO 0.3, GRPO(8) 0.3, GRPO(30) 0.5, ES 14.4 (%)
PAPER_QWEN05 = [("base", 0.001), ("ppo", 0.003), ("grpo8", 0.003), ("grpo30", 0.005), ("es", 0.144)]


def test_gains_in_points_reproduce_the_papers_bar_labels(tmp_path: Path) -> None:
    """Figure 5's bars for Qwen2.5-0.5B read 0.2 %, 0.2 %, 0.4 % (PPO, GRPO 8, GRPO 30): Table 1's differences."""
    recs = [_metric("qwen2.5-0.5b-instruct", m, 0, a) for m, a in PAPER_QWEN05]
    t = improvement_table(load_metrics(_write_metrics(tmp_path, recs))).set_index("method")
    assert t.loc["ppo", "improvement"] == pytest.approx(0.2)
    assert t.loc["grpo8", "improvement"] == pytest.approx(0.2)
    assert t.loc["grpo30", "improvement"] == pytest.approx(0.4)
    assert t.loc["es", "improvement"] == pytest.approx(14.3)
    assert list(t.index) == ["es", "ppo", "grpo8", "grpo30"]  # paper order; base is the reference


def test_gains_mean_over_seeds_std_relative_and_base_zero(tmp_path: Path) -> None:
    recs = [_metric("a", "base", 0, 0.10), _metric("a", "es", 0, 0.20), _metric("a", "es", 1, 0.30),
            _metric("a", "grpo8", 0, 0.15),
            _metric("b", "base", 0, 0.0), _metric("b", "es", 0, 0.05),
            _metric("a", "es", 0, 0.9, split="val")]  # other split: ignored
    df = load_metrics(_write_metrics(tmp_path, recs))
    pts = improvement_table(df).set_index(["model", "method"])
    assert pts.loc[("a", "es"), "improvement"] == pytest.approx(15.0)
    assert pts.loc[("a", "es"), "improvement_std"] == pytest.approx(100 * np.std([0.2, 0.3], ddof=1))
    assert pts.loc[("a", "es"), "seeds"] == 2
    assert math.isnan(pts.loc[("a", "grpo8"), "improvement_std"])
    assert pts.loc[("b", "es"), "improvement"] == pytest.approx(5.0)
    rel = improvement_table(df, kind="relative").set_index(["model", "method"])
    assert rel.loc[("a", "es"), "improvement"] == pytest.approx(150.0)
    assert math.isnan(rel.loc[("b", "es"), "improvement"])
    assert "base accuracy 0" in rel.loc[("b", "es"), "note"]
    out = tmp_path / "fig" / "gains_rel"
    _assert_outputs(build_gains(_write_metrics(tmp_path, recs), out, kind="relative",
                                display={"a": "Model A", "b": "Model B"}), out)
    csv = pd.read_csv(out.with_suffix(".csv"))
    assert csv[(csv["model"] == "b")]["improvement"].isna().all()


def test_gains_without_base_metrics_is_an_error(tmp_path: Path) -> None:
    df = load_metrics(_write_metrics(tmp_path, [_metric("a", "es", 0, 0.2)]))
    with pytest.raises(ValueError, match="model 'a'.*base model"):
        improvement_table(df)


def test_build_gains_writes_png_pdf_csv(tmp_path: Path) -> None:
    recs = [_metric(m, meth, s, a + 0.01 * s) for m in ("q05", "q15")
            for meth, a in PAPER_QWEN05 for s in ((0,) if meth == "base" else (0, 1, 2))]
    out = tmp_path / "fig" / "gains"
    _assert_outputs(build_gains(_write_metrics(tmp_path, recs), out, models=["q15", "q05"]), out)
    again = tmp_path / "fig2" / "gains"
    build_gains(_write_metrics(tmp_path, recs), again, models=["q15", "q05"])
    for ext in ("png", "pdf", "csv"):  # deterministic outputs
        assert out.with_suffix(f".{ext}").read_bytes() == again.with_suffix(f".{ext}").read_bytes()
    csv = pd.read_csv(out.with_suffix(".csv"))
    assert list(dict.fromkeys(csv["model"])) == ["q15", "q05"]
    assert set(csv["method"]) == {"es", "ppo", "grpo8", "grpo30"}


# ======================================================================= Figure 6: curves
def _eval_row(it: int, samples: int, acc: float, split: str = "test") -> dict:
    return {"iteration": it, "samples": samples, "accuracy": acc, "reward": acc * 1.1, "split": split, "n": 200}


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = json.dumps(_eval_row(0, 0, 0.1))


@pytest.mark.parametrize("bad, message", [
    ("{not json", r":2: not valid JSON"),
    (json.dumps({k: v for k, v in _eval_row(1, 10, 0.2).items() if k != "samples"}), r":2: missing field\(s\) samples"),
    (json.dumps({**_eval_row(1, 10, 0.2), "accuracy": True}), r":2: field 'accuracy' must be int or float"),
    (json.dumps({**_eval_row(1, 10, 0.2), "samples": 10.5}), r":2: field 'samples' must be int"),
    (json.dumps(_eval_row(1, 10, 1.5)), r":2: field 'accuracy' must be a fraction"),
    (json.dumps({**_eval_row(1, 10, 0.2), "reward": float("nan")}), r":2: field 'reward' must be finite"),
    (json.dumps(_eval_row(0, 10, 0.2)), r":2: iteration 0 of split 'test' already given on line 1"),
    ("[1, 2]", r":2: expected a JSON object"),
])
def test_read_periodic_eval_names_file_line_and_field(tmp_path: Path, bad: str, message: str) -> None:
    path = _write_lines(tmp_path / "periodic_eval.jsonl", [GOOD, bad])
    with pytest.raises(ValueError, match=message):
        read_periodic_eval(path)


def test_mean_curve_shared_grid_and_interpolation() -> None:
    x = np.array([0, 10, 20])
    grid, mean, std, n = mean_curve([(x, np.array([1.0, 2.0, 3.0])), (x, np.array([3.0, 4.0, 5.0]))])
    assert n == 2 and list(grid) == [0, 10, 20] and list(mean) == [2.0, 3.0, 4.0]
    assert std == pytest.approx([math.sqrt(2)] * 3)
    grid, mean, _, _ = mean_curve([(np.array([0, 10, 20]), np.array([0.0, 10.0, 20.0])),
                                   (np.array([5, 15, 25]), np.array([5.0, 15.0, 25.0]))])
    assert list(grid) == [5, 10, 15, 20]  # union of grids inside the overlap [5, 20]
    assert list(mean) == [5.0, 10.0, 15.0, 20.0]
    grid, _, std, n = mean_curve([(x, np.array([1.0, 2.0, 3.0]))])
    assert n == 1 and np.isnan(std).all()


def test_build_sample_curves_from_run_layout(tmp_path: Path) -> None:
    paths = []
    for model in ("qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct"):
        for method, per_it, slope in (("es", 6000, 0.1), ("grpo8", 1600, 0.02), ("ppo", 1600, 0.01)):
            for seed in (0, 1):
                rows = [_eval_row(it, it * per_it, min(1.0, 0.01 + slope * it / 10 + 0.01 * seed))
                        for it in range(0, 11)]
                p = tmp_path / "runs" / "countdown" / model / method / f"seed{seed}" / "periodic_eval.jsonl"
                write_jsonl(p, rows)
                paths.append(p)
    assert run_key_from_path(paths[0]) == ("qwen2.5-0.5b-instruct", "es", 0)
    out = tmp_path / "fig" / "curves"
    _assert_outputs(build_sample_curves(paths, out), out)
    csv = pd.read_csv(out.with_suffix(".csv"))
    es = csv[(csv["model"] == "llama-3.2-1b-instruct") & (csv["method"] == "es")].set_index("samples")
    assert es.loc[60000, "accuracy"] == pytest.approx(100 * (0.01 + 0.1 * 10 / 10 + 0.005))
    assert es.loc[60000, "accuracy_std"] == pytest.approx(100 * np.std([0.11, 0.12], ddof=1))
    assert set(csv["seeds"]) == {2}


def test_sample_curves_split_selection(tmp_path: Path) -> None:
    rows = [_eval_row(0, 0, 0.1), _eval_row(1, 10, 0.2), _eval_row(0, 0, 0.5, "val"), _eval_row(1, 10, 0.6, "val")]
    logs = {("m", "es", 0): rows}
    with pytest.raises(ValueError, match="several splits"):
        curves_table(logs)
    assert list(curves_table(logs, split="val")["accuracy"]) == pytest.approx([50.0, 60.0])
    with pytest.raises(ValueError, match="no rows of split 'train'"):
        curves_table(logs, split="train")
    with pytest.raises(ValueError, match="cannot read model/method/seed"):
        run_key_from_path(tmp_path / "periodic_eval.jsonl")
    with pytest.raises(ValueError, match="share samples=10"):
        curves_table({("m", "es", 0): [_eval_row(0, 0, 0.1), _eval_row(1, 10, 0.2), _eval_row(2, 10, 0.3)]})


# ======================================================================= Figures 7-9: parameter shifts
def _save_tensors(dir_: Path, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """An HF-style safetensors checkpoint: one file, or ``shards`` files with an index."""
    from safetensors.torch import save_file

    dir_.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, dir_ / "model.safetensors")
        return dir_
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, dir_ / fname)
        weight_map.update({n: fname for n in part})
    write_json(dir_ / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    return dir_


def _tiny_tensors(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(tiny_model_dir / "model.safetensors")


def test_identical_checkpoints_fall_in_the_zero_bin(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    for kind in ("linear", "log"):
        h = histogram_checkpoints(tiny_model_dir, copy, Bins(kind, 1e-6 if kind == "log" else 0.0, 1e-2, 50))
        n = sum(t.numel() for t in _tiny_tensors(tiny_model_dir).values())
        assert h.n_params == n and h.zero == n
        assert h.counts.sum() == 0 and h.underflow == h.overflow == h.nonfinite == 0
        assert h.counts.dtype == np.float64


def test_streaming_histogram_equals_in_memory_sharded_and_chunked(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = _tiny_tensors(tiny_model_dir)
    gen = torch.Generator().manual_seed(3)
    final = {k: v + 1e-3 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
    first = sorted(final)[0]
    final[first] = final[first].clone()
    final[first].view(-1)[:7] = base[first].view(-1)[:7]  # some unchanged parameters
    a = _save_tensors(tmp_path / "a", base, shards=1)
    b = _save_tensors(tmp_path / "b", final, shards=3)
    bins = Bins("log", 1e-6, 3e-3, 40)
    h = histogram_checkpoints(a, b, bins, chunk_elems=257)  # forces row slices on every matrix
    whole = histogram_checkpoints(a, b, bins)
    d = np.concatenate([(final[k].double() - base[k].double()).abs().numpy().ravel() for k in sorted(base)])
    pos = d[d > 0]
    expect, _ = np.histogram(pos[(pos >= 1e-6) & (pos < 3e-3)], bins=bins.edges())
    assert np.array_equal(h.counts, expect.astype(np.float64))
    assert np.array_equal(h.counts, whole.counts)
    assert h.zero == float(np.count_nonzero(d == 0)) >= 7
    assert h.underflow == float(np.count_nonzero((d > 0) & (d < 1e-6)))
    assert h.overflow == float(np.count_nonzero(d >= 3e-3))
    assert h.n_tensors == len(base)
    assert h.rms == pytest.approx(math.sqrt(np.mean(d**2)), rel=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_histogram_on_cuda_equals_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = _tiny_tensors(tiny_model_dir)
    gen = torch.Generator().manual_seed(5)
    b = _save_tensors(tmp_path / "b", {k: v + 1e-3 * torch.randn(v.shape, generator=gen) for k, v in base.items()})
    bins = Bins("log", 1e-6, 3e-3, 40)
    cpu = histogram_checkpoints(tiny_model_dir, b, bins, chunk_elems=999)
    gpu = histogram_checkpoints(tiny_model_dir, b, bins, chunk_elems=999, device="cuda")
    assert np.array_equal(cpu.counts, gpu.counts) and (cpu.zero, cpu.overflow) == (gpu.zero, gpu.overflow)


def test_mismatched_checkpoints_are_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = _tiny_tensors(tiny_model_dir)
    name = sorted(base)[0]
    other = _save_tensors(tmp_path / "b", {k: v for k, v in base.items() if k != name})
    with pytest.raises(ValueError, match=f"only in {tiny_model_dir}: \\['{name}'\\]"):
        histogram_checkpoints(tiny_model_dir, other, Bins("linear", 0.0, 1.0, 10))


def test_walk_scale_formulas() -> None:
    paper = RandomWalk.es(alpha=5e-4, population=30, steps=500)
    assert paper.scale == pytest.approx(5e-4 * math.sqrt(500 / 30))  # 2.04e-3
    assert RandomWalk.es(5e-4, 30, 500, ddof=1).scale == pytest.approx(5e-4 * math.sqrt(500 * 29) / 30)
    assert RandomWalk.plain(sigma=1e-3, steps=500).scale == pytest.approx(1e-3 * math.sqrt(500))
    # from a log: z-scores of each iteration's rewards; an iteration with equal rewards does not move
    log = [{"rewards": [0.1, 0.5, 0.3, 0.9]}, {"rewards": [0.2, 0.2, 0.2, 0.2]}, {"rewards": [1.0, 0.0, 0.0, 0.0]}]
    walk = RandomWalk.es_from_log(log, alpha=0.01, population=4)
    assert walk.steps == 3 and walk.sum_z2 == pytest.approx(8.0, rel=1e-6)


def _es_walk_on_tensors(base: dict[str, torch.Tensor], steps: int, population: int, alpha: float,
                        seed: int) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Apply the trainer's update ``steps`` times with rewards unrelated to the noise."""
    from esrepro.perturb.noise import member_seed
    from esrepro.perturb.ops import update_, zscore

    params = [base[k].clone() for k in sorted(base)]
    rng = np.random.default_rng(seed)
    log = []
    for t in range(steps):
        seeds = [member_seed(seed, t, n) for n in range(population)]
        rewards = rng.standard_normal(population).tolist()
        update_(params, seeds, zscore(rewards).tolist(), alpha, "iid")
        log.append({"iteration": t, "rewards": rewards})
    return dict(zip(sorted(base), params, strict=True)), log


def test_es_update_on_unrelated_rewards_matches_the_closed_form(tiny_model_dir: Path, tmp_path: Path) -> None:
    """T real ES updates (esrepro.perturb.ops.update_) with rewards unrelated to the noise: the histogram of
    |final - base| over the toy model's parameters is the half-normal of scale alpha * sqrt(T / N)."""
    steps, population, alpha = 20, 8, 0.01
    base = _tiny_tensors(tiny_model_dir)
    final, log = _es_walk_on_tensors(base, steps, population, alpha, seed=7)
    b = _save_tensors(tmp_path / "final", final)
    walk = RandomWalk.es(alpha, population, steps)
    assert RandomWalk.es_from_log(log, alpha, population).scale == pytest.approx(walk.scale, rel=1e-6)
    bins = Bins.for_scale(walk.scale, "linear", 40)
    h = histogram_checkpoints(tiny_model_dir, b, bins)
    ref = half_normal_counts(bins, h.n_params, walk.scale)
    n = h.n_params
    assert n > 20_000
    tol = 4.5 * np.sqrt(ref.counts) + 3
    assert np.all(np.abs(h.counts - ref.counts) <= tol), np.max(np.abs(h.counts - ref.counts) / tol)
    assert abs(h.overflow - ref.overflow) <= 4.5 * math.sqrt(ref.overflow) + 3
    assert h.rms / walk.scale == pytest.approx(1.0, abs=0.02)
    d = np.concatenate([(final[k].double() - base[k].double()).numpy().ravel() for k in sorted(base)])
    assert ks_distance_half_normal(d, walk.scale) < 1.63 / math.sqrt(n)  # KS 1 % critical value
    # the test can fail: the perturbation-scale walk (sigma steps) or a walk missing 1/sqrt(N) is far off
    for wrong in (RandomWalk.plain(sigma=0.01, steps=steps).scale, alpha * math.sqrt(steps)):
        assert ks_distance_half_normal(d, wrong) > 0.3
        bad = half_normal_counts(bins, n, wrong)
        assert np.any(np.abs(h.counts - bad.counts) > 4.5 * np.sqrt(bad.counts) + 3)


def test_simulated_walk_matches_closed_form_and_is_seeded() -> None:
    walk = RandomWalk.es(alpha=5e-4, population=30, steps=50)
    d = simulate_walk(5000, walk, seed=0, chunk=1024)
    assert np.array_equal(d, simulate_walk(5000, walk, seed=0, chunk=1024))
    assert not np.array_equal(d, simulate_walk(5000, walk, seed=1, chunk=1024))
    assert ks_distance_half_normal(d, walk.scale) < 1.63 / math.sqrt(5000)
    plain = simulate_walk(5000, RandomWalk.plain(1e-3, 50), seed=0)
    assert ks_distance_half_normal(plain, 1e-3 * math.sqrt(50)) < 1.63 / math.sqrt(5000)


def test_histogram_json_round_trip() -> None:
    h = DeltaHistogram.empty(Bins("log", 1e-5, 1e-1, 8))
    h.add(np.array([0.0, 1e-6, 2e-5, 3e-3, 0.5, np.inf]))
    again = DeltaHistogram.from_dict(json.loads(json.dumps(h.to_dict())))
    assert np.array_equal(again.counts, h.counts) and again.counts.sum() == 2
    assert (again.zero, again.underflow, again.overflow, again.nonfinite, again.n_params) == (1, 1, 1, 1, 6)


def test_build_param_shift_figure_es_and_rl_rows(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = _tiny_tensors(tiny_model_dir)
    es_final, log = _es_walk_on_tensors(base, 10, 8, 0.01, seed=1)
    run = tmp_path / "run"
    _save_tensors(run / "checkpoint", es_final)
    write_json(run / "manifest.json", {"settings": {"alpha": 0.01, "population": 8, "sigma": 0.01}})
    write_jsonl(run / "log.jsonl", log)
    walk = RandomWalk.from_run(run)
    assert walk.steps == 10 and walk.sum_z2 == pytest.approx(80.0, rel=1e-6)
    gen = torch.Generator().manual_seed(0)
    rl_final = {k: v + 2e-3 * torch.randn(v.shape, generator=gen) * (torch.rand(v.shape, generator=gen) < 0.3)
                for k, v in base.items()}
    rl = _save_tensors(tmp_path / "rl", rl_final)
    h_es = build_shift_histogram(tiny_model_dir, run / "checkpoint", tmp_path / "h" / "es.json", walk, "Tiny / ES")
    h_rl = build_shift_histogram(tiny_model_dir, rl, tmp_path / "h" / "rl.json", walk, "Tiny / GRPO (8)",
                                 bins=Bins.for_scale(walk.scale, "log", 60))
    out = tmp_path / "fig" / "shift"
    _assert_outputs(build_param_shift([h_es, h_rl], out, sampled_coords=5000, seed=0), out)
    csv = pd.read_csv(out.with_suffix(".csv"))
    assert set(csv["label"]) == {"Tiny / ES", "Tiny / GRPO (8)"}
    for _label, g in csv.groupby("label"):
        n = g["n_params"].iloc[0]
        assert g["observed"].sum() == pytest.approx(n)  # bins + zero + underflow + overflow
        assert g["walk_expected"].sum() == pytest.approx(n, rel=1e-9)
        assert g["walk_sampled"].sum() == pytest.approx(n, rel=1e-9)
    rl_rows = csv[csv["label"] == "Tiny / GRPO (8)"].set_index("bin")
    assert rl_rows.loc["zero", "observed"] > 0.6 * rl_rows["n_params"].iloc[0]  # ~70 % untouched


# ======================================================================= Figures 3, 4: learning-rate sweep
def test_value_from_name() -> None:
    assert value_from_name("grpo_beta0.01", "beta") == 0.01
    assert value_from_name("grpo_lr3e-06", "learning_rate") == 3e-6
    assert value_from_name("grpo_beta0.1_lr2e-06", "learning_rate") == 2e-6
    assert value_from_name("grpo_beta0.1_lr2e-06", "beta") == 0.1
    assert value_from_name("es_sigma0.0015", "sigma") == 0.0015
    assert value_from_name("grpo_beta0", "learning_rate") is None
    assert value_from_name("dr_grpo", "learning_rate") is None


def _kl_record(method: str, algorithm: str, seed: int, reward: float, kl: float, hyper: dict) -> dict:
    checkpoints = [{"iteration": it, "reward": reward * f, "reward_sampled": reward * f - 1.0,
                    "exact": kl * f, "k1": kl * f, "k3": kl * f} for it, f in ((0, 1.5), (5, 1.2), (10, 1.0))]
    return {"task": "conciseness", "split": "test", "model": "tiny", "method": method, "seed": seed,
            "algorithm": algorithm, "hyper": hyper, "reward": reward, "reward_sampled": reward - 1.0,
            "exact": kl, "k1": kl, "k3": kl, "checkpoints": checkpoints}


def _write_sweep(tmp_path: Path, lr_in_hyper: bool = True) -> list[Path]:
    paths = []
    runs = [("base", "base", 0, -40.0, 0.0, {})]
    runs[0] = ("base", "base", 0, -40.0, 0.0, {})
    for sigma in (0.005, 0.01):
        for seed in (0, 1):
            runs.append((f"es_sigma{sigma:g}", "es", seed, -20.0 - 1000 * sigma + seed, 0.1 + 10 * sigma,
                         {"sigma": sigma, "alpha": sigma / 2}))
    for lr in (2e-6, 4e-6):
        for beta in (0.0, 0.1):
            for seed in (0, 1):
                name = f"grpo_beta{beta:g}_lr{lr:g}"
                hyper = {"beta": beta, **({"learning_rate": lr} if lr_in_hyper else {})}
                runs.append((name, "grpo", seed, -30.0 + 2e6 * lr - 10 * beta + seed, 0.2 + 1e5 * lr, hyper))
    rng = np.random.default_rng(0)
    for _i, (method, algo, seed, reward, kl, hyper) in enumerate(runs):
        d = tmp_path / "kl" / method / f"seed{seed}"
        write_json(d / "kl.json", _kl_record(method, algo, seed, reward, kl, hyper))
        write_jsonl(d / "samples.jsonl", [{"id": str(j), "sample": 0, "reward": float(reward + rng.normal(0, 3))}
                                          for j in range(30)])
        paths.append(d / "kl.json")
    return paths


def test_lr_sweep_points_and_figure(tmp_path: Path) -> None:
    paths = _write_sweep(tmp_path)
    runs = load_sweep(paths)
    grpo = runs[runs["algorithm"] == "grpo"]
    assert sorted(set(grpo["learning_rate"])) == [2e-6, 4e-6] and sorted(set(grpo["beta"])) == [0.0, 0.1]
    out = tmp_path / "fig" / "lr_sweep"
    _assert_outputs(build_lr_sweep(paths, out), out)
    pts = pd.read_csv(out.with_suffix(".csv"))
    cfg = pts[(pts["kind"] == "config") & (pts["algorithm"] == "grpo")].set_index(["learning_rate", "beta"])
    # reward_sampled = reward - 1: mean over seeds 0, 1 of (-30 + 2e6 lr - 10 beta + seed) - 1, on the paper's
    # normalised scale by default (v2 App. A.2: 1 + raw / 2000)
    assert cfg.loc[(4e-6, 0.0), "reward"] == pytest.approx(1 + (-30 + 8 - 0 + 0.5 - 1) / 2000)
    assert cfg.loc[(4e-6, 0.0), "reward_std"] == pytest.approx(np.std([0, 1], ddof=1) / 2000)
    runs_csv = pts[(pts["kind"] == "run") & (pts["algorithm"] == "base")]
    assert runs_csv["reward"].iloc[0] == pytest.approx(1 + (-41) / 2000) and runs_csv["reward_raw"].iloc[0] == -41.0
    assert cfg.loc[(4e-6, 0.0), "reward_raw"] == pytest.approx(-30 + 8 - 0 + 0.5 - 1)
    assert cfg.loc[(2e-6, 0.1), "seeds"] == 2
    assert pts[(pts["kind"] == "checkpoint") & pts["on_front"]]["algorithm"].isin(["es", "grpo"]).all()
    assert pts[(pts["kind"] == "checkpoint") & (pts["algorithm"] == "es")]["on_front"].any()
    # the greedy reward on the same scale, and raw rewards on request
    norm = load_sweep(paths, reward="reward", reward_worst=-2000.0)
    assert norm[norm["algorithm"] == "base"]["reward"].iloc[0] == pytest.approx(1 - 40 / 2000)
    raw = load_sweep(paths, reward_worst=None)
    assert raw[raw["algorithm"] == "base"]["reward"].iloc[0] == -41.0


def test_lr_sweep_reads_learning_rate_from_method_name(tmp_path: Path) -> None:
    runs = load_sweep(_write_sweep(tmp_path, lr_in_hyper=False))
    assert sorted(set(runs[runs["algorithm"] == "grpo"]["learning_rate"])) == [2e-6, 4e-6]
    d = tmp_path / "kl" / "grpo_beta0.1" / "seed0"
    write_json(d / "kl.json", _kl_record("grpo_beta0.1", "grpo", 0, -30.0, 0.2, {"beta": 0.1}))
    with pytest.raises(ValueError, match="has no learning rate"):
        load_sweep([d / "kl.json"])


def test_lr_distributions_one_panel_per_learning_rate(tmp_path: Path) -> None:
    paths = _write_sweep(tmp_path)
    out = tmp_path / "fig" / "lr_dist"
    _assert_outputs(build_lr_distributions(paths, out, reward_worst=-2000.0), out)
    tab = pd.read_csv(out.with_suffix(".csv"))
    assert sorted(set(tab["learning_rate"])) == [2e-6, 4e-6]
    panel = tab[tab["learning_rate"] == 4e-6]
    assert set(panel["series"]) == {"GRPO β = 0", "GRPO β = 0.1", "ES σ = 0.005", "ES σ = 0.01", "base model"}
    for _, g in panel.groupby("series"):
        assert (g["density"] * (g["hi"] - g["lo"])).sum() == pytest.approx(1.0)
    assert set(panel[panel["series"] == "GRPO β = 0"]["n"]) == {60}  # 30 responses x 2 seeds
    one = tmp_path / "fig" / "lr_dist_4e-6"
    build_lr_distributions(paths, one, learning_rates=[4e-6])
    assert set(pd.read_csv(one.with_suffix(".csv"))["learning_rate"]) == {4e-6}
    with pytest.raises(ValueError, match="learning rate 5e-06: no GRPO run"):
        build_lr_distributions(paths, tmp_path / "x", learning_rates=[5e-6])
