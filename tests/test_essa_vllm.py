"""The vLLM ESSA engine, run for real on vLLM's CPU build, against the transformers ESSA engine.

Same SFT adapter, same saved space, same candidates: the transformers engine merges the SFT
adapter and applies a candidate to the merged weights; the vLLM engine serves the base with the
candidate's rebuilt LoRA adapter, all candidates in one generate call. Greedy outputs agree
unless float rounding (merged weight vs. base + LoRA) flips a near-tied token: the tests count
such flips and bound them rather than hide them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import SMALL_ARCH, make_model_dir

pytestmark = pytest.mark.vllm

if os.environ.get("ESREPRO_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (make test: a missing vLLM fails, it never skips)
else:
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")

#: Head size 32: the smallest vLLM's CPU attention supports.
ARCH = dict(SMALL_ARCH, hidden_size=64, intermediate_size=128)
PAIRS = [(f"Using the numbers [{a} {b}], make {a + b}.", f" <think> {a} + {b} </think>\n<answer>{a} + {b}</answer>")
         for a in range(1, 21) for b in range(1, 11)]
SFT = dict(rank=8, alpha=16, epochs=2, learning_rate=0.05, batch_size=16)
PROMPTS = [f"Using the numbers [{a} {b}], make {a + b}." for a in (3, 7, 12, 18) for b in (2, 9)]
KV = 32 * 2**20
MAX_NEW = 12


@pytest.fixture(scope="module")
def essa_model(tmp_path_factory):
    """(base dir, SFT adapter dir, space path) of a tiny Qwen2 LoRA-SFT'd on the addition pairs."""
    import torch

    from esrepro.essa.lora import load_lora, sft_lora
    from esrepro.essa.svd import SingularValueSpace

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("essa_vllm")
    base = make_model_dir(root / "base", ARCH)
    sft_lora(base, PAIRS, seed=0, out_dir=root / "sft", **SFT)
    space = SingularValueSpace.build(load_lora(base, root / "sft"), fraction=0.5)
    space.save(root / "space.safetensors")
    return base, root / "sft", root / "space.safetensors"


@pytest.fixture(scope="module")
def engines(essa_model):
    from esrepro.essa.engine import ESSAEngine
    from esrepro.essa.vllm_engine import ESSAVLLMEngine

    base, adapter, space = essa_model
    v = ESSAVLLMEngine(base, adapter, space, dtype="float32", device="cpu", kv_cache_memory_bytes=KV, max_loras=8)
    h = ESSAEngine(base, adapter, space, dtype="float32", device="cpu")
    yield v, h
    v.close()


