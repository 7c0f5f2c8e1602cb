"""HF <-> vLLM layout machinery, ES noise on tensor-parallel shards, and the vLLM engine's sharded state.

The CPU tests need no vLLM: layouts are the hand-written reading of vLLM's Qwen2 and Llama layout
(tests/vllm_reference_layout.py, which tests/test_vllm_probe.py checks against the probe on vLLM's
own classes), and tensor-parallel ranks are simulated by converting an HF state to every rank's
vLLM parameters. The engine tests run only where vLLM imports and CUDA exists.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from esrepro.backends.vllm_engine import ShardedWeights, stop_token_ids
from esrepro.backends.vllm_layout import (
    perturb_shards_,
    shard_noise,
    to_hf,
    to_vllm,
    update_shards_,
)
from esrepro.perturb.noise import noise_like, tensor_noise, tensor_seed
from esrepro.perturb.ops import perturb_, restore_subtract_, update_
from esrepro.perturb.weights import ESWeights, hf_checksum
from vllm_reference_layout import VOCAB_PADDING, build_layout

torch.set_num_threads(1)


def qwen2(num_kv_heads: int = 2) -> Qwen2Config:
    """Tiny Qwen2: q/k/v biases, tied embeddings, vocabulary not a multiple of 64."""
    return Qwen2Config(
        vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=num_kv_heads, tie_word_embeddings=True,
    )


def llama(num_kv_heads: int = 2) -> LlamaConfig:
    """Tiny Llama: no biases, untied lm_head, head_dim set apart from hidden/heads."""
    return LlamaConfig(
        vocab_size=301, hidden_size=40, intermediate_size=56, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=num_kv_heads, head_dim=12, tie_word_embeddings=False,
    )


# (name, config factory, tp): tp=2 with 1 KV head replicates it on both ranks.
CASES = [
    ("qwen2-tp1", qwen2, 1),
    ("qwen2-tp2", qwen2, 2),
    ("qwen2-kv1-tp2", lambda: qwen2(1), 2),
    ("llama-tp1", llama, 1),
    ("llama-tp2", llama, 2),
    ("llama-kv1-tp2", lambda: llama(1), 2),
]
IDS = [c[0] for c in CASES]


def hf_state(config, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random HF model's parameters (named_parameters order) in ``dtype``; norms randomised too."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return {n: p.data.clone() for n, p in model.named_parameters()}


def shards(state: dict[str, torch.Tensor], layout) -> list[dict[str, torch.Tensor]]:
    return [to_vllm(state, layout, r) for r in range(layout.tp_size)]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    bad = [n for n in a if a[n].dtype != b[n].dtype or not torch.equal(a[n], b[n])]
    assert not bad, f"differ: {bad}"


def test_layout_follows_vllm_sharding_rules():
    """Shapes and slices as vLLM 0.30.0 lays them out (QKV by heads, KV replicated, vocab padded to 64)."""
    layout = build_layout(qwen2(num_kv_heads=1), tp_size=2)
    assert [s.name for s in layout.shards(0)][:4] == [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.qkv_proj.bias",
        "model.layers.0.self_attn.o_proj.weight",
    ]
    assert "lm_head.weight" not in {s.name for s in layout.shards(0)}  # tied
    head = 32 // 4
    for rank in (0, 1):
        qkv = layout.spec("model.layers.1.self_attn.qkv_proj.weight", rank)
        assert qkv.shape == (2 * head + 2 * head, 32)
        q, k, v = qkv.pieces
        assert q.hf.name == "model.layers.1.self_attn.q_proj.weight"
        assert (q.src, q.dst, q.length) == (rank * 2 * head, 0, 2 * head)
        assert (k.src, k.dst, v.src, v.dst) == (0, 2 * head, 0, 3 * head)  # the one KV head, on both ranks
        assert (q.hf.index, k.hf.index, v.hf.index) == (13, 15, 17)  # embed, 12 per layer, q.w q.b k.w k.b
        o = layout.spec("model.layers.0.self_attn.o_proj.weight", rank)
        assert o.shape == (32, 16) and (o.pieces[0].dim, o.pieces[0].src) == (1, rank * 16)
        gu = layout.spec("model.layers.0.mlp.gate_up_proj.weight", rank)
        assert gu.shape == (48, 32) and [(p.src, p.dst) for p in gu.pieces] == [(rank * 24, 0), (rank * 24, 24)]
        emb = layout.spec("model.embed_tokens.weight", rank)
        assert VOCAB_PADDING == 64 and emb.shape == (160, 32)  # 300 padded to 320, split in two
        assert (emb.pieces[0].src, emb.pieces[0].length) == ((0, 160), (160, 140))[rank]

    lay4 = build_layout(llama(num_kv_heads=4), tp_size=2)
    k = lay4.spec("model.layers.0.self_attn.qkv_proj.weight", 1).pieces[1]
    assert (k.src, k.length) == (2 * 12, 2 * 12)  # KV heads 2, 3 on rank 1
    assert lay4.spec("lm_head.weight", 1).shape == (160, 40)  # 301 -> 320 / 2


def test_layout_rejects_what_vllm_cannot_shard():
    with pytest.raises(ValueError, match="num_attention_heads"):
        build_layout(qwen2(), tp_size=3)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        from transformers import GPT2Config

        build_layout(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))


@pytest.mark.parametrize("name,make_config,tp", CASES, ids=IDS)
def test_hf_vllm_hf_round_trip_is_bit_exact(name, make_config, tp):
    config = make_config()
    layout = build_layout(config, tp)
    state = hf_state(config, torch.bfloat16)
    vllm_states = shards(state, layout)
    for r, st in enumerate(vllm_states):
        assert {n: tuple(t.shape) for n, t in st.items()} == {s.name: s.shape for s in layout.shards(r)}
    emb = vllm_states[-1]["model.embed_tokens.weight"]
    padding = tp * emb.shape[0] - config.vocab_size
    assert padding > 0 and torch.count_nonzero(emb[-padding:]) == 0
    assert_same(to_hf(vllm_states, layout), state)


def test_to_hf_refuses_diverged_replicas():
    layout = build_layout(qwen2(num_kv_heads=1), 2)
    vllm_states = shards(hf_state(qwen2(num_kv_heads=1), torch.float32), layout)
    vllm_states[1]["model.norm.weight"][0] += 1
    with pytest.raises(ValueError, match="replicas of model.norm.weight"):
        to_hf(vllm_states, layout)


@pytest.mark.parametrize("variant", ["iid", "correlated"])
@pytest.mark.parametrize("name,make_config,tp", CASES, ids=IDS)
def test_perturb_then_convert_equals_convert_then_perturb(name, make_config, tp, variant):
    """Bit-exact in float32. (In bf16 on CPU, torch's add with alpha rounds the last
    ``numel % vector width`` elements of a tensor differently from the rest, so a different
    tensor geometry may differ by one ulp; see ``test_perturb_bf16_on_cuda_is_bit_exact``.)"""
    config = make_config()
    layout = build_layout(config, tp)
    state = hf_state(config, torch.float32)
    vllm_states = shards(state, layout)
    perturb_(list(state.values()), 1234, 0.01, variant)
    for r, st in enumerate(vllm_states):
        specs = layout.shards(r)
        perturb_shards_([st[s.name] for s in specs], specs, 1234, 0.01, variant)
    assert_same(to_hf(vllm_states, layout), state)


@pytest.mark.parametrize("variant", ["iid", "correlated"])
def test_shard_noise_is_the_hf_noise_sliced(variant):
    config = llama(num_kv_heads=1)
    layout = build_layout(config, 2)
    hf_noise = {t.name: noise_like(t.shape, "cpu", 7, t.index, variant) for t in layout.hf}
    noise_shards = [{s.name: shard_noise(s, 7, variant, "cpu") for s in layout.shards(r)} for r in range(2)]
    assert_same(to_hf(noise_shards, layout), hf_noise)
    # q_proj and k_proj have different shapes; same-shaped gate/up get equal noise only when correlated
    gu = noise_shards[0]["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(gu[:28], gu[28:]) == (variant == "correlated")


@pytest.mark.parametrize("masters", [False, True], ids=["no-masters", "fp32-masters"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", ["iid", "correlated"])
@pytest.mark.parametrize("name,make_config,tp", CASES, ids=IDS)
def test_update_then_convert_equals_convert_then_update(name, make_config, tp, variant, dtype, masters):
    config = make_config()
    layout = build_layout(config, tp)
    state = hf_state(config, dtype)
    vllm_states = shards(state, layout)
    seeds, weights, alpha = [11, 22, 33], [1.3, -0.4, -0.9], 0.05
    params = list(state.values())
    update_(params, seeds, weights, alpha, variant, [p.float() for p in params] if masters else None)
    for r, st in enumerate(vllm_states):
        specs = layout.shards(r)
        ps = [st[s.name] for s in specs]
        update_shards_(ps, specs, seeds, weights, alpha, variant, [p.float() for p in ps] if masters else None)
    assert_same(to_hf(vllm_states, layout), state)


def simulated_ranks(state, layout, **options) -> tuple[list[ShardedWeights], callable]:
    """One ShardedWeights per rank, and a gather that hands rank 0 every rank's copy of a parameter (or master)."""
    ranks = [ShardedWeights(st, layout, r, **options) for r, st in enumerate(shards(state, layout))]
    where = {id(p): ("params", s.name) for s, p in zip(ranks[0].specs, ranks[0].params, strict=True)}
    where.update({id(m): ("masters", s.name) for s, m in zip(ranks[0].specs, ranks[0].masters or [], strict=False)})

    def gather(t):
        kind, name = where[id(t)]
        return [getattr(w, kind)[[s.name for s in w.specs].index(name)] for w in ranks]

    return ranks, gather


