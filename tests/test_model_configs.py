"""Any model transformers builds is one registry entry: five families that are neither Qwen2 nor Llama (Qwen3,
Mistral, Gemma 3, OLMo 2, Phi-3), each stated by its hub config.json, are planned, priced and replicated from that
config alone; a parameter count and KV cache counted by hand agree with the meta-device count; an entry whose config
transformers cannot build fails naming the model and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from esrepro.config import load_registry, read_config
from esrepro.models import memory as M
from esrepro.planning import plan_check as pc
from esrepro.planning.load import load_pipeline

# The architecture-defining keys of each model's config.json on the hub (token ids included, as the files state
# them: the replica maps them to its own vocabulary).
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
         "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1000000,
         "rope_scaling": None, "rms_norm_eps": 1e-06, "attention_bias": False, "hidden_act": "silu",
         "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28, "bos_token_id": 151643,
         "eos_token_id": 151645}
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 32768, "max_position_embeddings": 32768, "tie_word_embeddings": False,
           "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "sliding_window": None, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2}
GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
          "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
          "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768, "rope_theta": 1000000,
          "rope_local_base_freq": 10000, "rope_scaling": None, "rms_norm_eps": 1e-06, "sliding_window": 512,
          "sliding_window_pattern": 6, "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
          "attn_logit_softcapping": None, "final_logit_softcapping": None, "bos_token_id": 2,
          "eos_token_id": [1, 106], "pad_token_id": 0}
OLMO2 = {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
         "max_position_embeddings": 4096, "tie_word_embeddings": False, "rope_theta": 500000, "rope_scaling": None,
         "rms_norm_eps": 1e-06, "attention_bias": False, "hidden_act": "silu", "eos_token_id": 100257,
         "pad_token_id": 100277}
PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_theta": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-05, "sliding_window": 2047,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000}

#: Per-rule resources by size, as config/models.yaml gives its 1B, 3B and 7B models.
SMALL = {"default": {"gpu": 1, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 64000, "runtime": 180},
         "train": {"gpu": 4, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 128000, "runtime": 2880}}
MEDIUM = {"default": {"gpu": 1, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 96000, "runtime": 240},
          "train": {"gpu": 4, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 192000, "runtime": 4320}}
LARGE = {"default": {"gpu": 1, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 128000, "runtime": 360},
         "train": {"gpu": 8, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 384000, "runtime": 4320},
         "train_es": {"nodes": 2, "gpu": 4, "gpu_model": "h100", "cpus_per_gpu": 8, "mem_mb": 192000,
                      "runtime": 4320}}

#: The registry's per-method settings: one GRPO grid cell. OLMo 2 and Phi-3 attend with as many key-value heads as
#: query heads (32), four times Mistral 7B's KV cache a token: their GRPO jobs' periodic evaluation (64 prompts by
#: default) does not fit beside the colocated engine (the plan check says so, test below), so they evaluate 16 at once.
GRID = {"grpo8": {"grid": {"learning_rate": [1.0e-6], "beta": [0.001]}}}
MHA = {"grpo8": {**GRID["grpo8"], "eval_batch_size": 16}}

#: registry key -> (hub id, display, size text, config.json, resources, chat_template, methods)
MODELS = {
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B", "Qwen3-1.7B", "1.7B", QWEN3, SMALL, False, GRID),
    "mistral-7b-instruct": ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral-7B-Instruct-v0.3", "7B", MISTRAL, LARGE,
                            False, GRID),
    "gemma-3-1b-it": ("google/gemma-3-1b-it", "Gemma-3-1B-IT", "1B", GEMMA3, SMALL, True, GRID),
    "olmo-2-7b-instruct": ("allenai/OLMo-2-1124-7B-Instruct", "OLMo-2-7B-Instruct", "7B", OLMO2, LARGE, False, MHA),
    "phi-3-mini-instruct": ("microsoft/Phi-3-mini-4k-instruct", "Phi-3-mini-4k-instruct", "3.8B", PHI3, MEDIUM,
                            False, MHA),
}


#: The decoder block class of each model in transformers (what FSDP wraps).
DECODER_LAYERS = {"qwen3-1.7b": "Qwen3DecoderLayer", "mistral-7b-instruct": "MistralDecoderLayer",
                  "gemma-3-1b-it": "Gemma3DecoderLayer", "olmo-2-7b-instruct": "Olmo2DecoderLayer",
                  "phi-3-mini-instruct": "Phi3DecoderLayer"}


def registry_yaml(folder: Path, models: dict = MODELS) -> dict:
    """The registry of ``models``, each config a file under ``folder``/model_configs (as config/models.yaml's; named
    by its absolute path)."""
    out = {}
    for key, (hub_id, display, size, _, resources, chat, methods) in models.items():
        out[key] = {"display": display, "size": size, "dtype": "bfloat16", "hub_id": hub_id, "revision": "main",
                    "config": str(folder / "model_configs" / f"{key}.json"), "chat_template": chat,
                    "methods": methods, "resources": resources}
    return {"models": out}


def write_run(folder: Path, models: dict = MODELS) -> Path:
    """A registry of ``models`` and a config training them on Countdown with ES and GRPO (8) at the paper's settings,
    with their evaluation and KL, in ``folder``; the config's path."""
    (folder / "model_configs").mkdir(parents=True, exist_ok=True)
    for key, (*_, config, _, _, _) in models.items():
        (folder / "model_configs" / f"{key}.json").write_text(json.dumps(config, indent=2))
    (folder / "models.yaml").write_text(yaml.safe_dump(registry_yaml(folder, models)))
    (folder / "published.yaml").write_text((REPO / "config" / "published.yaml").read_text())
    cfg = read_config(REPO / "config" / "paper.yaml", REPO)
    cfg.update(models=list(models), registry=str(folder / "models.yaml"), published=str(folder / "published.yaml"),
               train={"countdown": {"methods": ["es", "grpo8"], **{m: copy.deepcopy(cfg["train"]["countdown"][m])
                                                                   for m in ("es", "grpo8")}}},
               evaluate={"countdown": cfg["evaluate"]["countdown"]}, kl={"countdown": cfg["kl"]["countdown"]},
               studies={}, report={"extras": []})
    cfg.pop("stability", None)
    path = folder / "families.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    path = write_run(folder)
    return load_pipeline(read_config(path, REPO), str(path), root=REPO), folder


