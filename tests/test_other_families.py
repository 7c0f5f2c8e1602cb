"""RL, ESSA and KL on model families other than Qwen2 and Llama: Qwen3 (per-head q and k norms) and Phi-3 (q, k and v
fused into one ``qkv_proj``), small random-weight models built from their transformers configs. Each path runs for
real (TRL's GRPO step, LoRA SFT + SVD + a CMA-ES generation, KL of an ES-perturbed checkpoint), and ESSA's LoRA
targets are read off each architecture: Phi-3's adapter holds the fused ``qkv_proj`` and ``o_proj``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from esrepro.essa.lora import ADAPTER_CONFIG, lora_target_modules
from esrepro.io import read_json
from esrepro.models.architecture import meta_model, target_module_names
from test_rl_trainers import GRPO, SHORT, LengthTask

#: The attention linears ESSA adapts by default, in module order (Phi3Attention defines o_proj first).
ATTENTION = {"qwen3": ["q_proj", "k_proj", "v_proj", "o_proj"], "phi3": ["o_proj", "qkv_proj"]}
#: Every linear of a decoder block.
ALL = {"qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
       "phi3": ["o_proj", "qkv_proj", "gate_up_proj", "down_proj"]}
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, max_position_embeddings=256)
CORPUS = [f"Using the numbers [{a} {b}], make {a + b}. <think> {a} + {b} </think>\n<answer>{a} + {b}</answer>"
          for a in range(1, 40) for b in range(1, 12)]
PAIRS = [(f"Using the numbers [{a} {b}], make {a + b}.", f" <think> {a} + {b} </think>\n<answer>{a} + {b}</answer>")
         for a in range(1, 5) for b in range(1, 5)]
SFT = dict(rank=4, alpha=8.0, epochs=2, learning_rate=0.05, batch_size=8)


def family_config(model_type: str, vocab_size: int = 320, eos_id: int = 0):
    """A two-layer config of ``model_type`` (hidden 64, 2 heads of 32, one key/value head)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id,
                                pad_token_id=eos_id, **SHAPE)


def make_family_dir(path: Path, model_type: str, seed: int = 0) -> Path:
    """A random-init ``model_type`` LM with the tests' byte-level BPE tokenizer, saved into ``path``."""
    from transformers import AutoModelForCausalLM

    from esrepro.models.loading import save_tokenizer
    from esrepro.models.tiny import train_tokenizer

    tok = train_tokenizer(CORPUS, vocab_size=320)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(model_type, len(tok), tok.eos_token_id))
    assert model.config.model_type == model_type
    model.save_pretrained(path)
    save_tokenizer(tok, path)
    return path


@pytest.fixture(scope="module", params=["qwen3", "phi3"])
def family(request, tmp_path_factory) -> tuple[str, Path]:
    torch.set_num_threads(1)
    return request.param, make_family_dir(tmp_path_factory.mktemp(request.param), request.param)


# --- targets read off the architecture ----------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3", "mistral", "gemma3_text", "olmo2", "phi3"])
def test_attention_targets_of_each_family(model_type):
    model = meta_model(family_config(model_type))
    want = ATTENTION.get(model_type, ATTENTION["qwen3"])
    assert target_module_names(model, "attention") == sorted(want)
    assert lora_target_modules(model) == want  # module order: the SFT summary's target_modules as before
    assert lora_target_modules(model, "all") == ALL.get(model_type, ALL["qwen3"])
    assert lora_target_modules(model, ["down_proj", "o_proj"]) == ["o_proj", "down_proj"]  # module order


@pytest.mark.parametrize("targets,message", [
    (["q_proj", "v_proj"], "ESSA setting lora_targets: no linear layer of Phi3ForCausalLM's decoder blocks is named "
                           "q_proj, v_proj (theirs: o_proj, qkv_proj, gate_up_proj, down_proj)"),
    (["lm_head"], "ESSA setting lora_targets: no linear layer of Phi3ForCausalLM's decoder blocks is named lm_head"),
    ([], "ESSA setting lora_targets: []: expected a non-empty list of module names"),
    ("mlp", "ESSA setting lora_targets: 'mlp' is neither attention nor all"),
])
def test_targets_no_linear_has_are_refused_naming_the_setting(targets, message):
    with pytest.raises(ValueError) as err:
        lora_target_modules(meta_model(family_config("phi3")), targets)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("value,message", [
    ([], "lora_targets is an empty list"),
    ([""], "lora_targets ['']: '' is not a module name"),
    (["self_attn.q_proj"], "lora_targets ['self_attn.q_proj']: 'self_attn.q_proj' is not a module name"),
    (["q_proj", "q_proj"], "lora_targets ['q_proj', 'q_proj']: names must be distinct"),
    ("q_proj", "lora_targets 'q_proj' is neither attention nor all"),
])
def test_lora_targets_setting_is_validated(value, message):
    from pydantic import ValidationError

    from esrepro.settings.methods import ESSASettings

    assert ESSASettings().lora_targets == "attention"
    assert ESSASettings(lora_targets=["qkv_proj", "o_proj"]).as_dict()["lora_targets"] == ["qkv_proj", "o_proj"]
    with pytest.raises(ValidationError) as err:
        ESSASettings(lora_targets=value)
    assert message in str(err.value) and "lora_targets" in str(err.value)


# --- (a) GRPO through TRL ---------------------------------------------------------------------------------------