@pytest.mark.parametrize("name,make_config,tp", [CASES[2], CASES[4]], ids=[IDS[2], IDS[4]])
def test_sharded_weights_follow_the_hf_es_loop(name, make_config, tp, tmp_path):
    """Perturb / restore (exact and subtract) / update on every rank; checksum and save in HF layout."""
    config = make_config()
    layout = build_layout(config, tp)
    state = hf_state(config, torch.float32)
    params = list(state.values())
    original = hf_checksum(state.items())
    exact, gather = simulated_ranks(state, layout, noise="iid", restore="exact")
    subtract, gather_s = simulated_ranks(state, layout, noise="iid", restore="subtract")
    assert exact[0].checksum(gather) == original

    for w in exact + subtract:
        w.perturb(5, 0.1)
    perturb_(params, 5, 0.1, "iid")
    assert exact[0].checksum(gather) == subtract[0].checksum(gather_s) == hf_checksum(state.items()) != original
    with pytest.raises(RuntimeError, match="already perturbed"):
        exact[0].perturb(6, 0.1)
    with pytest.raises(RuntimeError, match="apply_update while perturbed"):
        exact[0].apply_update([5], [1.0], 0.1)
    for w in exact + subtract:
        w.restore(5, 0.1)
    restore_subtract_(params, 5, 0.1, "iid")
    assert exact[0].checksum(gather) == original  # copied back
    assert subtract[0].checksum(gather_s) == hf_checksum(state.items())  # the HF subtract, rounding and all

    for w in exact:
        w.apply_update([1, 2], [0.7, -0.7], 0.5)
    hf_after = hf_state(config, torch.float32)
    update_(list(hf_after.values()), [1, 2], [0.7, -0.7], 0.5, "iid")
    assert exact[0].checksum(gather) == hf_checksum(hf_after.items())
    for w in exact:  # the snapshot follows the update
        w.perturb(9, 0.1)
        w.restore(9, 0.1)
    assert exact[0].checksum(gather) == hf_checksum(hf_after.items())

    assert exact[0].save(tmp_path, gather) is True
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert set(saved) == set(hf_after)
    assert_same({n: saved[n] for n in hf_after}, hf_after)
    assert exact[0].checksum(lambda t: None) is None  # ranks that do not gather return nothing


