"""The transformers backend's generation paths: static KV cache with compiled decoding, and continuous batching.

On CPU both must return exactly the default path's greedy outputs (same stop ids, same BOS
handling, same token counts), and keep doing so while ES changes the weights in place
between calls: nothing compiled or cached may hold on to earlier weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from conftest import SMALL_ARCH, make_model_dir
from esrepro.backends.hf import HFBackend, HFEngine
from esrepro.backends.spec import EngineSpec
from esrepro.settings.base import Settings
from esrepro.settings.methods import ESSettings

torch.set_num_threads(1)

# six prompts (1 to 45 tokens) in batches of four: two batch shapes; the long ones fill a CPU page (32 tokens) of
# the paged cache, so a prefix block kept across calls would be found and reused
PROMPTS = [
    "Using the numbers [3 4], make 7.",
    "Using the numbers [1 2 5], make 8. " * 3,
    "<answer>",
    "Using the numbers [9 9 1], make 81. <think> 9 * 9 = 81 </think>" * 2,
    "a longer prompt " * 3,
    "7 8 9",
]
NEW = 24
#: Wide initial weights: a random model whose greedy tokens vary (at 0.02 each response repeats one token).
ARCH = {**SMALL_ARCH, "initializer_range": 0.3, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with a second end-of-sequence id: a token the default path emits a few steps into some
    responses, so some stop early and others run to the limit."""
    out = make_model_dir(tmp_path_factory.mktemp("two_eos"), ARCH)
    backend = HFBackend(out)
    enc = backend._encode(PROMPTS)
    gen = backend.model.generate(**enc, max_new_tokens=NEW, do_sample=False,
                                 pad_token_id=backend.tokenizer.pad_token_id, eos_token_id=backend.eos_ids)
    rows = gen[:, enc["input_ids"].shape[1]:].tolist()
    counts: dict[int, int] = {}
    for row in rows:
        for t in set(row[2:]) - set(row[:2]):
            counts[t] = counts.get(t, 0) + 1
    second = next((t for t, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n < len(rows)), None)
    if second is None:
        pytest.skip("the random model emits no token that stops only some responses")
    config = GenerationConfig.from_pretrained(out)
    config.eos_token_id = [backend.tokenizer.eos_token_id, second]
    config.save_pretrained(out)
    return out


def _run(engine: HFEngine) -> dict[str, list[str]]:
    """Outputs before, under a perturbation, after restoring, after an update, after reloading the start."""
    out = {"before": engine.generate(PROMPTS, NEW)}
    state = {k: v.clone() for k, v in engine.weights.state().items()}
    engine.perturb(11, 0.05)
    out["perturbed"] = engine.generate(PROMPTS, NEW)
    engine.restore(11, 0.05)
    out["restored"] = engine.generate(PROMPTS, NEW)
    engine.apply_update([1, 2, 3], [1.0, -0.5, 0.7], 0.05)
    out["updated"] = engine.generate(PROMPTS, NEW)
    engine.weights.load_state(state)
    out["reloaded"] = engine.generate(PROMPTS, NEW)
    return out


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[dict[str, list[str]], int]:
    engine = HFEngine(model_dir, batch_size=4)
    return _run(engine), engine.token_count()


def test_the_reference_exercises_what_it_should(reference, model_dir):
    out, tokens = reference
    assert out["restored"] == out["before"] == out["reloaded"]
    assert out["perturbed"] != out["before"] and out["updated"] != out["before"]
    assert len(HFBackend(model_dir).eos_ids) == 2
    assert 0 < tokens < 5 * len(PROMPTS) * NEW  # some responses stopped at an end-of-sequence id


@pytest.mark.parametrize("generation", ["static", "continuous"])
@pytest.mark.slow
def test_greedy_outputs_equal_the_default_path_through_weight_changes(generation, model_dir, reference):
    """Perturb, generate, restore, generate == before; and every state's outputs equal the default path's,
    which a compiled graph or KV cache holding earlier weights would break."""
    out, tokens = reference
    engine = HFEngine(model_dir, batch_size=4, generation=generation)
    assert _run(engine) == out
    assert engine.token_count() == tokens


def test_static_keeps_one_cache_per_batch_shape(model_dir):
    backend = HFBackend(model_dir, batch_size=4, generation="static")
    first = backend.generate(PROMPTS, NEW)
    caches = dict(backend._static_caches)
    assert sorted(b for b, _ in caches) == [2, 4]
    assert backend.generate(PROMPTS, NEW) == first
    assert all(backend._static_caches[k] is c for k, c in caches.items())  # reused: fixed addresses for the graphs
    backend.generate(PROMPTS[:2], 4)  # another prompt set: its own cache, the old ones dropped
    assert len(backend._static_caches) == 1


def test_continuous_rebuilds_only_when_a_workload_outgrows_its_cache(model_dir):
    backend = HFBackend(model_dir, batch_size=4, generation="continuous")
    reference = HFBackend(model_dir, batch_size=4)
    assert backend.generate(PROMPTS[:3], 8) == reference.generate(PROMPTS[:3], 8)
    manager = backend.model._cached_continuous_batching_manager
    assert backend.generate(PROMPTS[:2], 8) == reference.generate(PROMPTS[:2], 8)
    assert backend.model._cached_continuous_batching_manager is manager
    assert backend.generate(PROMPTS, NEW) == reference.generate(PROMPTS, NEW)
    assert backend.model._cached_continuous_batching_manager is not manager


def test_continuous_refuses_a_logits_processor_it_cannot_apply(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    config = GenerationConfig.from_pretrained(model_dir)
    config.repetition_penalty = 1.3
    config.save_pretrained(model_dir)
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        HFBackend(model_dir, generation="continuous").generate(PROMPTS[:1], 4)
    assert HFBackend(model_dir, generation="static").generate(PROMPTS[:2], 6) == \
        HFBackend(model_dir).generate(PROMPTS[:2], 6)


def test_the_generation_setting_reaches_the_engine(tiny_model_dir):
    with pytest.raises(ValueError, match="unknown generation 'fast'"):
        HFBackend(tiny_model_dir, generation="fast")
    assert EngineSpec(str(tiny_model_dir), generation="static").build().generation == "static"
    assert ESSettings().generation == "default"
    with pytest.raises(ValueError, match="generation static is a path of the hf backend"):
        ESSettings(generation="static", backend="vllm")
    assert issubclass(ESSettings, Settings)
