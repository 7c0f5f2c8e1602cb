"""Low-rank ES (EGGROLL) on vLLM's CPU build: members as LoRA adapters, all scored in one ``generate`` call.

Against the weights W + sigma A_i B_iᵀ / √r written into the model (by this test's own reference, on
transformers; and in vLLM's workers by the library's in-place path), float32; the update pushed into the
workers against the transformers engine's; the update against the scored adapters' factors, with the workers on
an emulated GPU; one eggroll iteration through the population worker on each backend.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.torch import load_file

from conftest import SMALL_ARCH, make_model_dir
from test_eggroll import PROMPTS, _emulated_gpu_workers, _generate_with, _member_state, _off_the_adapter

pytestmark = pytest.mark.vllm

if os.environ.get("ESREPRO_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (make test: a missing vLLM fails, it never skips)
else:
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")

#: Head size 32: the smallest vLLM's CPU attention supports.
ARCH = dict(SMALL_ARCH, hidden_size=64, intermediate_size=128)
KV = 32 * 2**20
MAX_NEW = 10
SIGMA = 0.08
RANK = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("eggroll_vllm") / "model", ARCH)


@pytest.fixture(scope="module")
def engine(model_dir):
    from esrepro.backends.vllm_eggroll import EggrollVLLMEngine

    e = EggrollVLLMEngine(model_dir, rank=RANK, max_loras=4, dtype="float32", device="cpu", kv_cache_memory_bytes=KV,
                          restore="exact")
    yield e
    e.close()


@pytest.fixture(scope="module")
def in_place(model_dir):
    """The ES vLLM engine with low-rank noise, members written into its weights (kept to the module's end: vLLM's
    engines in one process share its distributed state, which the first one torn down takes with it)."""
    from esrepro.backends.vllm_engine import VLLMEngine

    return VLLMEngine(model_dir, dtype="float32", device="cpu", kv_cache_memory_bytes=KV, restore="exact",
                      lowrank=RANK, noise="iid")


def test_members_through_adapters_in_one_call_equal_the_written_weights(engine, in_place, model_dir):
    """N members' adapters, ONE LLM.generate call: each member's responses == vLLM with the member written into its
    weights in place (the ES vLLM engine with low-rank noise) == transformers with the reference weights
    W + sigma A Bᵀ / √r; the base is untouched."""
    from esrepro.backends.vllm_engine import VLLMEngine
    from esrepro.perturb.noise import member_seed

    seeds = [member_seed(9, 0, i) for i in range(4)]
    before = engine.checksum()
    base_out = VLLMEngine.generate(engine, PROMPTS, MAX_NEW)
    calls = []
    generate = engine.llm.generate

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return generate(*args, **kwargs)

    engine.llm.generate = counted
    try:
        handles = engine.prepare_members(seeds, SIGMA)
        batched = engine.generate_members(handles, PROMPTS, MAX_NEW)
        engine.release_members(handles)
    finally:
        engine.llm.generate = generate
    assert calls == [len(seeds) * len(PROMPTS)], "the members were not scored in one generate call"
    assert engine.checksum() == before, "scoring members changed the base weights"
    assert not list(engine.adapters.scratch.iterdir()), "released adapters left folders behind"
    changed = 0
    for seed, got in zip(seeds, batched, strict=True):
        in_place.perturb(seed, SIGMA)  # the library's in-place low-rank path in vLLM's workers
        in_weights = in_place.generate(PROMPTS, MAX_NEW)
        in_place.restore(seed, SIGMA)
        reference = _generate_with(model_dir, _member_state(model_dir, seed, SIGMA, RANK))  # this test's weights
        assert got == in_weights, seed
        assert got == reference, seed
        changed += got != base_out
    assert engine.checksum() == before == in_place.checksum()
    assert changed >= 2, "the members should change the outputs (test too weak)"
    # one member at a time through perturb / generate / restore gives the same
    engine.perturb(seeds[1], SIGMA)
    assert engine.generate(PROMPTS, MAX_NEW) == batched[1]
    engine.restore(seeds[1], SIGMA)
    assert engine.generate(PROMPTS, MAX_NEW) == base_out


def test_update_pushed_into_vllm_equals_the_transformers_update(engine, model_dir):
    """Only the update touches the base: seeds and weights into vLLM's workers give the transformers engine's
    weights bit for bit (same checksum), and the same greedy outputs."""
    from esrepro.backends.hf import HFEngine
    from esrepro.perturb.noise import member_seed

    hf = HFEngine(model_dir, rank=RANK)
    assert hf.checksum() == engine.checksum()
    seeds, weights = [member_seed(2, 1, i) for i in range(5)], [1.1, -0.4, 0.0, -1.3, 0.6]
    for e in (hf, engine):
        e.apply_update(seeds, weights, 0.05)
    assert hf.checksum() == engine.checksum()
    assert engine.generate(PROMPTS, MAX_NEW) == hf.generate(PROMPTS, MAX_NEW)


def test_the_update_in_vllms_workers_moves_along_the_scored_adapter(engine, tmp_path):
    """The adapter a member is scored with holds the factors that the update in vLLM's workers draws again, with
    the workers' weights on an emulated GPU (every generator made inside a call into the workers draws another
    stream than the CPU's, as CUDA's does): after a one-member update of weight 1, W' - W = alpha * lora_B lora_A
    / √r on every linear projection (the resume files, HF layout, before and after)."""
    from esrepro.perturb.adapter import ADAPTER_WEIGHTS, adapter_tensors
    from esrepro.perturb.noise import member_seed

    seed, alpha = member_seed(6, 2, 0), 0.5
    rpc = engine.llm.collective_rpc
    engine.llm.collective_rpc = _emulated_gpu_workers(rpc)
    try:
        (request,) = engine.prepare_members([seed], SIGMA)
        adapter = load_file(os.path.join(request.lora_path, ADAPTER_WEIGHTS))
        engine.release_members([request])
        engine.save_state(tmp_path / "before.safetensors")
        engine.apply_update([seed], [1.0], alpha)
        engine.save_state(tmp_path / "after.safetensors")
    finally:
        engine.llm.collective_rpc = rpc
    before, after = load_file(tmp_path / "before.safetensors"), load_file(tmp_path / "after.safetensors")
    deltas = {name: after[f"p{k}"] - before[f"p{k}"] for name, k, _ in engine.targets}
    apart = _off_the_adapter(engine.targets, adapter, deltas, alpha, RANK)
    assert not apart, f"the update's factors are not the scored adapter's on {len(apart)} tensors: {apart[:3]}"
    cpu_draw = adapter_tensors(engine.targets, seed, RANK, "iid")
    off_cpu = _off_the_adapter(engine.targets, cpu_draw, deltas, alpha, RANK)
    assert len(off_cpu) == len(engine.targets), "the emulated GPU stream did not reach the workers' update"


class _LoadedByGenerate:
    """The engine without ``load_members``: vLLM loads the adapters inside the generate call, as before that step."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def __getattr__(self, name: str):
        if name == "load_members":
            raise AttributeError(name)
        return getattr(self.engine, name)