def test_sharded_weights_restore_from_fp32_masters():
    config = qwen2()
    layout = build_layout(config, 2)
    state = hf_state(config, torch.bfloat16)
    ranks, gather = simulated_ranks(state, layout, restore="exact", master_weights="float32")
    ranks_plain, gather_plain = simulated_ranks(state, layout, restore="exact")
    for w in ranks + ranks_plain:
        w.apply_update([3], [1.0], 1e-4)  # below a bf16 ulp for most weights
        w.perturb(4, 0.01)
        w.restore(4, 0.01)
    hf = {n: t.clone() for n, t in state.items()}
    masters = [t.float() for t in hf.values()]
    update_(list(hf.values()), [3], [1.0], 1e-4, "iid", masters)
    assert ranks[0].checksum(gather) == hf_checksum(hf.items())
    assert ranks_plain[0].checksum(gather_plain) != ranks[0].checksum(gather)


def test_sharded_weights_keep_only_the_copies_their_mode_needs():
    layout = build_layout(qwen2(), 1)
    st = to_vllm(hf_state(qwen2(), torch.bfloat16), layout, 0)
    assert ShardedWeights(st, layout, 0, restore="exact")._saved is not None
    assert ShardedWeights(st, layout, 0, restore="subtract")._saved is None
    w = ShardedWeights(st, layout, 0, restore="exact", master_weights="float32")
    assert w._saved is None and all(m.dtype == torch.float32 for m in w.masters)
    # the embedding: 300 x 32 HF noise, 320 x 32 shard noise, accumulator and cast
    assert w.transient_bytes() == 4 * 300 * 32 + 12 * 320 * 32


