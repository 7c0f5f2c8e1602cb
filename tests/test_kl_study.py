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
from esrepro.config import ConfigError, load_yaml
from esrepro.io import read_json, write_json, write_jsonl
from esrepro.planning import specs
from esrepro.planning.load import check_config, load_pipeline
from esrepro.planning.plan import Plan
from esrepro.report.conciseness import build_table2, load_kl, pareto_front, table2
from esrepro.tasks.conciseness import prepare as prepare_conciseness


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
    assert es["alpha"] == 0.005 and p.method_settings("tiny", "conciseness", "es_sigma0.005").alpha == 0.0025
    g = p.method_settings("tiny", "conciseness", "grpo_beta0.0167").as_dict()
    assert g["beta"] == 0.0167 and g["algorithm"] == "grpo"
    # equal budgets: the ES runs' iterations x population x train_examples
    es_s = p.method_settings("tiny", "conciseness", "es_sigma0.005")
    assert g["sample_budget"] == es_s.iterations * es_s.population * es_s.train_examples


def test_paper_config_runs_the_conciseness_study_as_v2_states_it():
    """v2 Sec. 4.2, App. A.2 and A.4: the betas, GRPO's learning rate and group, the sigmas with alpha = sigma/2,
    1,000 iterations with a checkpoint every 200, four seeds, 20 samples per prompt, the 0.85 cut-off."""
    import numpy as np

    p = load_pipeline(load_yaml(REPO / "config/paper.yaml"), "config/paper.yaml", root=REPO)
    study, model = p.studies()["conciseness"], "qwen2.5-7b-instruct"
    assert study.models == [model] and study.seeds == [0, 1, 2, 3] and study.keep_every == 200
    assert study.reward_cutoff == 0.85
    methods = p.study_methods("conciseness")
    betas = [s.swept["beta"] for s in methods.values() if s.algorithm == "grpo"]
    # beta 0 and ten log-spaced values from 0.01 to 1.0, as Figure 1 prints them (4 decimals, within 0.2%)
    assert betas[0] == 0.0 and np.allclose(betas[1:], np.logspace(-2, 0, 10), rtol=2e-3, atol=0)
    assert betas[1:] == [0.01, 0.0167, 0.0278, 0.0464, 0.0774, 0.1291, 0.2154, 0.3594, 0.5994, 1.0]
    for m, found in methods.items():
        s = p.method_settings(model, "conciseness", m)
        assert s.keep_every == 200
        if found.algorithm == "grpo":
            assert (s.learning_rate, s.num_generations, s.beta) == (5e-6, 30, found.swept["beta"])
            assert s.sample_budget == 1000 * 30 * 2  # the ES runs' samples: 1,000 steps of 2 prompts x 30
        else:
            assert (s.population, s.iterations, s.train_examples) == (30, 1000, 2)
            assert s.alpha == s.sigma / 2
    alphas = {p.method_settings(model, "conciseness", m).sigma: p.method_settings(model, "conciseness", m).alpha
              for m, f in methods.items() if f.algorithm == "es"}
    assert alphas == {0.0005: 0.00025, 0.001: 0.0005, 0.0015: 0.00075}  # Table 2: 0.0005 and 0.00075
    kl = p.kl_settings("conciseness")
    assert kl.n_samples == 20
    lr = p.studies()["conciseness_lr"]
    assert lr.seeds == [0, 1, 2, 3] and lr.keep_every == 200 and lr.grpo.betas == [0.0, 0.01, 0.1, 1.0]
    assert lr.grpo.learning_rates == [2e-6, 3e-6, 4e-6, 5e-6]
    assert p.method_settings(model, "conciseness", "grpo_beta0.1_lr0.000003").learning_rate == 3e-6


