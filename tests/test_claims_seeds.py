"""Every claims row names the training seeds it rests on: Table 1's rows drawn as real runs with one and with three
seeds per method, the conciseness study's four seeds, the ESSA study's one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from claims_fixture import N_COUNTDOWN, conciseness_fixture, display, essa_fixture, eval_run, published, spec
from esrepro.report.claims.evidence import arm_seeds, file_seed
from esrepro.report.claims.rows import ONE_SEED, seeds_text
from esrepro.report.claims.table import claim_rows, claims_table

MODEL = "qwen2.5-3b-instruct"


def _table1(root: Path, seeds: dict[str, int], rng: np.random.Generator) -> Path:
    """Table 1's evaluations of :data:`MODEL` at the paper's accuracies, ``seeds[method]`` training seeds per
    method (the base model evaluated once), each problem right independently."""
    row = published()["tables"]["table1_countdown"]["models"][MODEL]
    for method, acc in row.items():
        for seed in range(1 if method == "base" else seeds.get(method, seeds["*"])):
            eval_run(root, "countdown", MODEL, method, acc, N_COUNTDOWN, rng, seed=seed)
    return root


def _rows(root: Path, only: list[str]) -> pd.DataFrame:
    files = [str(p) for p in root.rglob("*") if p.is_file()]
    rows = claim_rows(root, files, published(), display(), spec(), only=only)
    return claims_table(rows, "paper").set_index("Id")


@pytest.mark.parametrize("n, expected", [(1, f"1 seed each ({ONE_SEED})"), (3, "3 seeds each")])
def test_table1_rows_name_their_seeds(tmp_path, n, expected):
    root = _table1(tmp_path / "results", {"*": n}, np.random.default_rng(n))
    df = _rows(root, ["es_improves_base", f"es_beats_rl.{MODEL}"])
    assert df.loc[f"es_beats_rl.{MODEL}", "Seeds"] == expected
    one = f" ({ONE_SEED})" if n == 1 else ""
    assert df.loc["es_improves_base", "Seeds"] == f"{n} seed{'s' if n > 1 else ''}{one}"  # ES alone is trained


def test_arms_with_different_seeds_are_named_and_one_seed_is_flagged(tmp_path):
    root = _table1(tmp_path / "results", {"es": 3, "ppo": 1, "*": 3}, np.random.default_rng(5))
    seeds = _rows(root, [f"es_beats_rl.{MODEL}"]).loc[f"es_beats_rl.{MODEL}", "Seeds"]
    assert seeds == f"5 arms 3 each, PPO-z 1 ({ONE_SEED})"


def test_the_studies_seeds(tmp_path):
    root = tmp_path / "results"
    conciseness_fixture(root, np.random.default_rng(1))
    essa_fixture(root, np.random.default_rng(2))
    df = _rows(root, ["es_stable_across_runs", "essa_faster_than_grpo"])
    assert df.loc["es_stable_across_runs", "Seeds"] == "4 seeds each"
    assert df.loc["essa_faster_than_grpo", "Seeds"] == f"1 seed each ({ONE_SEED})"


def test_seed_text_from_paths():
    assert file_seed("results/eval/countdown/m/es/seed2/test/metrics.json") == ("m", "es", 2)
    assert file_seed("results/kl/conciseness/m/grpo/seed3/kl.json") == ("m", "grpo", 3)
    assert file_seed("results/runs/gsm8k/m/essa_ref/seed0/manifest.json") == ("m", "essa_ref", 0)
    files = {"evals": [f"r/eval/t/{m}/es/seed{s}/test/metrics.json" for m in ("a", "b") for s in range(3)]
             + ["r/eval/t/a/base/seed0/test/metrics.json", "r/eval/t/a/ppo/seed0/test/metrics.json",
                "r/eval/t/b/ppo/seed0/test/metrics.json", "r/eval/t/b/ppo/seed1/test/metrics.json"]}
    assert arm_seeds(files) == {"es": [3, 3], "ppo": [1, 2]}
    assert seeds_text(arm_seeds(files)) == f"ES 3, PPO-z 1-2 ({ONE_SEED})"
    assert seeds_text({}) == "no trained run"


# --- claims.seeds: more seeds for the runs Table 1's claims read ------------------------------------------------------
def _paper(seeds: int | None):
    import copy

    from claims_fixture import ROOT, pipeline
    from esrepro.config import read_config
    from esrepro.planning.load import load_pipeline

    if seeds is None:
        return pipeline()
    cfg = copy.deepcopy(read_config(ROOT / "config" / "paper.yaml", root=ROOT))
    cfg["claims"] = {"seeds": seeds}
    return load_pipeline(cfg, "config/paper.yaml", root=ROOT)


def test_claims_seeds_train_table1s_es_and_rl_runs_again():
    from esrepro.planning.claim_cost import table1_cost
    from esrepro.planning.claim_plan import ClaimPlan
    from esrepro.planning.plan import Plan

    one, three = _paper(None), _paper(3)
    runs = set(Plan(three).train_runs("countdown"))
    for model in three.train_models("countdown"):
        for method in three.train_methods("countdown"):
            trained = method == "es" or three.is_rl("countdown", method)
            assert ((model, method, 2) in runs) == trained, (model, method)
    assert set(Plan(one).train_runs("countdown")) < runs
    assert Plan(three).train_runs("conciseness") == Plan(one).train_runs("conciseness")  # no other study's runs
    row = f"es_beats_rl.{MODEL.replace('3b', '7b')}"
    assert {k[4] for k in ClaimPlan(Plan(three)).keys(row)} == {0, 1, 2}
    assert table1_cost(three).gpu_hours > 2 * table1_cost(one).gpu_hours


def test_the_default_config_keeps_its_runs():
    from claims_fixture import pipeline

    p = pipeline("config.yaml")
    assert p.cfg.claims.seeds == 1
    assert all(not p.claims_seeds("countdown", m, meth) for m in p.train_models("countdown")
               for meth in p.train_methods("countdown"))


@pytest.mark.parametrize("seeds", [0, -2])
def test_claims_seeds_below_one_is_refused(seeds):
    from esrepro.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _paper(seeds)
    assert any("claims.seeds" in p and "at least 1" in p for p in err.value.problems), err.value.problems


def test_claim_costs_end_with_table1s_claims_together(capsys):
    from claims_fixture import ROOT
    from esrepro.planning.claim_cost import main

    assert main(str(ROOT / "config" / "paper.yaml")) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("Table 1's claims together (1 seed a run; each job once): ") and "GPU-h requested" in last