def candidates(space, n: int, scale: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [space.x0] + [space.x0 * (1 + rng.normal(0.0, scale, space.dim)) for _ in range(n - 1)]


def hf_outputs(h, xs) -> list[list[str]]:
    out = []
    for x in xs:
        h.apply(x)
        try:
            out.append(h.generate(PROMPTS, MAX_NEW))
        finally:
            h.restore()
    return out


def test_vllm_and_hf_essa_engines_generate_the_same(engines):
    """Per candidate (x0 and perturbed ones), batched vLLM == one-at-a-time transformers, greedy; flips counted."""
    v, h = engines
    xs = candidates(v.space, 12, 1.0, seed=1)
    ref = hf_outputs(h, xs)
    batched = v.generate_candidates(v.prepare_candidates(xs), PROMPTS, MAX_NEW)
    single = []
    for x in xs[:3]:
        v.apply(x)
        single.append(v.generate(PROMPTS, MAX_NEW))
        v.restore()
    assert single == batched[:3], "one candidate per call and all in one call differ"
    pairs = [(a, b) for ra, rb in zip(batched, ref, strict=True) for a, b in zip(ra, rb, strict=True)]
    flips = [(a, b) for a, b in pairs if a != b]
    print(f"\nvLLM vs transformers ESSA: {len(flips)} of {len(pairs)} greedy responses differ", flush=True)
    for a, b in flips[:5]:
        print(f"  vllm {a!r}\n  hf   {b!r}")
    assert len(set(map(tuple, ref))) > 1, "the candidates should change the outputs (test too weak)"
    assert len(flips) <= len(pairs) // 20, flips  # float rounding may flip a near tie, rarely
    # no candidate means the SFT adapter itself, which x0's rebuilt adapter matches
    assert v.generate(PROMPTS, MAX_NEW) == batched[0]


def test_bfloat16_flips_are_measured(essa_model):
    """In bfloat16 the merged weight (rounded once) and base + LoRA (each rounded, LoRA computed in bf16) differ by
    about a bf16 ulp, enough to flip greedy tokens of this near-random model: measured and reported, bounded loosely
    (here 2 of 64 responses differ; on a 3-epoch SFT of the same model, 32 candidates x 24 prompts x 24 tokens,
    98 of 768 did, 21 of 32 candidates, while vLLM serving the merged bf16 checkpoints without LoRA differed from
    transformers on 5 of 192). Float32 agrees exactly (the test above)."""
    from esrepro.essa.engine import ESSAEngine
    from esrepro.essa.vllm_engine import ESSAVLLMEngine

    base, adapter, space = essa_model
    v = ESSAVLLMEngine(base, adapter, space, dtype="bfloat16", device="cpu", kv_cache_memory_bytes=KV, max_loras=8)
    h = ESSAEngine(base, adapter, space, dtype="bfloat16", device="cpu")
    try:
        xs = candidates(v.space, 8, 1.0, seed=1)
        ref = hf_outputs(h, xs)
        got = v.generate_candidates(v.prepare_candidates(xs), PROMPTS, MAX_NEW)
    finally:
        v.close()
    pairs = [(a, b) for ra, rb in zip(got, ref, strict=True) for a, b in zip(ra, rb, strict=True)]
    flips = sum(a != b for a, b in pairs)
    print(f"\nbfloat16, vLLM (base + LoRA) vs transformers (merged): {flips} of {len(pairs)} greedy responses "
          f"differ", flush=True)
    assert flips <= len(pairs) // 2, "far more flips than bf16 rounding explains: the adapters are likely wrong"


def test_phi3_fused_qkv_adapters_on_vllm_match_transformers(tmp_path):
    """Phi-3's checkpoint fuses q, k and v: ESSA adapts its qkv_proj and o_proj (read off the architecture), and vLLM
    serves those adapters on its own qkv_proj as they are (Phi3ForCausalLM's packed_modules_mapping names it as
    itself): candidates' greedy outputs equal the transformers engine's in float32."""
    import torch

    from esrepro.essa.engine import ESSAEngine
    from esrepro.essa.lora import load_lora, sft_lora
    from esrepro.essa.svd import SingularValueSpace
    from esrepro.essa.vllm_engine import ESSAVLLMEngine
    from esrepro.io import read_json
    from test_other_families import make_family_dir

    torch.set_num_threads(1)
    base = make_family_dir(tmp_path / "base", "phi3")
    summary = sft_lora(base, PAIRS[:64], seed=0, out_dir=tmp_path / "sft", **SFT)
    assert summary["target_modules"] == ["o_proj", "qkv_proj"]
    assert read_json(tmp_path / "sft" / "adapter_config.json")["target_modules"] == ["o_proj", "qkv_proj"]
    space = SingularValueSpace.build(load_lora(base, tmp_path / "sft"), fraction=0.5)
    space.save(tmp_path / "space.safetensors")
    v = ESSAVLLMEngine(base, tmp_path / "sft", tmp_path / "space.safetensors", dtype="float32", device="cpu",
                       kv_cache_memory_bytes=KV, max_loras=8)
    h = ESSAEngine(base, tmp_path / "sft", tmp_path / "space.safetensors", dtype="float32", device="cpu")
    try:
        xs = candidates(v.space, 6, 1.0, seed=1)
        ref = hf_outputs(h, xs)
        got = v.generate_candidates(v.prepare_candidates(xs), PROMPTS, MAX_NEW)
        plain = v.generate(PROMPTS, MAX_NEW)
    finally:
        v.close()
    pairs = [(a, b) for ra, rb in zip(got, ref, strict=True) for a, b in zip(ra, rb, strict=True)]
    flips = [(a, b) for a, b in pairs if a != b]
    print(f"\nPhi-3, vLLM vs transformers ESSA: {len(flips)} of {len(pairs)} greedy responses differ", flush=True)
    assert len(set(map(tuple, ref))) > 1, "the candidates should change the outputs (test too weak)"
    assert len(flips) <= len(pairs) // 20, flips
    assert plain == got[0]


# -- in the pipeline: rewards against the transformers engine, and a killed run's resume ------------------------

from test_essa_train import SPEC, _log, _train_cmd, countdown_model, data_dir  # noqa: E402,F401  (fixtures)

ENV = {**os.environ, "TQDM_DISABLE": "1"}
#: sigma0 1.0: candidates far enough from the SFT values that their rewards differ (at 0.32 every one scores 0.1)
HF_SPEC = {**SPEC, "sigma0": 1.0}
VLLM_SPEC = {**HF_SPEC, "backend": "vllm", "kv_cache_memory_bytes": KV, "max_loras": 8}
FIELDS = ("rewards", "problems", "val_reward", "best_reward", "sigma")


def _run(cmd: list[str], timeout: int = 900) -> None:
    import subprocess

    subprocess.run(cmd, check=True, env=ENV, timeout=timeout)


@pytest.fixture(scope="module")
def hf_run(countdown_model, data_dir, tmp_path_factory) -> Path:  # noqa: F811 - the imported fixtures
    run = tmp_path_factory.mktemp("essa_hf") / "run"
    _run(_train_cmd(countdown_model, data_dir, run, HF_SPEC))
    return run


@pytest.fixture(scope="module")
def vllm_run(countdown_model, data_dir, tmp_path_factory) -> Path:  # noqa: F811 - the imported fixtures
    run = tmp_path_factory.mktemp("essa_vllm") / "run"
    _run(_train_cmd(countdown_model, data_dir, run, VLLM_SPEC))
    return run


def test_vllm_backend_run_matches_transformers_rewards(hf_run, vllm_run):
    """Same settings, same seed: every candidate's reward, hence the CMA-ES path, is the transformers engine's."""
    hf, vl = _log(hf_run), _log(vllm_run)
    rewards = [(a, b) for ra, rb in zip(hf, vl, strict=False)
               for a, b in zip(ra["rewards"], rb["rewards"], strict=False)]
    differ = sum(a != b for a, b in rewards)
    print(f"\nESSA run, vllm vs hf: {differ} of {len(rewards)} candidate rewards differ", flush=True)
    assert len({a for a, _ in rewards}) > 2, "the rewards hardly vary: the comparison would be weak"
    assert [[r.get(f) for f in FIELDS] for r in hf] == [[r.get(f) for f in FIELDS] for r in vl]
    manifest = json.loads((vllm_run / "manifest.json").read_text())
    assert manifest["settings"]["backend"] == "vllm" and manifest.get("backend", "vllm") == "vllm"
    assert (vllm_run / "checkpoint" / "model.safetensors").exists()
    assert (hf_run / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (vllm_run / "adapter" / "adapter_model.safetensors").read_bytes()


def test_vllm_backend_killed_run_resumes_identically(vllm_run, countdown_model, data_dir, tmp_path):  # noqa: F811
    from conftest import kill_once_resumable
    from esrepro.essa.strategy import CMAStrategy

    killed = tmp_path / "killed"
    cmd = _train_cmd(countdown_model, data_dir, killed, VLLM_SPEC)
    done = kill_once_resumable(cmd, ENV, killed, "completed_generations", timeout=600)
    assert 1 <= done < SPEC["iterations"]
    _run(cmd)
    assert [[r.get(f) for f in FIELDS] for r in _log(vllm_run)] == [[r.get(f) for f in FIELDS] for r in _log(killed)]
    sa = CMAStrategy.from_state((vllm_run / "cma_state.npz").read_bytes()).state_dict()
    sb = CMAStrategy.from_state((killed / "cma_state.npz").read_bytes()).state_dict()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert (vllm_run / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (killed / "adapter" / "adapter_model.safetensors").read_bytes()
    assert not (killed / "resume").exists()


def test_two_vllm_essa_engines_under_ray_match_the_serial_transformers_engine(
        vllm_run, countdown_model, data_dir):  # noqa: F811 - the imported fixtures
    """engines: 2 on the vllm backend (Ray actors, each batching its own candidates) == one transformers engine."""
    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.essa.strategy import CMAStrategy
    from esrepro.essa.svd import SingularValueSpace
    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator
    from esrepro.population.ray_session import ensure_ray
    from esrepro.population.spec import IndexedScoring

    examples = [json.loads(x) for x in (data_dir / "train.jsonl").read_text().splitlines()][32:48]
    sft = vllm_run / "sft"
    args = (str(countdown_model), str(sft / "adapter"), str(sft / "space.safetensors"))
    scoring = IndexedScoring("countdown", examples, max_new_tokens=40, fitness="reward")
    space = SingularValueSpace.load(sft / "space.safetensors")
    xs = CMAStrategy(space.x0, 1.0, 5, seed=7).ask()
    problems = [0, 3, 5, 8, 9, 12]
    want, _ = SerialEvaluator(ESSAEngineSpec(*args, batch_size=16), scoring).candidate_rewards(xs, problems)
    assert len(set(want)) > 1, "the rewards do not vary: the comparison would be weak"
    ensure_ray(num_cpus=2)
    spec = ESSAEngineSpec(*args, backend="vllm", kv_cache_memory_bytes=KV, max_loras=4)
    ray_eval = RayEvaluator(spec, scoring, engines=2, per_engine={"num_cpus": 1})
    try:
        got, seconds = ray_eval.candidate_rewards(xs, problems)
        assert got == want
        assert len(set(ray_eval.checksums())) == 1
        assert {"apply", "generation", "restore", "wall"} <= set(seconds)
    finally:
        ray_eval.close()


def test_a_worker_scores_all_its_candidates_in_one_vllm_call(vllm_run, countdown_model, data_dir):  # noqa: F811
    """PopulationWorker.candidates on the vLLM engine: one LLM.generate for every candidate, phases timed, the
    candidates' adapters dropped afterwards; the rewards are the one-at-a-time apply/generate/restore path's."""
    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.essa.strategy import CMAStrategy
    from esrepro.population.spec import IndexedScoring
    from esrepro.population.worker import PopulationWorker

    examples = [json.loads(x) for x in (data_dir / "train.jsonl").read_text().splitlines()][32:48]
    sft = vllm_run / "sft"
    spec = ESSAEngineSpec(str(countdown_model), str(sft / "adapter"), str(sft / "space.safetensors"),
                          backend="vllm", kv_cache_memory_bytes=KV, max_loras=4)
    worker = PopulationWorker(spec, IndexedScoring("countdown", examples, max_new_tokens=40, fitness="reward"))
    engine = worker.engine
    xs = CMAStrategy(engine.space.x0, 1.0, 6, seed=3).ask()
    calls = []
    generate = engine.llm.generate
    engine.llm.generate = lambda *a, **k: calls.append(len(a[0])) or generate(*a, **k)
    try:
        rewards, seconds = worker.candidates(xs, [1, 4, 6, 7])
    finally:
        engine.llm.generate = generate
    assert calls == [len(xs) * 4]  # six candidates (more than max_loras) x four problems, one call
    assert set(seconds) == {"apply", "generation", "restore"} and all(v >= 0 for v in seconds.values())
    assert engine.llm.llm_engine.list_loras() == set() and not any(engine.adapters.scratch.iterdir())
    one_by_one = []
    for x in xs:
        engine.apply(x)
        one_by_one.append(float(np.mean(worker.example_scores(engine.generate([worker.prompts[i] for i in
                                                                               (1, 4, 6, 7)], 40), [1, 4, 6, 7]))))
        engine.restore()
    assert rewards == one_by_one


def test_vllm_backend_refuses_int8_and_takes_int4():
    """vLLM's bitsandbytes plugin quantises a base to 4 bits as it loads, to 8 bits never: int8 stays on hf."""
    from esrepro.essa.vllm_engine import quantization_llm_kwargs
    from esrepro.settings.methods import ESSASettings

    with pytest.raises(ValueError, match="precision int8 runs on the hf backend only"):
        ESSASettings(backend="vllm", precision="int8")
    with pytest.raises(ValueError, match="precision: int8 runs on the hf backend only"):
        quantization_llm_kwargs("int8")
    assert ESSASettings(backend="vllm").backend == "vllm"
    assert ESSASettings(backend="vllm", precision="int4").precision == "int4"
    assert quantization_llm_kwargs("native") == {}
    assert quantization_llm_kwargs("int4") == {"quantization": "bitsandbytes", "load_format": "bitsandbytes"}


def test_engine_arguments_pass_vllms_own_validation(tmp_path):
    """The arguments ESSAVLLMEngine gives vllm.LLM (essa_llm_kwargs, with the CPU build's platform arguments), built
    into vLLM's own engine configuration (EngineArgs.create_engine_config: ModelConfig, LoadConfig, LoRAConfig).
    Native: accepted as built. INT4: the pinned vLLM's core has no bitsandbytes and refuses it by name; with vLLM's
    bitsandbytes plugin installed (the quant extra, GPU machines) vLLM registers it through its plugin entry point
    and takes the same arguments (make test installs it: the next test runs the engine)."""
    from importlib.util import find_spec

    from vllm.engine.arg_utils import EngineArgs

    from esrepro.backends.vllm_engine import platform_llm_kwargs
    from esrepro.essa.vllm_engine import essa_llm_kwargs

    base = make_model_dir(tmp_path / "base", ARCH)

    def kwargs(precision: str) -> dict:
        return essa_llm_kwargs(base, rank=8, precision=precision, dtype="bfloat16", max_loras=4,
                               **platform_llm_kwargs("cpu", KV, {"max_model_len": 128}))

    native = EngineArgs(**kwargs("native")).create_engine_config()
    assert native.model_config.quantization is None
    assert (native.lora_config.max_loras, native.lora_config.max_lora_rank) == (4, 8)
    int4 = kwargs("int4")
    assert (int4["quantization"], int4["load_format"], int4["enable_lora"]) == ("bitsandbytes", "bitsandbytes", True)
    if find_spec("vllm_bnb_plugin") is None:
        with pytest.raises(ValueError, match="Unknown quantization method: bitsandbytes"):
            EngineArgs(**int4).create_engine_config()
    else:
        config = EngineArgs(**int4).create_engine_config()
        assert (config.model_config.quantization, config.load_config.load_format) == ("bitsandbytes", "bitsandbytes")
        assert (config.lora_config.max_loras, config.lora_config.max_lora_rank) == (4, 8)


def test_int4_engine_scores_candidates_on_a_base_quantised_as_it_loads(essa_model):
    """ESSA Fig. 9's INT4 engine for real: vLLM's bitsandbytes plugin quantises the tiny base to NF4 as it loads
    (bitsandbytes' CPU backend), the SFT adapter and every candidate's adapter on top, all candidates in one call.
    One candidate per call equals the batch; the candidates change the outputs; the quantised base is packed 4-bit
    weights, and its greedy outputs stay close to the bf16 engine's (4-bit rounding flips some near ties)."""
    if os.environ.get("ESREPRO_REQUIRE_VLLM"):
        import vllm_bnb_plugin  # noqa: F401  (make test installs it)
    else:
        pytest.importorskip("vllm_bnb_plugin", reason="vLLM's bitsandbytes plugin (make test installs it)")
    from esrepro.essa.vllm_engine import ESSAVLLMEngine

    base, adapter, space = essa_model
    q = ESSAVLLMEngine(base, adapter, space, precision="int4", dtype="bfloat16", device="cpu",
                       kv_cache_memory_bytes=KV, max_loras=8)
    n = ESSAVLLMEngine(base, adapter, space, dtype="bfloat16", device="cpu", kv_cache_memory_bytes=KV, max_loras=8)
    try:
        assert q.llm.llm_engine.vllm_config.model_config.quantization == "bitsandbytes"
        packed = q.llm.apply_model(lambda m: str(m.model.layers[0].self_attn.qkv_proj.base_layer.weight.dtype))
        assert set(packed) == {"torch.uint8"}, packed  # NF4: two weights a byte
        xs = candidates(q.space, 8, 1.0, seed=1)
        got = q.generate_candidates(q.prepare_candidates(xs), PROMPTS, MAX_NEW)
        bf16 = n.generate_candidates(n.prepare_candidates(xs), PROMPTS, MAX_NEW)
        single = []
        for x in xs[:2]:
            q.apply(x)
            single.append(q.generate(PROMPTS, MAX_NEW))
            q.restore()
    finally:
        q.close()
        n.close()
    assert single == got[:2], "one candidate per call and all in one call differ"
    assert len(set(map(tuple, got))) > 1, "the candidates should change the outputs"
    pairs = [(a, b) for ra, rb in zip(got, bf16, strict=True) for a, b in zip(ra, rb, strict=True)]
    flips = sum(a != b for a, b in pairs)
    print(f"\nINT4 (NF4) vs bf16 vLLM ESSA engines: {flips} of {len(pairs)} greedy responses differ", flush=True)
    assert flips <= len(pairs) // 2, "far more flips than 4-bit rounding explains: the base is likely wrong"