def test_alpha_follows_sigma_or_settings_not_both(cfg):
    bad = copy.deepcopy(cfg)
    bad["studies"]["conciseness"]["es"]["settings"]["alpha"] = 0.001
    with pytest.raises(ConfigError, match="studies.conciseness.es.settings.alpha: set by alpha_over_sigma"):
        check_config(bad, "config/config.yaml", root=REPO)
    bad = copy.deepcopy(cfg)
    bad["studies"]["conciseness"]["reward_cutoff"] = -30
    with pytest.raises(ConfigError, match="studies.conciseness.reward_cutoff"):
        check_config(bad, "config/config.yaml", root=REPO)
    ok = copy.deepcopy(cfg)
    del ok["studies"]["conciseness"]["es"]["alpha_over_sigma"]  # then alpha is defaults.es's, whatever sigma
    p = _pipeline(ok)
    assert {p.method_settings("tiny", "conciseness", m).alpha for m in ("es_sigma0.005", "es_sigma0.01")} == {0.005}


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
    assert "results/tables/conciseness_stability.md" in targets
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


def _fake_kl(path: Path, algorithm: str, value, seed: int, reward: float, kl: float,
             responses: list[str] | None = None, model: str = "tiny") -> Path:
    """A kl.json as `esrepro kl` writes it: ``reward`` raw; greedy = reward + 1, sampled = reward."""
    hyper = ({"sigma": value, "alpha": value / 2} if algorithm == "es" else
             {"beta": value, "learning_rate": 5e-6} if algorithm == "grpo" else {})
    rec = {"model": model, "method": f"{algorithm}{value}", "seed": seed, "algorithm": algorithm,
           "hyper": hyper, "iteration": 8, "reward": reward + 1, "reward_sampled": reward,
           "k1": kl, "k3": kl, "exact": kl + 0.5,
           "checkpoints": [{"iteration": 4, "reward": reward - 1, "reward_sampled": reward - 2, "k1": kl / 2,
                            "k3": kl / 2, "exact": kl / 2 + 0.5},
                           {"iteration": 8, "reward": reward + 1, "reward_sampled": reward, "k1": kl, "k3": kl,
                            "exact": kl + 0.5}]}
    write_json(path / "kl.json", rec)
    texts = responses or ["Paris", "Red", "Hola"]
    write_jsonl(path / "samples.jsonl", [{"id": "a", "response": t, "reward": reward + d}
                                         for t, d in zip(texts, (-2, 0, 1) * len(texts), strict=False)])
    return path / "kl.json"


def _norm(raw: float) -> float:
    return 1 + raw / 2000


def test_normalised_reward_is_the_papers_scale():
    from esrepro.report.conciseness import normalise_reward

    assert normalise_reward(0.0) == 1.0 and normalise_reward(-2000.0) == 0.0 and normalise_reward(-500.0) == 0.75
    assert normalise_reward(-2600.0) == 0.0  # below the scale's floor: clipped to 0
    assert normalise_reward(-500.0, None) == -500.0
    with pytest.raises(ValueError, match="reward_worst must be negative"):
        normalise_reward(-1.0, 10.0)


@pytest.mark.parametrize("response, nonword", [
    ("Paris", False), ("84", False), ("7", False), ("No.", False), ("The capital is Paris!", False),
    ("巴黎", False),                       # letters of any script are words
    ("", True), ("   ", True),              # no word at all
    ("!!", True), ("?", True), (")]}.", True), ("#$%&a", True),  # symbols, at most a stray letter
    ("a!", False),                          # half letters: not flagged
])
def test_nonword_rule_on_constructed_responses(response, nonword):
    from esrepro.report.conciseness import is_nonword

    assert is_nonword(response) is nonword


def test_hacking_marks_runs_far_above_the_base_models_nonword_share(tmp_path):
    from esrepro.report.conciseness import hacked_runs, nonword_share

    assert nonword_share(["!!", "Paris", "", "Red"]) == 0.5
    base = _fake_kl(tmp_path / "b", "base", None, 0, -400.0, 0.0, ["Paris", "Paris is in France", "#"] * 4)  # 1/3
    hack = _fake_kl(tmp_path / "g0", "grpo", 0.0, 0, -3.0, 2.0, ["!!", "?", ".", "Paris"] * 3)  # 3/4
    fine = _fake_kl(tmp_path / "g1", "grpo", 0.0, 1, -3.0, 2.0, ["!!", "Paris", "Red"] * 4)  # 1/3
    runs = load_kl([base, hack, fine])
    assert list(hacked_runs(runs, margin=0.2)) == [False, True, False]
    assert list(hacked_runs(runs, margin=0.5)) == [False, False, False]  # 0.75 - 0.33 is not above 0.5
    assert list(hacked_runs(runs.iloc[1:], margin=0.2)) == [False, False]  # no base model: nothing to compare