def test_sharded_weights_refuse_a_missing_parameter_and_leave_others_alone():
    """Every parameter of the layout must be there; one holding no HF tensor (vLLM's KV scales) is never touched."""
    layout = build_layout(qwen2(), 1)
    st = to_vllm(hf_state(qwen2(), torch.float32), layout, 0)
    st["model.layers.0.self_attn.attn.k_scale"] = torch.ones(1)
    w = ShardedWeights(st, layout, 0)
    w.perturb(3, 0.5)
    w.restore(3, 0.5)
    w.apply_update([4, 5], [1.0, -1.0], 0.5)
    assert torch.equal(st["model.layers.0.self_attn.attn.k_scale"], torch.ones(1))
    del st["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        ShardedWeights(st, layout, 0)


def test_noise_like_is_what_tensor_noise_always_returned():
    p = torch.empty(3, 5)
    gen = torch.Generator().manual_seed(tensor_seed(42, 3, "iid"))
    expected = torch.randn((3, 5), generator=gen, dtype=torch.float32)
    assert torch.equal(tensor_noise(p, 42, 3, "iid"), expected)
    assert torch.equal(noise_like((3, 5), "cpu", 42, 3, "iid"), expected)


def test_hf_checksum_sees_dtype_names_and_bits():
    a = {"w": torch.tensor([1.0, 2.0])}
    assert hf_checksum(a.items()) == hf_checksum({"w": torch.tensor([1.0, 2.0])}.items())
    assert hf_checksum(a.items()) != hf_checksum({"v": torch.tensor([1.0, 2.0])}.items())
    assert hf_checksum(a.items()) != hf_checksum({"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}.items())
    assert hf_checksum(a.items()) != hf_checksum({"w": torch.tensor([1.0, 2.0 + 2**-20])}.items())


def test_stop_token_ids_take_every_eos(tiny_model_dir, tmp_path):
    from esrepro.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    assert stop_token_ids(tiny_model_dir, tok) == [tok.eos_token_id]
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 3]}))
    assert stop_token_ids(tmp_path) == [3, 7]


def test_engine_module_imports_without_vllm():
    import esrepro.backends.vllm_engine as eng

    assert eng.WORKER_EXTENSION == f"{eng.__name__}.{eng.ESWorkerExtension.__name__}"


# ---------------------------------------------------------------- GPU only

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.parametrize("name,make_config,tp", CASES, ids=IDS)
def test_perturb_bf16_on_cuda_is_bit_exact(name, make_config, tp):
    """On CUDA the elementwise add applies one formula to every element, so bf16 shards match too."""
    config = make_config()
    layout = build_layout(config, tp)
    state = {n: t.cuda() for n, t in hf_state(config, torch.bfloat16).items()}
    vllm_states = shards(state, layout)
    perturb_(list(state.values()), 99, 1e-3, "iid")
    for r, st in enumerate(vllm_states):
        specs = layout.shards(r)
        perturb_shards_([st[s.name] for s in specs], specs, 99, 1e-3, "iid")
    assert_same(to_hf(vllm_states, layout), state)


# ---------------------------------------------------------------- resume state (CPU)


def hf_engine_weights(state: dict[str, torch.Tensor], **options) -> ESWeights:
    """The transformers engine's ES state over ``state``'s tensors (what HFEngine holds)."""
    return ESWeights(list(state.values()), **options)


def masters_of(ranks: list[ShardedWeights], gather) -> dict[str, torch.Tensor]:
    return {k: v for k, v in ranks[0].hf_state(gather).items() if k.startswith("m")}