def test_the_plan_check_builds_and_counts_every_job_of_each_family(run):
    p, _ = run
    checked = pc.jobs(p)
    assert not pc.failures(checked), "\n".join(j.message() for j in pc.failures(checked))
    for key in MODELS:
        mine = {j.rule: j for j in checked if j.wildcards["model"] == key}
        assert {"train", "train_cell", "evaluate", "kl"} <= set(mine), (key, sorted(mine))
        assert all(j.peak is not None and M.fits(j.peak) for j in mine.values()), key
        assert mine["train"].kind.startswith("es") and "grpo" in mine["train_cell"].kind
        # the GRPO job's FSDP wraps the family's own decoder layer, read off its meta-device build
        assert M.entry_facts(p.model(key)).decoder_layer == DECODER_LAYERS[key]


def test_multi_head_attention_at_the_default_evaluation_batch_does_not_fit(tmp_path):
    """OLMo 2 7B's 32 key-value heads: 64 evaluation prompts of 1,536 tokens hold 48 GiB of KV cache beside the
    colocated engine and the training state; the plan check names the job and the phase."""
    path = write_run(tmp_path, {"olmo-2-7b-instruct": (*MODELS["olmo-2-7b-instruct"][:6], GRID)})
    p = load_pipeline(read_config(path, REPO), str(path), root=REPO)
    failed = pc.failures(pc.jobs(p, {("train_cell", "olmo-2-7b-instruct")}))
    assert [j.label for j in failed] == ["train_cell countdown/olmo-2-7b-instruct/grpo8/beta0.001_lr1e-06"]
    assert "periodic evaluation: predicted peak" in failed[0].message()


def test_the_cost_prices_each_family_from_its_config(run):
    from esrepro.planning.cost import TOTAL, summary
    from esrepro.planning.scaling import job_cost, model_parameters, weight_bytes

    p, _ = run
    total = summary(p)[-1]
    assert total.group == TOTAL and total.gpu_jobs > 0 and total.estimated_gpu_h > 0
    for key in MODELS:
        params = M.entry_facts(p.model(key)).params
        assert model_parameters(p, key) == params and weight_bytes(p, key) == 2 * params
        es = job_cost(p, "countdown", key, "es")
        assert es.memory_gb == {"weights (bf16)": round(2 * params / 1e9, 1)} and es.hours > 0
        grpo = job_cost(p, "countdown", key, "grpo8", next(iter(p.grid_cells(key, "grpo8"))))
        assert grpo.memory_gb["float32 master, gradients, AdamW"] == round(16 * params / grpo.gpus / 1e9, 1)
    # the size text is display only: Phi-3's "3.8B" and Mistral's "7B" are not what is priced
    assert model_parameters(p, "mistral-7b-instruct") == 7_248_023_552


