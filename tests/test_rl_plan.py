"""RL in the plan: budgets from the ES settings, grid cells, selection, Table 3, config errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from esrepro.config import ConfigError, load_yaml, read_config
from esrepro.pipeline import cell_name
from esrepro.planning import specs
from esrepro.planning.load import check_config, load_pipeline
from esrepro.planning.plan import Plan
from esrepro.report.tables import build_table3, table3
from esrepro.rl.budget import rl_budget, samples_per_step
from esrepro.rl.select import choose, final_train_reward, select_run
from esrepro.settings.methods import FORMER_NAMES

REPO = Path(__file__).resolve().parents[1]


def _plan(name: str) -> Plan:
    return Plan(load_pipeline(load_yaml(REPO / "config" / name), f"config/{name}", root=REPO))


def test_tiny_budgets_equal_the_es_budget():
    plan = _plan("config.yaml")
    es = plan.p.method_settings("tiny", "countdown", "es")
    budget = es.iterations * es.population * es.train_examples
    for method in ("ppo", "grpo8", "grpo30", "grpov", "drgrpov"):
        spec = specs.method_spec(plan.p, "tiny", "countdown", method)
        assert spec["sample_budget"] == budget
        b = rl_budget(spec["sample_budget"], samples_per_step(spec))
        assert b.samples_used <= budget < b.samples_used + b.samples_per_step
    assert "sample_budget" not in specs.method_spec(plan.p, "tiny", "countdown", "es")
    # trained directly: ES, low-rank ES and the conciseness study's runs (es_sigma..., grpo_beta...), never a grid
    # method
    direct = plan.methods_regex(rl=False).split("|")
    assert {"es", "eggroll1", "eggroll4", "es_sigma0\\.005"} <= set(direct), direct
    assert not any(m in direct for m in ("ppo", "grpo8", "grpo30", "grpov", "drgrpov"))


def test_grid_cells_and_paths():
    """v2 Table 4: PPO-z and GRPO-z (8 and 30) sweep the four (beta, lr) pairs for every model; GRPO-v and
    Dr.GRPO-v (A.2: VERL's defaults) are one cell each; no Dr.GRPO on TRL."""
    plan = _plan("paper.yaml")
    pairs = {(1e-3, 1e-6), (1e-3, 1e-5), (5e-3, 1e-6), (5e-3, 1e-5)}
    models = plan.p.cfg.models
    assert len(models) == 7
    for model in models:
        for method, lr in (("ppo", "actor_learning_rate"), ("grpo8", "learning_rate"), ("grpo30", "learning_rate")):
            cells = plan.p.grid_cells(model, method)
            assert len(cells) == 4 and {(c["beta"], c[lr]) for c in cells.values()} == pairs
            assert "cells" not in plan.p.grid_record(model, method)
        for method in ("grpov", "drgrpov"):
            assert list(plan.p.grid_cells(model, method)) == ["default"]
        assert "drgrpo" not in plan.p.cfg.methods
    assert set(plan.p.grid_cells("qwen2.5-7b-instruct", "ppo")) == {"alr1e-06_kl0.001", "alr1e-06_kl0.005",
                                                                   "alr1e-05_kl0.001", "alr1e-05_kl0.005"}
    spec = json.loads(specs.as_json(specs.method_spec(plan.p, "qwen2.5-7b-instruct", "countdown", "grpo30",
                                                      "lr1e-05_beta0.005")))
    assert (spec["learning_rate"], spec["beta"], spec["loss_type"], spec["num_generations"]) == (1e-5, 5e-3, "dapo", 30)
    assert "grid" not in spec and spec["sample_budget"] == 500 * 30 * 200
    v = specs.method_spec(plan.p, "qwen2.5-7b-instruct", "countdown", "grpov")
    assert (v["algorithm"], v["learning_rate"], v["beta"], v["sample_budget"]) == ("verl_grpo", 1e-6, 1e-3, 3_000_000)
    dr = specs.method_spec(plan.p, "qwen2.5-7b-instruct", "countdown", "drgrpov")
    assert (dr["algorithm"], dr["loss_type"], dr["scale_rewards"], dr["beta"]) == ("verl_dr_grpo", "dr_grpo", "none", 0)
    # Table 1's methods and the stability study's, at the paper scale
    assert plan.p.cfg.train["countdown"].methods == ["es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov"]
    assert plan.p.cfg.stability.methods == ["es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov"]
    tiny = _plan("config.yaml")
    assert list(tiny.p.grid_cells("tiny", "grpo30")) == ["default"]
    assert tiny.cell_runs("countdown", "tiny", "grpo8", 0) == [
        "results/runs/countdown/tiny/grpo8/grid/lr0.0001/seed0", "results/runs/countdown/tiny/grpo8/grid/lr0.0003/seed0"]


def test_selection_keeps_the_best_final_training_reward(tmp_path):
    assert final_train_reward([{"reward_mean": x} for x in (0.0, 0.0, 0.0, 0.4, 0.6, 0.2, 0.2, 1.0)]) == pytest.approx(0.6)
    assert choose({"a": 0.5, "b": 0.5, "c": 0.1}) == "a"
    cells = {}
    for name, rewards in (("lr1", [0.1, 0.2, 0.3, 0.3]), ("lr2", [0.1, 0.2, 0.5, 0.6])):
        d = tmp_path / name
        (d / "checkpoint").mkdir(parents=True)
        (d / "checkpoint" / "model.safetensors").write_text(name)
        (d / "log.jsonl").write_text("".join(json.dumps({"step": i, "reward_mean": r}) + "\n"
                                             for i, r in enumerate(rewards)))
        (d / "manifest.json").write_text(json.dumps({"settings": {"learning_rate": float(name[-1])},
                                                     "budget": {"steps": 4, "samples_per_step": 8}}))
        cells[name] = d
    out = tmp_path / "results/runs/countdown/tiny/grpo8/seed0"
    rec = select_run(cells, {"learning_rate": [1.0, 2.0]}, out)
    assert rec["winner"] == "lr2" and rec["train_reward"] == pytest.approx(0.6)
    assert (out / "checkpoint" / "model.safetensors").read_text() == "lr2"
    df = build_table3([out / "selection.json"], {"tiny": {"display": "tiny"}}, tmp_path / "t3")
    assert df.loc[0, "Selected"] == "learning_rate=2" and df.loc[0, "Method"] == "GRPO-z (8)"
    assert "learning_rate in {1, 2}" in (tmp_path / "t3.md").read_text()
    assert "\\begin{tabular}" in (tmp_path / "t3.tex").read_text()
    assert pd.read_csv(tmp_path / "t3.csv").loc[0, "Training reward"] == pytest.approx(0.6)


def test_selection_records_the_winners_settings_under_their_current_names(tmp_path):
    """selection.json copies the winner's settings as its manifest has them (PPO's prompts_per_step, beta)."""
    d = tmp_path / "cell"
    (d / "checkpoint").mkdir(parents=True)
    (d / "log.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.5}) + "\n")
    settings = {"algorithm": "ppo", "prompts_per_step": 256, "beta": 0.001, "actor_learning_rate": 1e-6}
    budget = {"steps": 1, "samples_per_step": 256}
    (d / "manifest.json").write_text(json.dumps({"settings": settings, "budget": budget}))
    rec = select_run({"default": d}, {}, tmp_path / "out")
    assert rec["settings"] == settings
    assert json.loads((tmp_path / "out" / "selection.json").read_text())["settings"] == settings


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["methods"]["grpo8"].__setitem__("loss_type", "grpo"), "methods.grpo8.loss_type"),
        (lambda c: c["methods"]["drgrpov"].__setitem__("scale_rewards", "group"), "scale_rewards"),
        (lambda c: c["methods"]["grpov"].__setitem__("updates_per_generation", 0), "methods.grpov.updates_per_generation"),
        (lambda c: c["methods"].__setitem__("ppo", {"beta": -1}), "methods.ppo.beta"),
        (lambda c: c["methods"].__setitem__("ppo", {"budget_from": "ppo"}), "methods.ppo.budget_from"),
        (lambda c: c["methods"]["grpo8"].__setitem__("algorithm", "reinforce"), "methods.grpo8"),
    ],
)
def test_bad_rl_settings_name_the_field(edit, message):
    cfg = read_config(REPO / "config" / "config.yaml", REPO)  # with the methods it extends
    edit(cfg)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        check_config(cfg, "config/config.yaml", root=REPO)