def _published() -> dict:
    from esrepro.report.tables import load_published

    return load_published(REPO / "config" / "published.yaml")


def test_table2_cutoff_hacking_normalisation_and_the_papers_values(tmp_path):
    q = "qwen2.5-7b-instruct"
    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -400.0, 0.0, ["Paris is the capital"] * 4, model=q)]
    # ES sigma 0.001 (alpha 0.0005, the paper's row): raw -200, -220 -> 0.9, 0.89
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.001, s, -200.0 - 20 * s, 0.3, model=q) for s in (0, 1)]
    # GRPO beta 0 (the paper's row; one seed hacks): raw -100, -500 -> 0.95, 0.75: mean 0.85, not above the cut-off
    paths += [_fake_kl(tmp_path / "g0", "grpo", 0.0, 0, -100.0, 1.0, ["!!", "#", "?", "Red"], model=q),
              _fake_kl(tmp_path / "g1", "grpo", 0.0, 1, -500.0, 1.4, model=q)]
    # GRPO beta 0.1291 (not a row of the paper's): raw -1000 -> 0.5, below: left out
    paths += [_fake_kl(tmp_path / f"h{s}", "grpo", 0.1291, s, -1000.0, 0.1, model=q) for s in (0, 1)]
    # GRPO beta 0.2154: raw -100 -> 0.95: kept
    paths += [_fake_kl(tmp_path / f"k{s}", "grpo", 0.2154, s, -100.0 + s, 0.2, model=q) for s in (0, 1)]
    df = table2(load_kl(paths), reward_cutoff=0.85, published=_published(), displays={q: "Qwen2.5-7B-Instruct"})
    es = df.loc["ES sigma = 0.001"]
    assert es["Reward (ours)"] == pytest.approx((_norm(-200) + _norm(-220)) / 2)
    assert es["Reward (ours) std"] == pytest.approx(np.std([_norm(-200), _norm(-220)], ddof=1))
    assert es["Raw reward"] == -210.0 and es["KL (ours)"] == 0.3  # KL: k3 (exact is 0.8)
    assert (es["α"], es["σ"], es["β"], es["Status"]) == ("0.0005", "0.001", "", "kept")
    assert (es["Reward (paper)"], es["Reward (paper) std"], es["KL (paper)"]) == (0.889, 0.004, 0.274)
    g0 = df.loc["GRPO beta = 0, lr = 5e-06"]
    assert g0["Status"] == "below cut-off"  # mean 0.85 is not above 0.85, shown beside the paper's row
    assert g0["Hacking (ours)"] == "* (1/2)" and g0["Hacking (paper)"] == "*"
    assert (g0["Reward (paper)"], g0["KL (paper) std"]) == (0.867, 0.614)
    assert df.loc["GRPO beta = 0.2154, lr = 5e-06", "Status"] == "kept"
    assert "GRPO beta = 0.1291, lr = 5e-06" not in df.index  # below the cut-off and not in the paper's table
    # the paper's rows we did not run are there, ours blank
    missing = df.loc["GRPO beta = 0.0167, lr = 5e-06"]
    assert missing["Status"] == "not run" and missing["Reward (paper)"] == 0.911 and np.isnan(missing["Reward (ours)"])
    assert df.loc["ES sigma = 0.0015", "Reward (paper)"] == 0.919 and df.loc["ES sigma = 0.0015", "α"] == "0.00075"
    assert set(df.loc[df["Hacking (paper)"] == "*"].index) == {"GRPO beta = 0, lr = 5e-06",
                                                                 "GRPO beta = 0.01, lr = 5e-06"}
    assert list(df["Method"]).index("ES") > list(df["Method"]).index("GRPO")  # GRPO first, as v2 prints it
    build_table2(paths, tmp_path / "t2", reward_cutoff=0.85, published=REPO / "config" / "published.yaml",
                 displays={q: "Qwen2.5-7B-Instruct"})
    md = (tmp_path / "t2.md").read_text()
    assert "0.895 ± 0.007" in md and "0.889 ± 0.004" in md and "0.867 ± 0.054" in md
    assert "Left out, below it: GRPO beta = 0.1291, lr = 5e-06 (0.500)" in md
    assert "arXiv 2509.24372v2, Table 2" in md and "\\begin{tabular}" in (tmp_path / "t2.tex").read_text()


