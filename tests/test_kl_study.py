"""The conciseness study: config expansion, the plan's KL jobs, `esrepro kl`, Table 2 and the figures."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from esrepro.cli import main
from esrepro import specs
from esrepro.config import ConfigError, check_config, load_pipeline, load_yaml
from esrepro.io import read_json, write_json, write_jsonl
from esrepro.report.conciseness import build_table2, load_kl, pareto_front, table2
from esrepro.tasks.conciseness import prepare as prepare_conciseness
from esrepro.plan import Plan


@pytest.fixture()
def cfg() -> dict:
    return load_yaml(REPO / "config/config.yaml")


def _pipeline(config: dict):
    return load_pipeline(config, "config/config.yaml", root=REPO)


def _plan(config: dict) -> Plan:
    return Plan(_pipeline(config))


def test_study_expands_into_named_methods(cfg):
    p = _pipeline(cfg)
    study = p.studies()["conciseness"]
    methods = p.study_methods("conciseness")
    assert list(methods) == ["es_sigma0.005", "es_sigma0.01", "grpo_beta0", "grpo_beta0.01", "grpo_beta0.0167",
                             "grpo_beta0.0464"]
    es = p.method_settings("tiny", "conciseness", "es_sigma0.01").as_dict()
    assert es["sigma"] == 0.01 and es["algorithm"] == "es" and es["keep_every"] == study.keep_every
    g = p.method_settings("tiny", "conciseness", "grpo_beta0.0167").as_dict()
    assert g["beta"] == 0.0167 and g["algorithm"] == "grpo"
    # equal budgets: the ES runs' iterations x population x train_examples
    es_s = p.method_settings("tiny", "conciseness", "es_sigma0.005")
    assert g["sample_budget"] == es_s.iterations * es_s.population * es_s.train_examples


def test_appendix_betas_are_ten_log_spaced_values(cfg):
    cfg = copy.deepcopy(cfg)
    cfg["studies"]["conciseness"]["grpo"]["betas_logspace"] = {"start": -4, "stop": 0, "num": 10}
    del cfg["studies"]["conciseness"]["grpo"]["betas"]
    names = [m for m in _pipeline(cfg).study_methods("conciseness") if m.startswith("grpo")]
    assert len(names) == 10 and names[0] == "grpo_beta0.0001" and names[-1] == "grpo_beta1"
    assert {"grpo_beta0.0167", "grpo_beta0.0464"} <= set(names)  # the paper's two non-round betas


def test_plan_wires_study_runs_kl_and_reports(cfg):
    plan = _plan(cfg)
    targets = plan.final_targets()
    for path in ("results/kl/countdown/tiny/es/seed0/kl.json", "results/kl/conciseness/tiny/base/seed0/kl.json",
                 "results/kl/conciseness/tiny/grpo_beta0.0464/seed1/kl.json",
                 "results/tables/table2_conciseness.tex", "results/figures/conciseness_pareto.pdf",
                 "results/figures/conciseness_distribution.png", "results/figures/conciseness_pareto.csv",
                 "results/figures/conciseness_distribution.csv"):
        assert path in targets, path
    assert "results/kl/countdown/tiny/base/seed0/kl.json" in targets
    spec = json.loads(specs.as_json(specs.method_spec(plan.p, "tiny", "conciseness", "es_sigma0.005")))
    assert spec["sigma"] == 0.005 and spec["keep_every"] == 4
    import re

    direct = re.compile(plan.methods_regex(rl=False))
    assert direct.fullmatch("es_sigma0.005") and direct.fullmatch("grpo_beta0.01") and direct.fullmatch("es")
    assert plan.p.resources("tiny", "train").threads() == 1 and plan.p.resources("tiny", "kl").threads() == 1
    assert plan.kl_run_dir("conciseness", "tiny", "base", 0) is None
    assert len(plan.conciseness_kl()) == 1 + 6 * 2


def test_study_errors_are_named(cfg):
    bad = copy.deepcopy(cfg)
    bad["studies"]["conciseness"]["models"] = ["nope"]
    del bad["kl"]["conciseness"]
    with pytest.raises(ConfigError) as err:
        check_config(bad, "config/config.yaml", root=REPO)
    msg = str(err.value)
    assert "studies.conciseness.models.0: 'nope' is not in the registry" in msg
    assert "no kl.conciseness entry" in msg
    bad = copy.deepcopy(cfg)
    bad["studies"]["conciseness"]["es"]["sigmas"] = [0.00123, 0.001234]  # same name at 3 significant digits
    with pytest.raises(ConfigError, match="share the method name"):
        check_config(bad, "config/config.yaml", root=REPO)


def test_pareto_front():
    kl = [0.0, 1.0, 0.5, 2.0, 1.5, 3.0]
    reward = [-20, -5, -10, -5, -2, -1]
    assert pareto_front(kl, reward) == [0, 2, 1, 4, 5]
    assert pareto_front([1.0, 1.0], [0.0, 0.0]) == [0]


def _fake_kl(path: Path, algorithm: str, value, seed: int, reward: float, kl: float) -> Path:
    param = {"es": "sigma", "grpo": "beta"}.get(algorithm)
    rec = {"model": "tiny", "method": f"{algorithm}{value}", "seed": seed, "algorithm": algorithm,
           "hyper": {param: value} if param else {}, "iteration": 8, "reward": reward, "reward_sampled": reward - 1,
           "k1": kl, "k3": kl, "exact": kl,
           "checkpoints": [{"iteration": 4, "reward": reward - 2, "k1": kl / 2, "k3": kl / 2, "exact": kl / 2},
                           {"iteration": 8, "reward": reward, "k1": kl, "k3": kl, "exact": kl}]}
    write_json(path / "kl.json", rec)
    write_jsonl(path / "samples.jsonl", [{"id": "a", "reward": reward + d} for d in (-2, 0, 1)])
    return path / "kl.json"


def test_table2_means_stds_and_cutoff(tmp_path):
    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -20.0, 0.0)]
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.001, s, -10.0 + s, 0.5 + s) for s in (0, 1)]
    paths += [_fake_kl(tmp_path / f"g{s}", "grpo", 0.01, s, -30.0, 2.0) for s in (0, 1)]
    df = table2(load_kl(paths), reward_cutoff=-15)
    assert list(df["Method"]) == ["Original", "ES", "GRPO"]
    es = df.loc["ES sigma = 0.001"]
    assert es["Reward"] == -9.5 and es["KL exact"] == 1.0 and es["Seeds"] == 2
    assert es["Reward std"] == pytest.approx(0.7071, abs=1e-4)
    assert list(df["Kept"]) == ["yes", "yes", "no"]
    build_table2(paths, tmp_path / "t2", reward_cutoff=-15)
    md = (tmp_path / "t2.md").read_text()
    assert "-9.500 ± 0.707" in md and "dropped: GRPO beta = 0.01" in md
    assert "\\begin{tabular}" in (tmp_path / "t2.tex").read_text()


def test_figures_are_written(tmp_path):
    from esrepro.report.figures import pareto_figure, reward_distribution_figure

    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -20.0, 0.0)]
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.001, s, -10.0 + s, 0.5 + s) for s in (0, 1)]
    paths += [_fake_kl(tmp_path / f"g{s}", "grpo", 0.01, s, -3.0, 2.0) for s in (0, 1)]
    for fn, stem in ((pareto_figure, "conciseness_pareto"), (reward_distribution_figure, "conciseness_distribution")):
        out = fn(paths, tmp_path / stem)
        assert [p.name for p in out] == [f"{stem}.png", f"{stem}.pdf", f"{stem}.csv"]
        assert out[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _conciseness_runs(tmp_path: Path) -> list[Path]:
    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -20.0, 0.0)]
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.001, s, -10.0 + s, 0.5 + s) for s in (0, 1)]
    return paths + [_fake_kl(tmp_path / f"g{s}", "grpo", 0.01, s, -3.0, 2.0) for s in (0, 1)]


def test_pareto_csv_holds_the_plotted_points(tmp_path):
    from esrepro.report.figures import pareto_figure

    pareto_figure(_conciseness_runs(tmp_path), tmp_path / "pareto")
    csv = pd.read_csv(tmp_path / "pareto.csv")
    points = csv[csv["point"] == "checkpoint"]
    assert len(points) == 2 * 5 and set(csv["kl_estimator"]) == {"exact"}
    es = points[points["algorithm"] == "es"].set_index(["seed", "iteration"])
    assert es.loc[(1, 8), "kl"] == 1.5 and es.loc[(1, 8), "reward"] == -9.0
    assert es.loc[(0, 4), "kl"] == 0.25 and es.loc[(0, 4), "reward"] == -12.0
    # ES's front: (0.25, -12), (0.5, -10), (1.5, -9); (0.75, -11) is dominated by (0.5, -10)
    assert sorted(es.index[es["pareto_front"]]) == [(0, 4), (0, 8), (1, 8)]
    grpo = points[points["algorithm"] == "grpo"]
    assert grpo["pareto_front"].sum() == 2  # identical seeds: the first of each tie
    assert not points.loc[points["algorithm"] == "base", "pareto_front"].any()
    means = csv[csv["point"] == "configuration mean"].set_index("algorithm")
    assert list(means.index) == ["es", "grpo"]  # the labelled points; the base model has none
    assert means.loc["es", "value"] == 0.001 and means.loc["es", "kl"] == 1.0 and means.loc["es", "reward"] == -9.5
    assert means.loc["grpo", "kl"] == 2.0 and means.loc["grpo", "reward"] == -3.0


def test_reward_distribution_csv_holds_the_plotted_densities(tmp_path):
    from esrepro.report.figures import reward_distribution_figure

    reward_distribution_figure(_conciseness_runs(tmp_path), tmp_path / "dist")
    csv = pd.read_csv(tmp_path / "dist.csv")
    assert list(dict.fromkeys(csv["panel"])) == ["es", "grpo"]
    for panel, algos in (("es", ["base", "es"]), ("grpo", ["base", "grpo"])):
        assert list(dict.fromkeys(csv.loc[csv["panel"] == panel, "algorithm"])) == algos
    # samples: reward + (-2, 0, 1) per run; the base model's three beside each method's six (two seeds)
    expected = {"base": [-22, -20, -19], "es": [-12, -10, -9, -11, -9, -8], "grpo": [-5, -3, -2] * 2}
    for (panel, algo), g in csv.groupby(["panel", "algorithm"]):
        assert (g["n"] == len(expected[algo])).all()
        assert (g["density"] * (g["hi"] - g["lo"])).sum() == pytest.approx(1.0)
        edges = [*g["lo"], g["hi"].iloc[-1]]
        assert edges[0] == -22.5 and edges[-1] == pytest.approx(-1.5)
        dens, _ = np.histogram(expected[algo], bins=edges, density=True)
        assert list(g["density"]) == pytest.approx(list(dens))


def test_conciseness_figure_steps_record_the_csv(tmp_path):
    from esrepro.steps.report import pareto, reward_distribution

    kl = [str(p) for p in _conciseness_runs(tmp_path)]
    for step, stem in ((pareto, "conciseness_pareto"), (reward_distribution, "conciseness_distribution")):
        step(kl, str(tmp_path / stem))
        outputs = json.loads((tmp_path / f"{stem}.manifest.json").read_text())["outputs"]
        assert f"{stem}.csv" in json.dumps(outputs) and (tmp_path / f"{stem}.csv").is_file()


def test_esrepro_kl_on_the_base_model_is_zero_and_deterministic(tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    prepare_conciseness(data, {"kind": "generated"}, 0)
    spec = json.dumps({"split": "test", "limit": 2, "n_samples": 3, "max_new_tokens": 6, "batch_size": 4, "seed": 1})
    outs = []
    for i in range(2):
        out = tmp_path / f"kl{i}"
        argv = ["kl", "--task", "conciseness", "--model", "t", "--method", "base", "--model-dir", str(tiny_model_dir),
                "--base-dir", str(tiny_model_dir), "--data-dir", str(data), "--spec", spec, "--out", str(out)]
        assert main(argv) == 0
        outs.append(out)
    kl = read_json(outs[0] / "kl.json")
    assert kl["k1"] == kl["k3"] == kl["exact"] == 0.0 and kl["algorithm"] == "base"
    assert kl["n_responses"] == 6 and [c["iteration"] for c in kl["checkpoints"]] == [0]
    assert (outs[0] / "kl.json").read_bytes() == (outs[1] / "kl.json").read_bytes()
    assert (outs[0] / "samples.jsonl").read_bytes() == (outs[1] / "samples.jsonl").read_bytes()
    manifest = read_json(outs[0] / "manifest.json")
    assert len(manifest["inputs"]["base_model"]["sha256"]) == 64 and "kl" in manifest["outputs"]