def test_a_grid_key_must_be_a_setting_of_the_method(tmp_path):
    reg = load_yaml(REPO / "config" / "models.yaml")
    reg["models"]["tiny"]["methods"]["grpo8"]["grid"] = {"learnig_rate": [1e-4]}
    (tmp_path / "models.yaml").write_text(json.dumps(reg))
    shutil.copytree(REPO / "config" / "model_configs", tmp_path / "config" / "model_configs")  # the hub entries'
    for name in ("published.yaml",):
        (tmp_path / name).write_text((REPO / "config" / name).read_text())
    cfg = read_config(REPO / "config" / "config.yaml", root=REPO)
    cfg["registry"], cfg["published"] = str(tmp_path / "models.yaml"), str(tmp_path / "published.yaml")
    with pytest.raises(ConfigError, match=r"models\.tiny\.methods\.grpo8\.grid\.learnig_rate: not a setting"):
        check_config(cfg, "config/config.yaml", root="/")


def _selection(algorithm: str, names: list[str]) -> dict:
    """A selection record of a grid over ``names`` (one value each, and one extra cell), its settings so named."""
    grid = {"learning_rate": [1e-6], **{name: [0.001] for name in names}, "cells": [{name: 1024 for name in names}]}
    settings = {"algorithm": algorithm, "learning_rate": 1e-6, **{name: 0.001 for name in names}}
    return {"model": "tiny", "method": algorithm, "seed": 0, "grid": grid, "settings": settings,
            "winner_settings": {name: 0.001 for name in names}, "train_reward": 0.5, "cells": ["c"],
            "budget": {"steps": 4, "samples_per_step": 8}}