def test_table2_lists_every_configuration_when_none_passes_the_cutoff(tmp_path):
    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -150.0, 0.0)]
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.005, s, -130.0, 0.5) for s in (0, 1)]
    paths += [_fake_kl(tmp_path / f"g{s}", "grpo", 0.01, s, -75.0, 2.0) for s in (0, 1)]
    df = table2(load_kl(paths), reward_cutoff=0.99, published=_published())
    ours = df[df["Model"] == "tiny"]
    assert len(ours) == 2 and set(ours["Status"]) == {"below cut-off"}
    assert (df["Status"] == "not run").sum() == 6  # and the paper's six rows beside them
    kept = table2(load_kl(paths), reward_cutoff=0.95)
    assert list(kept["Status"]) == ["kept"]  # GRPO 0.9625 passes, ES 0.935 is left out
    assert list(table2(load_kl(paths), reward_cutoff=None)["Status"]) == ["kept", "kept"]
    build_table2(paths, tmp_path / "t2", reward_cutoff=0.99)
    assert "No configuration of ours is above it: every configuration is listed" in (tmp_path / "t2.md").read_text()


def test_readme_results_show_our_table2_rows(tmp_path):
    import shutil

    from esrepro.provenance.golden import readme_results

    tables = tmp_path / "golden" / "results" / "tables"
    tables.mkdir(parents=True)
    shutil.copy(REPO / "golden" / "tiny" / "results" / "tables" / "table1_countdown.csv", tables)
    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -150.0, 0.0)]
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.005, s, -130.0 - 20 * s, 0.5) for s in (0, 1)]
    build_table2(paths, tables / "table2_conciseness", reward_cutoff=0.9, published=_published())
    text = readme_results(tmp_path / "golden")
    assert "| ES sigma = 0.005 | 2 | 0.930 ± 0.007 | 0.50 ± 0.00 |  | kept |" in text
    assert "0.0167" not in text  # the paper's rows we did not run stay in the table, not in the README


def test_stability_ratio_reproduces_the_papers_15_5(tmp_path):
    from esrepro.report.conciseness import build_conciseness_stability, conciseness_stability

    paths = [_fake_kl(tmp_path / "b", "base", None, 0, -400.0, 0.0)]
    paths += [_fake_kl(tmp_path / f"e{s}", "es", 0.001, s, -200.0 - 20 * s, 0.3) for s in (0, 1)]   # std 0.01/sqrt2
    paths += [_fake_kl(tmp_path / f"g{s}", "grpo", 0.0, s, -100.0 - 200 * s, 1.0) for s in (0, 1)]  # std 0.1/sqrt2
    paths += [_fake_kl(tmp_path / f"h{s}", "grpo", 0.5994, s, -1500.0, 0.1) for s in (0, 1)]       # std 0, below
    df = conciseness_stability(load_kl(paths), 0.85, _published())
    paper = df.loc["paper (v2 Table 2)"]
    assert paper["GRPO max / ES min"] == pytest.approx(15.5) and paper["Stated (paper)"] == 15.5
    assert paper["GRPO std (max)"] == 0.062 and paper["ES std (min)"] == 0.004
    kept, every = df.loc["ours, above the cut-off"], df.loc["ours, every configuration"]
    assert kept["GRPO max / ES min"] == pytest.approx(10.0) and kept["GRPO configurations"] == "1"
    assert every["GRPO configurations"] == "2" and every["GRPO mean / ES mean"] == pytest.approx(5.0)
    build_conciseness_stability(paths, tmp_path / "st", 0.85, REPO / "config" / "published.yaml")
    assert "15.500" in (tmp_path / "st.md").read_text()


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
    assert len(points) == 2 * 5 and set(csv["kl_estimator"]) == {"k3"}
    es = points[points["algorithm"] == "es"].set_index(["seed", "iteration"])
    # the sampled responses' reward, normalised (raw beside it), against k3
    assert es.loc[(1, 8), "kl"] == 1.5 and es.loc[(1, 8), "reward_raw"] == -9.0
    assert es.loc[(1, 8), "reward"] == pytest.approx(_norm(-9.0))
    assert es.loc[(0, 4), "kl"] == 0.25 and es.loc[(0, 4), "reward"] == pytest.approx(_norm(-12.0))
    # ES's front: (0.25, -12), (0.5, -10), (1.5, -9); (0.75, -11) is dominated by (0.5, -10)
    assert sorted(es.index[es["pareto_front"]]) == [(0, 4), (0, 8), (1, 8)]
    grpo = points[points["algorithm"] == "grpo"]
    assert grpo["pareto_front"].sum() == 2  # identical seeds: the first of each tie
    assert not points.loc[points["algorithm"] == "base", "pareto_front"].any()
    means = csv[csv["point"] == "configuration mean"].set_index("algorithm")
    assert list(means.index) == ["es", "grpo"]  # the labelled points; the base model has none
    assert means.loc["es", "value"] == 0.001 and means.loc["es", "kl"] == 1.0
    assert means.loc["es", "reward"] == pytest.approx(_norm(-9.5)) and means.loc["es", "reward_raw"] == -9.5
    assert means.loc["grpo", "kl"] == 2.0 and means.loc["grpo", "reward"] == pytest.approx(_norm(-3.0))