@pytest.mark.parametrize("key", list(MODELS))
def test_a_replica_keeps_the_config_and_loads_and_generates(run, key, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from esrepro.models.architecture import config_differences
    from esrepro.models.loading import load_tokenizer
    from esrepro.planning.rehearsal_registry import rehearsal_registry, replica_config
    from esrepro.rehearsal.replicas import build_replica
    from esrepro.settings.pipeline import Rehearsal

    p, _ = run
    real = MODELS[key][3]
    summary = build_replica(key, p.model(key), tmp_path / key, seed=0)
    config = json.loads((tmp_path / key / "config.json").read_text())
    # the rehearsal's registry states what the mirror serves: the fetch's config check passes on the replica
    rehearsed = rehearsal_registry({key: p.model(key)}, Rehearsal())[key]
    assert rehearsed.config == replica_config(key, p.model(key)) == config
    assert not config_differences(rehearsed.config, config)
    assert summary["architecture"] == real["architectures"][0] == config["architectures"][0]
    assert config["model_type"] == real["model_type"] and config["num_hidden_layers"] == 2
    for field in ("rope_theta", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "sliding_window"):
        assert config.get(field) == real.get(field), field
    assert ("head_dim" in config) == ("head_dim" in real) and config.get("head_dim", 32) == 32
    model = AutoModelForCausalLM.from_pretrained(tmp_path / key)
    tok = load_tokenizer(tmp_path / key)
    assert type(model).__name__ == real["architectures"][0] and model.config.vocab_size >= len(tok)
    # the attention's kind (grouped, multi-query, multi-head) and the family's layers survive the scaling
    kv = {real["num_attention_heads"]: 4, 1: 1}.get(real["num_key_value_heads"], 2)
    assert model.config.num_key_value_heads == kv
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    assert ("q_norm" in names) == (real["model_type"] in ("qwen3", "olmo2", "gemma3_text"))
    assert ("qkv_proj" in names and "gate_up_proj" in names) == (real["model_type"] == "phi3")
    if real["model_type"] == "gemma3_text":
        assert model.config.layer_types == ["sliding_attention", "full_attention"]
        assert config["query_pre_attn_scalar"] == 32  # the toy head's, as the real one is its head's
    ids = tok("Compute 12 + 30.", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] == ids["input_ids"].shape[1] + 4 or tok.eos_token_id in out[0].tolist()
    generation = json.loads((tmp_path / key / "generation_config.json").read_text())
    assert tok.eos_token_id in ([generation["eos_token_id"]] if isinstance(generation["eos_token_id"], int)
                                else generation["eos_token_id"])


def test_generic_and_family_tokenizers_follow_the_model_type(run, tmp_path):
    """Qwen3 shares Qwen's tokenizer facts (its model type, not the registry's family text); every other type gets
    the generic replica tokenizer, with a chat template only where the entry asks for one."""
    from esrepro.models.loading import load_tokenizer
    from esrepro.rehearsal.replicas import build_replica

    p, _ = run
    for key in ("qwen3-1.7b", "gemma-3-1b-it", "mistral-7b-instruct"):
        build_replica(key, p.model(key), tmp_path / key, seed=0)
    qwen3 = load_tokenizer(tmp_path / "qwen3-1.7b")
    assert type(qwen3).__name__ == "Qwen2Tokenizer" and qwen3.eos_token == "<|im_end|>"
    assert (tmp_path / "qwen3-1.7b" / "vocab.json").is_file()
    gemma = load_tokenizer(tmp_path / "gemma-3-1b-it")
    assert (gemma.bos_token, gemma.eos_token, gemma.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    text = gemma.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], tokenize=False,
                                     add_generation_prompt=True)
    assert text == "<|user|>\nWhat is 12 + 30?<|eos|>\n<|assistant|>\n"
    assert json.loads((tmp_path / "gemma-3-1b-it" / "config.json").read_text())["pad_token_id"] == \
        gemma.pad_token_id
    mistral = load_tokenizer(tmp_path / "mistral-7b-instruct")
    assert mistral.chat_template is None and mistral.eos_token == "<|eos|>"