@pytest.mark.parametrize("algorithm", sorted(FORMER_NAMES))
def test_renamed_settings_keep_their_run_paths_and_table3_text(algorithm):
    """Grid cells and Table 3 show a renamed setting under the name it had for that algorithm (FORMER_NAMES)."""
    former = FORMER_NAMES[algorithm]
    before, after = _selection(algorithm, list(former.values())), _selection(algorithm, list(former))
    assert table3([after], {}).equals(table3([before], {}))
    assert all(f"{old} in {{0.001}}" in table3([after], {}).loc[0, "Grid"] for old in former.values())
    for new, old in former.items():
        assert cell_name({new: 0.001}, algorithm) == cell_name({old: 0.001})


def test_cells_keep_their_short_names_and_table2_its_setting_names():
    from esrepro.planning.notes import table2_notes

    assert cell_name({"learning_rate": 1e-5, "max_new_tokens": 1024}, "grpo") == "lr1e-05_len1024"
    assert cell_name({"actor_learning_rate": 1e-6, "beta": 0.001}, "ppo") == "alr1e-06_kl0.001"
    assert cell_name({"learning_rate": 1e-6, "beta": 0.001}, "dr_grpo") == "lr1e-06_beta0.001"
    assert cell_name({"max_new_tokens": 1024}, "es") == "max_new_tokens1024"  # ES always called it so
    grpo = next(n for n in table2_notes(_plan("config.yaml").p) if n.startswith("GRPO: "))
    assert "mask_truncated_completions=False, max_completion_length=24, max_grad_norm=1.0" in grpo
