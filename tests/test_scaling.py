"""The memory and time arithmetic of the paper's runs (esrepro.planning.scaling) and docs/scaling.md's table of it."""

from __future__ import annotations

import pytest

from conftest import REPO
from esrepro.config import load_yaml
from esrepro.planning.load import load_pipeline
from esrepro.planning.scaling import attempts, job_cost, markdown_table, model_parameters, table1_costs

GPU_GB = 80


@pytest.fixture(scope="module")
def paper():
    return load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)


def test_parameters_are_counted_from_the_config_not_the_size_text(paper):
    """A model's P is its entry's config built on the meta device (Qwen2.5-7B-Instruct: 7.62B, not its size "7B");
    the size text is display only: another text prices the same."""
    assert model_parameters(paper, "qwen2.5-7b-instruct") == 7_615_616_512
    assert model_parameters(paper, "llama-3.2-1b-instruct") == 1_235_814_400
    before = job_cost(paper, "countdown", "qwen2.5-7b-instruct", "es")
    entry = paper.registry["qwen2.5-7b-instruct"]
    paper.registry["qwen2.5-7b-instruct"] = entry.model_copy(update={"size": "about seven billion"})
    try:
        assert job_cost(paper, "countdown", "qwen2.5-7b-instruct", "es") == before
    finally:
        paper.registry["qwen2.5-7b-instruct"] = entry
    assert before.memory_gb == {"weights (bf16)": round(2 * 7_615_616_512 / 1e9, 1)}


def test_docs_table_is_the_arithmetic_of_the_paper_config(paper):
    text = (REPO / "docs" / "scaling.md").read_text()
    assert markdown_table(table1_costs(paper)) in text, \
        "docs/scaling.md's table is stale: regenerate it from esrepro.planning.scaling.markdown_table(table1_costs(...))"


def test_every_table1_run_fits_its_gpus_and_finishes_within_its_attempts(paper):
    """With the paper config's sharding every run's state fits an 80 GB GPU with room for activations, and a
    run finishes within the profile's three attempts (retries: 2) at its registry runtime."""
    for cost in table1_costs(paper):
        assert cost.memory_total_gb < 0.75 * GPU_GB, (cost.model, cost.method, cost.memory_gb)
        assert attempts(cost) <= 3, (cost.model, cost.method, cost.hours, cost.runtime_hours)
        assert cost.completions == 3_000_000  # every method at the ES sample budget


def test_unsharded_rl_would_not_fit(paper):
    """16 bytes a parameter of float32 master, gradients and AdamW: 7.6B PPO (actor and critic) needs ~244 GB on
    one GPU under ddp, which is why the paper config shards."""
    params = 7_615_616_512  # Qwen2.5-7B-Instruct, counted from its config
    cost = job_cost(paper, "countdown", "qwen2.5-7b-instruct", "ppo")
    assert cost.memory_gb["float32 master, gradients, AdamW"] == round(16 * params * 2 / 8 / 1e9, 1) == 30.5
    settings = paper.method_settings("qwen2.5-7b-instruct", "countdown", "ppo")
    assert settings.sharding == "fsdp"
    assert 16 * params * 2 / 1e9 > GPU_GB


@pytest.mark.parametrize("hours", [0.01, 0.17, 0.3, 0.65, 1.4, 5.0])
def test_a_step_asks_for_its_estimate_in_one_attempt(hours):
    """1.25x the estimate rounded up, at least 15 minutes, at most the registry's runtime."""
    from esrepro.planning.scaling import STEP_FLOOR_MINUTES, step_minutes

    minutes = step_minutes(hours, ceiling=720)
    assert minutes >= max(STEP_FLOOR_MINUTES, 1.25 * hours * 60) and minutes <= 2 * max(hours * 60, 15)
    assert step_minutes(hours, ceiling=20) <= 20