def test_grpo_step_trains(family):
    from esrepro.rl.grpo import train_grpo

    model_type, model_dir = family
    model, _, rows = train_grpo(model_dir, LengthTask(), SHORT, {**GRPO, "beta": 0.05}, steps=1, seed=0)
    assert type(model).__name__.lower().startswith(model_type)
    assert [r["step"] for r in rows] == [0] and "kl" in rows[0]  # beta > 0: the reference model ran too
    base = load_file(str(model_dir / "model.safetensors"))
    now = model.state_dict()
    moved = [k for k in base if k in now and not torch.equal(base[k], now[k])]
    assert any(k.endswith(f"self_attn.{ATTENTION[model_type][0]}.weight") for k in moved), moved


# --- (b) ESSA: LoRA SFT, SVD, a CMA-ES generation ------------------------------------------------------------------


def test_essa_iteration_adapts_the_attention_linears(family, tmp_path):
    from esrepro.essa.loop import Problems, run_essa
    from esrepro.essa.lora import load_lora, sft_lora
    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.essa.svd import SingularValueSpace
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import IndexedScoring
    from esrepro.settings.methods import ESSASettings
    from esrepro.tasks.countdown import generate_problems

    model_type, model_dir = family
    summary = sft_lora(model_dir, PAIRS, seed=0, out_dir=tmp_path / "sft", **SFT)
    assert summary["target_modules"] == ATTENTION[model_type]
    assert summary["loss_after"] < summary["loss_before"]
    assert read_json(tmp_path / "sft" / ADAPTER_CONFIG)["target_modules"] == sorted(ATTENTION[model_type])
    factors = load_lora(model_dir, tmp_path / "sft")
    assert sorted(factors) == sorted(f"model.layers.{i}.self_attn.{m}" for i in range(2) for m in ATTENTION[model_type])
    if model_type == "phi3":  # the fused projection: q (2 heads) + k and v (1 head each) of 32 = 128 outputs
        assert factors["model.layers.0.self_attn.qkv_proj"].B.shape == (128, SFT["rank"])

    space = SingularValueSpace.build(factors, fraction=0.5)
    space.save(tmp_path / "space.safetensors")
    assert space.dim == len(factors) * 2  # ceil(0.5 x rank 4) per adapter
    spec = ESSAEngineSpec(str(model_dir), str(tmp_path / "sft"), str(tmp_path / "space.safetensors"), batch_size=8)
    evaluator = SerialEvaluator(spec, IndexedScoring("countdown", generate_problems(4, seed=1), max_new_tokens=6,
                                                     fitness="reward"))
    cfg = ESSASettings(population=4, iterations=1, max_new_tokens=6, sft_examples=1, fitness_examples=4)
    log, strategy, _ = run_essa(evaluator, cfg, space.x0, Problems(fitness=list(range(4)), val=[]),
                                tmp_path / "resume", progress=False)
    assert len(log) == 1 and len(log[0]["rewards"]) == 4
    assert not np.array_equal(strategy.mean, space.x0)  # told the rewards, the mean moved

    x = space.x0 + np.random.default_rng(0).normal(0.0, 0.5, space.dim)  # a candidate far from the SFT values
    evaluator.save_candidate(x, tmp_path / "candidate")
    evaluator.close()
    base, cand = load_file(str(model_dir / "model.safetensors")), load_file(str(tmp_path / "candidate" /
                                                                                 "model.safetensors"))
    changed = {k for k in base if not torch.equal(base[k], cand[k])}
    assert changed == {f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in ATTENTION[model_type]}


def test_sft_refuses_targets_the_model_lacks(family, tmp_path):
    from esrepro.essa.lora import sft_lora

    model_type, model_dir = family
    wrong = "q_proj" if model_type == "phi3" else "qkv_proj"
    with pytest.raises(ValueError, match=f"ESSA setting lora_targets: no linear layer of .* is named {wrong}"):
        sft_lora(model_dir, PAIRS, seed=0, out_dir=tmp_path / "sft", targets=[wrong], **SFT)
    assert not (tmp_path / "sft").exists()


# --- (c) KL between an ES-perturbed checkpoint and the base --------------------------------------------------------


def test_kl_of_a_perturbed_checkpoint(family, tmp_path):
    from esrepro.kl import KLSettings, measure_checkpoint
    from esrepro.models.architecture import linear_weight_names
    from esrepro.models.loading import load_model, load_tokenizer, save_checkpoint
    from esrepro.perturb.ops import perturb_
    from esrepro.tasks.countdown import CountdownTask, generate_problems

    _, model_dir = family
    base = load_model(model_dir)
    model = load_model(model_dir)
    wanted = linear_weight_names(model)
    params = [p for n, p in model.named_parameters() if n in wanted]
    assert len(params) == len(wanted) > 0
    with torch.no_grad():
        perturb_(params, seed=7, sigma=0.05, variant="iid")  # one ES member's noise on the decoder linears
    save_checkpoint(model, load_tokenizer(model_dir), tmp_path / "member")
    settings = KLSettings(n_samples=4, max_new_tokens=6, seed=0, batch_size=8)
    examples = generate_problems(2, seed=0)
    out = measure_checkpoint(tmp_path / "member", base, CountdownTask(), examples, settings)
    assert out["summary"]["exact"] > 0 and out["summary"]["n_responses"] == 8
    assert all(r["k3"] >= 0 and r["exact"] >= 0 for r in out["responses"])
    same = measure_checkpoint(model_dir, base, CountdownTask(), examples, settings)
    assert same["summary"]["exact"] == 0.0 and same["summary"]["k1"] == 0.0