@pytest.mark.parametrize("masters", [None, "float32"], ids=["exact-snapshot", "fp32-masters"])
@pytest.mark.parametrize("name,make_config,tp", [CASES[2], CASES[4]], ids=[IDS[2], IDS[4]])
def test_sharded_resume_state_is_the_hf_engines_file(name, make_config, tp, masters, tmp_path):
    """Ranks write what ESWeights.state() holds for the HF model (p{k}, m{k}), and load it back at any TP size."""
    config = make_config()
    layout = build_layout(config, tp)
    options = dict(noise="iid", restore="exact", master_weights=masters)
    state = hf_state(config, torch.bfloat16)
    hf = hf_engine_weights(state, **options)
    ranks, gather = simulated_ranks(state, layout, **options)
    for w in [hf, *ranks]:
        w.apply_update([1, 2], [0.8, -0.8], 1e-3)  # below a bf16 ulp for many weights: masters differ from weights
    expected = hf.state()
    assert ranks[1].save_state(tmp_path / "rank1.safetensors", lambda t: None) is False
    assert ranks[0].save_state(tmp_path / "state.safetensors", gather) is True
    saved = load_file(str(tmp_path / "state.safetensors"))
    assert set(saved) == set(expected) and (masters is None) == (not any(k.startswith("m") for k in saved))
    assert_same({k: saved[k] for k in expected}, expected)

    # load into ranks of another tensor-parallel size that hold other weights
    other = build_layout(config, 1 if tp == 2 else 2)
    fresh, gather_fresh = simulated_ranks(hf_state(config, torch.bfloat16, seed=1), other, **options)
    for w in fresh:
        w.load_state_file(tmp_path / "state.safetensors")
    assert fresh[0].checksum(gather_fresh) == hf_checksum(state.items())
    if masters:
        assert_same(masters_of(fresh, gather_fresh), {k: v for k, v in expected.items() if k.startswith("m")})
    # the exact-restore copy follows the loaded weights, not the ones built with
    for w in fresh:
        w.perturb(7, 0.5)
        w.restore(7, 0.5)
    assert fresh[0].checksum(gather_fresh) == hf_checksum(state.items())
    # and the next update continues from the masters: same as the HF engine's
    for w in [hf, *fresh]:
        w.apply_update([3], [1.0], 1e-3)
    assert fresh[0].checksum(gather_fresh) == hf_checksum(state.items())


def test_hf_engine_resume_file_loads_into_vllm_shards(tiny_model_dir, tmp_path):
    """The transformers engine's save_state file (a real checkpoint's parameters) loads into simulated vLLM ranks."""
    from transformers import AutoConfig

    from esrepro.backends.hf import HFEngine
    from esrepro.models.loading import load_model

    engine = HFEngine(tiny_model_dir, restore="exact", master_weights="float32")
    engine.apply_update([5], [1.0], 0.05)
    engine.save_state(tmp_path / "state.safetensors")
    config = AutoConfig.from_pretrained(tiny_model_dir)
    layout = build_layout(config, 1)
    base = {n: p.data for n, p in load_model(tiny_model_dir).named_parameters()}
    ranks, gather = simulated_ranks(base, layout, restore="exact", master_weights="float32")
    assert ranks[0].checksum(gather) != engine.checksum()
    ranks[0].load_state_file(tmp_path / "state.safetensors")
    assert ranks[0].checksum(gather) == engine.checksum()


def test_sharded_resume_state_refuses_a_file_of_another_kind(tmp_path):
    config = qwen2()
    layout = build_layout(config, 2)
    state = hf_state(config, torch.float32)
    plain, gather = simulated_ranks(state, layout, restore="exact")
    with_masters, _ = simulated_ranks(state, layout, restore="exact", master_weights="float32")
    plain[0].save_state(tmp_path / "plain.safetensors", gather)
    with pytest.raises(KeyError, match="no float32 masters"):
        with_masters[0].load_state_file(tmp_path / "plain.safetensors")
    partial = load_file(str(tmp_path / "plain.safetensors"))
    del partial["p3"]
    from safetensors.torch import save_file

    save_file(partial, str(tmp_path / "partial.safetensors"))
    with pytest.raises(KeyError, match=r"lacks weights \['p3'\]"):
        plain[1].load_state_file(tmp_path / "partial.safetensors")