def test_qwen3_counted_by_hand(tmp_path):
    """Qwen3-1.7B: 28 layers of width 2048, MLP 6144, 16 query heads and 8 key-value heads of 128, per-head q/k
    norms, a tied vocabulary of 151,936; every linear without bias."""
    hidden, inter, layers, heads, kv, head, vocab = 2048, 6144, 28, 16, 8, 128, 151936
    attention = hidden * heads * head + 2 * hidden * kv * head + heads * head * hidden  # q, k, v, o
    mlp = 3 * hidden * inter  # gate, up, down
    norms = 2 * hidden + 2 * head  # input and post-attention RMSNorms, q_norm and k_norm
    per_layer = attention + mlp + norms
    assert per_layer == 4_194_304 + 4_194_304 + 4_194_304 + 37_748_736 + 4_352 == 50_336_000
    params = layers * per_layer + vocab * hidden + hidden  # the layers, the tied embedding, the final norm
    assert params == 1_720_574_976
    kv_bytes = 2 * layers * kv * head * 2  # keys and values, every layer, bf16
    assert kv_bytes == 114_688

    write_run(tmp_path, {"qwen3-1.7b": MODELS["qwen3-1.7b"]})
    entry = load_registry(tmp_path / "models.yaml")["qwen3-1.7b"]
    m = M.entry_facts(entry, "qwen3-1.7b")
    assert (m.params, m.kv_bytes_per_token, m.layer_params, m.head_dim, m.tied, m.qk_norm) == \
        (params, kv_bytes, per_layer, head, True, True)


def test_an_unknown_model_type_names_the_model_and_the_field(tmp_path):
    """An entry whose config transformers cannot build: the run's validation, the cost and the replica builder each
    stop naming the model and the config's model_type."""
    from esrepro.models.architecture import ArchitectureError
    from esrepro.rehearsal.replicas import build_replica
    from esrepro.settings.layers import ConfigError

    bad = {"qwen3-1.7b": (*MODELS["qwen3-1.7b"][:3], {**QWEN3, "model_type": "qwen3000"}, SMALL, False, GRID)}
    path = write_run(tmp_path, bad)
    with pytest.raises(ConfigError, match=r"models\.qwen3-1\.7b\.config\.model_type: model_type 'qwen3000'"):
        load_pipeline(read_config(path, REPO), str(path), root=REPO)
    entry = load_registry(tmp_path / "models.yaml")["qwen3-1.7b"]  # the registry alone does not build it
    with pytest.raises(ArchitectureError, match=r"model 'qwen3-1\.7b': .*model_type 'qwen3000'"):
        M.entry_facts(entry, "qwen3-1.7b")
    with pytest.raises(ArchitectureError, match=r"model 'qwen3-1\.7b'.*model_type 'qwen3000'"):
        build_replica("qwen3-1.7b", entry, tmp_path / "replica")
    with pytest.raises(ArchitectureError, match=r"model 'qwen3-1\.7b': no config"):
        build_replica("qwen3-1.7b", {"hub_id": "Qwen/Qwen3-1.7B", "dtype": "bfloat16"}, tmp_path / "replica")
    assert not (tmp_path / "replica").exists()


def test_rope_factors_per_frequency_are_resampled_to_the_toy_head():
    """Phi-3's LongRoPE states one factor per pair of rotary dimensions (48 for its 96-wide heads); the toy head of
    32 has 16, which transformers checks when it builds the config."""
    from esrepro.models.architecture import config_from_facts, meta_model
    from esrepro.planning.rehearsal_registry import toy_config

    factors = [1.0 + i / 10 for i in range(48)]
    real = {**PHI3, "max_position_embeddings": 131072,
            "rope_scaling": {"type": "longrope", "short_factor": factors, "long_factor": [2 * f for f in factors]}}
    toy = toy_config(real)
    assert len(toy["rope_scaling"]["short_factor"]) == len(toy["rope_scaling"]["long_factor"]) == 16
    assert toy["rope_scaling"]["short_factor"][:2] == [1.0, 1.3]  # every third of the real frequencies
    model = meta_model(config_from_facts({**toy, "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2,
                                          "pad_token_id": 2}))
    assert type(model).__name__ == "Phi3ForCausalLM"