def test_reward_distribution_csv_holds_the_plotted_densities(tmp_path):
    from esrepro.report.figures import reward_distribution_figure

    reward_distribution_figure(_conciseness_runs(tmp_path), tmp_path / "dist")
    csv = pd.read_csv(tmp_path / "dist.csv")
    assert list(dict.fromkeys(csv["panel"])) == ["es", "grpo"]
    for panel, algos in (("es", ["base", "es"]), ("grpo", ["base", "grpo"])):
        assert list(dict.fromkeys(csv.loc[csv["panel"] == panel, "algorithm"])) == algos
    # samples: reward + (-2, 0, 1) per run; the base model's three beside each method's six (two seeds)
    expected = {"base": [-22, -20, -19], "es": [-12, -10, -9, -11, -9, -8], "grpo": [-5, -3, -2] * 2}
    for (_panel, algo), g in csv.groupby(["panel", "algorithm"]):
        assert (g["n"] == len(expected[algo])).all()
        assert (g["density"] * (g["hi"] - g["lo"])).sum() == pytest.approx(1.0)
        edges = [*g["lo"], g["hi"].iloc[-1]]
        assert edges[0] == pytest.approx(_norm(-22.5)) and edges[-1] == pytest.approx(_norm(-1.5))
        dens, _ = np.histogram([_norm(x) for x in expected[algo]], bins=edges, density=True)
        assert list(g["density"]) == pytest.approx(list(dens))


def test_conciseness_figure_steps_record_the_csv(tmp_path):
    from esrepro.steps.report import pareto, reward_distribution

    kl = [str(p) for p in _conciseness_runs(tmp_path)]
    for step, stem in ((pareto, "conciseness_pareto"), (reward_distribution, "conciseness_distribution")):
        step(kl, str(tmp_path / stem))
        outputs = json.loads((tmp_path / f"{stem}.manifest.json").read_text())["outputs"]
        assert f"{stem}.csv" in json.dumps(outputs) and (tmp_path / f"{stem}.csv").is_file()


def test_table_steps_record_the_published_numbers(tmp_path):
    from esrepro.steps.report import conciseness_stability, table2

    kl = [str(p) for p in _conciseness_runs(tmp_path)]
    published, registry = str(REPO / "config" / "published.yaml"), str(REPO / "config" / "models.yaml")
    table2(kl, registry, published, str(tmp_path / "t2"), reward_cutoff=0.99)
    conciseness_stability(kl, published, str(tmp_path / "st"), reward_cutoff=0.99)
    for stem in ("t2", "st"):
        manifest = json.loads((tmp_path / f"{stem}.manifest.json").read_text())
        assert "published" in manifest["inputs"] and manifest["settings"]["reward_cutoff"] == 0.99
        assert any(k.endswith("samples.jsonl") for k in manifest["inputs"])  # the hacking marks read them
    assert "Qwen2.5-7B-Instruct" in (tmp_path / "t2.md").read_text()  # the paper's rows, by display name


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