def test_loading_the_adapters_first_is_a_phase_of_its_own_and_changes_no_reward(engine, tmp_path):
    """The batched path loads the members' adapters into vLLM before its generate call (``load_members``: loaded
    and listed before generation) and reports loading and grading as phases of their own; the rewards are those of
    the same members with vLLM loading the adapters inside the generate call."""
    from esrepro.perturb.noise import member_seed
    from esrepro.population.spec import Scoring
    from esrepro.population.worker import BATCHED_PHASES, PopulationWorker
    from esrepro.tasks.conciseness import prepare

    prepare(tmp_path / "data", {"kind": "generated"}, seed=0)
    examples = [json.loads(x) for x in (tmp_path / "data" / "train.jsonl").read_text().splitlines()][:3]
    worker = PopulationWorker.__new__(PopulationWorker)  # the module's engine, not a second one
    worker.prompts, worker.mean_reward = Scoring("conciseness", examples, MAX_NEW).build()
    worker.max_new_tokens, worker.example_scores = MAX_NEW, None
    seeds = [member_seed(4, 0, i) for i in range(4)]
    listed = []
    generate_members = engine.generate_members

    def generating(requests, *args):
        listed.append({r.lora_int_id for r in requests} <= engine.llm.llm_engine.list_loras())
        return generate_members(requests, *args)

    out = {}
    engine.generate_members = generating
    try:
        for how, e in (("in generate", _LoadedByGenerate(engine)), ("loaded first", engine)):
            engine.llm.reset_prefix_cache()
            worker.engine = e
            out[how] = worker.members(seeds, SIGMA, list(range(len(seeds))))
    finally:
        del engine.generate_members
    (before, _), (rewards, seconds) = out["in generate"], out["loaded first"]
    assert listed == [False, True], "the adapters were not loaded before the generate call"
    assert rewards == before
    assert len(set(rewards)) > 1, "the members should score differently (test too weak)"
    assert all(seconds[k] > 0 for k in ("perturb", *BATCHED_PHASES, "generation", "restore")), seconds
    assert not engine.llm.llm_engine.list_loras() and not list(engine.adapters.scratch.iterdir())


def test_one_iteration_on_vllm_matches_transformers(model_dir, tmp_path):
    """One eggroll iteration through the population worker: vLLM (members as adapters, one call) and transformers
    (members in place) score every member alike and end with the same weights."""
    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import run_es
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import EggrollSettings
    from esrepro.tasks.conciseness import prepare

    prepare(tmp_path / "data", {"kind": "generated"}, seed=0)
    examples = [json.loads(x) for x in (tmp_path / "data" / "train.jsonl").read_text().splitlines()][:4]
    out = {}
    for backend in ("hf", "vllm"):
        cfg = EggrollSettings(iterations=1, population=6, sigma=0.1, alpha=0.02, rank=2, max_new_tokens=8,
                              train_examples=len(examples), batch_size=8, resume_every=1, backend=backend,
                              kv_cache_memory_bytes=KV if backend == "vllm" else None)
        spec = EngineSpec(str(model_dir), backend=backend, rank=cfg.rank, max_loras=cfg.population, noise=cfg.noise,
                          restore=cfg.restore, kv_cache_memory_bytes=cfg.kv_cache_memory_bytes)
        evaluator = SerialEvaluator(spec, Scoring("conciseness", examples, cfg.max_new_tokens))
        out[backend] = run_es(evaluator, cfg, tmp_path / backend, seed=1, progress=False)[0]
        evaluator.worker.engine.close() if backend == "vllm" else None
    hf, vl = out["hf"], out["vllm"]
    assert len(set(hf["rewards"])) > 1, "the members should score differently (test too weak)"
    assert vl["rewards"] == hf["rewards"] and vl["seeds"] == hf["seeds"]
    assert vl["checksum"] == hf["checksum"]
    assert np.isfinite(vl["seconds_generation"])
    # the batched path's phases in the log; the transformers engine's log keeps its keys
    assert vl["seconds_load"] > 0 and vl["seconds_grading"] > 0
    assert "seconds_load" not in hf and "seconds_grading" not in hf
