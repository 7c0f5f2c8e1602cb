"""GPU memory per process of a paper job, counted from the model's shape and the job's own arguments.

A model is its ``config.json`` (a registry entry states it: :func:`esrepro.models.architecture.entry_config_facts`):
shapes, head size, tied embeddings, sliding windows and query/key norms are read from the transformers config, and
parameter counts, decoder blocks and their linear layers from a model built from it on torch's meta device
(:func:`facts_from_config`), no weights read, whatever the architecture.

Constants (bytes unless stated):

- :data:`GPU_BYTES`: an H100 SXM 80GB as ``nvidia-smi`` reports it, 81,559 MiB = 79.6 GiB.
- :data:`MARGIN`: a job fits when what it reserves exactly (a vLLM engine's ``gpu_memory_utilization`` share) plus
  (1 + MARGIN) x everything estimated is at most GPU_BYTES (10%: the allocator's fragmentation, NCCL buffers and
  what the model below leaves out); inside a vLLM engine, its weights and CUDA context plus (1 + MARGIN) x the
  estimated profiling, CUDA graphs and LoRA slots plus the KV cache it needs must fit its share.
- :data:`CUDA_CONTEXT`: the CUDA context, cuBLAS/cuDNN workspaces and NCCL of a process (about 0.5 GiB on an H100 with
  torch 2.x: assumed).
- Training: float32 master weights (4), their gradients (4) and AdamW's two moments (8) per trained parameter, a
  1/W share of each under FSDP2 (``fully_shard``: parameters, gradients and optimiser state sharded); an FSDP unit's
  parameters gathered in bf16 (2 a parameter) for its forward or backward, two units at once (the one computing and
  the one prefetched), plus the root unit (embeddings, final norm, LM head), which FSDP2 keeps gathered through the
  forward and the backward, and one unit's float32 gradients before the reduce-scatter.
- Activations per decoder layer and token: :data:`LAYER_ACTIVATION` x hidden + :data:`MLP_ACTIVATION` x
  intermediate bytes (the bf16 tensors autograd keeps for a Llama/Qwen2 layer with SDPA attention: norm inputs
  and outputs, q/k/v, attention output, gate, up, the activation and its product; Korthikanti et al. 2022 count
  34 x hidden for a GPT layer without the attention scores); under gradient checkpointing only each layer's input
  (:data:`CHECKPOINT_INPUT_BYTES` x hidden) is kept, and one layer's activations are rebuilt at a time. The input is
  bf16 though FSDP2's policy gives float32 outputs (esrepro.rl.grpo_parallel.BF16_POLICY): accelerate 1.15 shards
  the checkpoint wrapper around each layer as a unit of its own (its wrap policy looks through the wrapper), whose
  forward casts the input to bf16 before the checkpoint keeps it (tests/test_fsdp_memory.py watches it).
- Logits: TRL 1.16's GRPOTrainer never materialises them. It patches the policy and the reference with a fused LM
  head (trl/trainer/utils.py ``add_fused_lm_head``, trl/kernels/chunked_logprob.py) that projects the completion
  tokens' hidden states in tiles of :data:`TRL_TOKEN_CHUNK` tokens x :data:`TRL_VOCAB_CHUNK` vocabulary entries in
  the compute dtype and keeps per-token statistics in float32; its backward recomputes each tile and accumulates the
  hidden states' and the LM head's gradients in float32 (:func:`trl_head`). The FSDP policy's float32 output dtype
  (esrepro.rl.grpo_parallel.BF16_POLICY) then applies to per-token log-probabilities only. PPO (esrepro.rl.ppo)
  takes the model's logits over the whole sequence (bf16 under FSDP's bf16 parameters), a float32 copy of the
  response positions, its log-softmax, the probabilities and their product for the entropy: :data:`LOGIT_BYTES`
  per response token and vocabulary entry with the gradients in a training pass, :data:`SCORING_LOGIT_BYTES`
  without.
- KV cache: 2 (keys and values) x layers x key-value heads x head dim x 2 (bf16) per token; transformers'
  ``generate`` holds batch x (prompt + new tokens) of it and the last position's float32 logits at the end of
  decoding, and batch x prompt of it with the prompt's widest activations (the MLP's gate and up) while it fills
  the prompt (:func:`generate_peak`); :func:`generate_batch` is the largest batch that fits, which the evaluation
  and ESSA's transformers engines use on a GPU when it is below their ``batch_size``.
- vLLM (0.32, the pin): an engine takes ``gpu_memory_utilization`` x GPU_BYTES for its process. Inside it: the
  weights (a 1/tp share), the profiling run's activations (``max_num_batched_tokens`` tokens through the widest
  layer) and its sampler warm-up (:data:`VLLM_SAMPLER_WARMUP` bytes per sequence and vocabulary entry, up to
  ``max_num_seqs`` sequences), :data:`VLLM_CUDA_GRAPHS` for CUDA graphs
  (assumed), the LoRA slots (``max_loras`` x the adapter's rank slot x every LoRA-wrapped linear's inputs and
  outputs, bf16), and the CUDA context; the rest is KV cache, which must hold at least one sequence of
  ``max_model_len`` tokens (vLLM refuses to start otherwise) and, for an ESSA engine, one sequence per LoRA slot
  (else its candidates are scored a handful at a time).
- Quantised bases (bitsandbytes): int8 1 byte a linear weight, int4 (NF4, 64-element blocks with a float32 scale)
  0.5625; embeddings and the LM head stay bf16.
- Prompts: :data:`PROMPT_TOKENS` per task, an upper bound of the longest prompt with its chat markup (assumed where
  the data cannot be read on the submitting host: ARC's grids are long).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

from esrepro.models.architecture import (
    ArchitectureError,
    config_from_facts,
    decoder_layers,
    entry_config_facts,
    facts_key,
    meta_model,
)

GiB = 2**30
GPU_BYTES = 81_559 * 2**20  # H100 SXM 80GB: nvidia-smi's total, 79.6 GiB
MARGIN = 0.10
CUDA_CONTEXT = 0.5 * GiB
VLLM_CUDA_GRAPHS = 1.0 * GiB
CHECKPOINT_INPUT_BYTES = 2  # bytes per hidden unit and token of a checkpointed layer's input (bf16)
LAYER_ACTIVATION = 28  # bytes per hidden unit and token of one decoder layer (bf16 tensors autograd keeps)
MLP_ACTIVATION = 8  # bytes per intermediate unit and token (gate, up, activation, product; bf16)
#: Bytes per response token and vocabulary entry of PPO's logits in a training pass (esrepro.rl.ppo._response_logp:
#: a float32 copy, its log-softmax, the probabilities and their product for the entropy, and their gradients) and
#: in a pass without gradient (the copy, the temperature-scaled copy and the log-softmax).
LOGIT_BYTES = {"ppo": 24}
SCORING_LOGIT_BYTES = 12
#: TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py: TOKEN_CHUNK_SIZE; trl/trainer/utils.py:
#: _CHUNKED_LOGPROB_CHUNK_SIZE): tokens and vocabulary entries of one projected tile.
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
#: vLLM 0.32's defaults for the ``LLM`` class on a GPU of 70 GiB or more (vllm/engine/arg_utils.py).
#: Bytes per sequence and vocabulary entry at the peak of vLLM 0.32's sampler warm-up (gpu_model_runner.py
#: ``_dummy_sampler_run``, which profile_run calls on ``min(max_num_seqs, max_num_batched_tokens)`` rows): the logits
#: in the model's dtype (2), the sampler's float32 copy (4; sampler.py ``Sampler.forward``; temperature divides it in
#: place), and in the second call, which passes a generator and so takes ``forward_native``, the float32
#: probabilities (4) and the exponential noise of ``random_sample`` (4). On CUDA top-k and top-p mask in place
#: (``apply_top_k_top_p_triton``, a buffer of one row per SM); the PyTorch path, which sorts the batch and runs only
#: without Triton, peaks at 24. tests/test_vllm_sampler_memory.py runs vLLM's own warm-up and measures 14.0.
VLLM_SAMPLER_WARMUP = 2 + 4 + 4 + 4
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_BATCHED_TOKENS = 16384
#: TRL 1.16's colocated engine (trl/generation/vllm_generation.py): max_num_batched_tokens=4096.
TRL_VLLM_BATCHED_TOKENS = 4096
QUANT_BYTES = {"native": 2.0, "int8": 1.0, "int4": 0.5625}
PROMPT_TOKENS = {"arc": 4096}
DEFAULT_PROMPT_TOKENS = 512

@dataclass(frozen=True)
class ModelFacts:
    """What memory depends on, read off the model's transformers config and its build on the meta device."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    context: int  # max_position_embeddings
    tied: bool
    params: int
    layer_params: int  # one decoder layer
    root_params: int  # everything outside the decoder layers (embeddings, final norm, LM head)
    largest_tensor: int  # elements
    architecture: str
    decoder_layer: str  # the class FSDP wraps (_no_split_modules)
    head_dim: int = 0  # the config's head_dim where it states one, else hidden // heads
    #: (in_features, out_features) of each linear layer of one decoder block, in module order (what a LoRA slot
    #: wraps: vLLM wraps every linear layer of the blocks whatever an adapter targets)
    layer_linears: tuple[tuple[int, int], ...] = ()
    sliding_window: int | None = None  # the window of the sliding-attention layers, None: none slide
    sliding_layers: int = 0  # decoder layers attending within sliding_window
    qk_norm: bool = False  # per-head query and key norms (Qwen3, Gemma 3, OLMo 2)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 keys and values of one token over every layer (sliding layers counted whole: an upper bound)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)


@functools.lru_cache(maxsize=64)
def _facts_of(key: str) -> ModelFacts:
    return facts_from_config(config_from_facts(json.loads(key)))


def entry_facts(entry, key: str = "") -> ModelFacts:
    """:class:`ModelFacts` of a registry entry, from its config (:func:`esrepro.models.architecture.
    entry_config_facts`: a hub model's stated config.json, a folder's own, a build's), counted once per config; a
    config transformers cannot build is an :class:`~esrepro.models.architecture.ArchitectureError` naming the
    model (``key``, else its display name)."""
    from huggingface_hub.errors import StrictDataclassError  # transformers 5's configs validate their fields with it

    facts = entry_config_facts(entry, key)
    try:
        return _facts_of(facts_key(facts))
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        name = key or getattr(entry, "display", "") or "model"
        raise ArchitectureError(f"model {name!r}: {exc}") from exc


def prompt_tokens(task: str) -> int:
    """The longest prompt of ``task`` allowed for (:data:`PROMPT_TOKENS`)."""
    return PROMPT_TOKENS.get(task, DEFAULT_PROMPT_TOKENS)


# --- the pieces -----------------------------------------------------------------------------------------------


def layer_activation_bytes(m: ModelFacts, tokens: int) -> int:
    """One decoder layer's saved activations for ``tokens`` tokens (bf16)."""
    return tokens * (LAYER_ACTIVATION * m.hidden + MLP_ACTIVATION * m.intermediate)


def training_activations(m: ModelFacts, micro_batch: int, seq: int, checkpointing: bool) -> int:
    """A training pass's saved activations (no logits) for ``micro_batch`` sequences of ``seq`` tokens."""
    tokens = micro_batch * seq
    if checkpointing:
        return m.layers * tokens * m.hidden * CHECKPOINT_INPUT_BYTES + layer_activation_bytes(m, tokens)
    return m.layers * layer_activation_bytes(m, tokens)


def forward_activations(m: ModelFacts, micro_batch: int, seq: int) -> int:
    """A forward pass without gradient: one layer's widest activations (the MLP's gate and up, the residual)."""
    return prefill(m, micro_batch, seq)


def trl_head(m: ModelFacts, tokens: int, grad: bool, compute_bytes: int = 2) -> int:
    """TRL 1.16's fused LM head over ``tokens`` completion tokens: the selected hidden states (float32), one tile in
    the compute dtype, and with ``grad`` the float32 gradients of the hidden states and of the whole LM head (cast
    to the head's bf16 parameter dtype on its way to FSDP) and a tile of the head's weight in the compute dtype."""
    tile = min(tokens, TRL_TOKEN_CHUNK) * min(m.vocab, TRL_VOCAB_CHUNK) * compute_bytes
    out = tokens * m.hidden * 4 + tile + tokens * 8 * 4  # hidden states, a tile, the per-token statistics
    if grad:
        out += tokens * m.hidden * 4 + m.vocab * m.hidden * (4 + 2) + min(m.vocab, TRL_VOCAB_CHUNK) * m.hidden * 2
    return out


def ppo_logits(m: ModelFacts, micro_batch: int, seq: int, response: int, grad: bool) -> int:
    """PPO's logits of one pass: the whole sequence's in bf16 and the response positions' float32 work
    (:data:`LOGIT_BYTES` with gradients, :data:`SCORING_LOGIT_BYTES` without)."""
    per = LOGIT_BYTES["ppo"] if grad else SCORING_LOGIT_BYTES
    return micro_batch * seq * m.vocab * 2 + micro_batch * response * m.vocab * per


def fsdp_transient(m: ModelFacts, world: int, grad: bool = True) -> int:
    """FSDP2's gathered units beyond the shards: the root unit and two decoder layers in bf16, and with ``grad`` one
    layer's float32 gradients before their reduce-scatter (the same at any world size: ``fully_shard`` over one
    process gathers too)."""
    return (m.root_params + 2 * m.layer_params) * 2 + (m.layer_params * 4 if grad else 0)


def generate_kv(m: ModelFacts, batch: int, tokens: int) -> int:
    """transformers ``generate``'s KV cache and last-position float32 logits for ``batch`` sequences."""
    return batch * tokens * m.kv_bytes_per_token + batch * m.vocab * 4 * 2


def prefill(m: ModelFacts, batch: int, prompt: int) -> int:
    """The widest activation of a prompt's forward pass (the MLP's gate and up of every prompt token)."""
    return batch * prompt * (2 * m.intermediate + 4 * m.hidden) * 2


def quantised_weights(m: ModelFacts, precision: str) -> int:
    """A base in ``precision`` (bf16 embeddings and LM head under int8/int4)."""
    linear = m.params - m.embedding_params
    return int(linear * QUANT_BYTES[precision] + m.embedding_params * 2)


def lora_slot_bytes(m: ModelFacts, rank_slot: int, tp: int = 1) -> int:
    """One vLLM LoRA slot's buffers: A (rank x in) and B (out x rank) of every linear layer of every decoder block
    (:attr:`ModelFacts.layer_linears`; vLLM keeps a packed layer's slices apart, so q/k/v packed count as
    three), at ``rank_slot``, bf16 (column-parallel B and row-parallel A split over ``tp``)."""
    per_layer = sum(rank_slot * (fan_in + fan_out) for fan_in, fan_out in m.layer_linears)
    return m.layers * per_layer * 2 // tp


@dataclass
class VLLMFit:
    """One vLLM engine's budget and what it holds (bytes per GPU)."""

    budget: int
    weights: int
    profile: int
    graphs: int
    lora: int
    context: int
    kv: int
    max_model_len: int
    kv_per_sequence: int
    min_sequences: int

    @property
    def sequences(self) -> int:
        """Full-context sequences the KV cache holds."""
        return max(0, self.kv) // self.kv_per_sequence

    @property
    def fixed(self) -> int:
        return self.weights + self.profile + self.graphs + self.lora + self.context

    def problem(self) -> str | None:
        estimated = self.profile + self.graphs + self.lora
        need = self.weights + self.context + estimated * (1 + MARGIN) + self.min_sequences * self.kv_per_sequence
        if need <= self.budget:
            return None
        return (f"vLLM's share {gib(self.budget)} GiB must hold weights {gib(self.weights)} + profiling "
                f"{gib(self.profile)} + CUDA graphs {gib(self.graphs)} + LoRA slots {gib(self.lora)} + context "
                f"{gib(self.context)} + KV cache for {self.min_sequences} sequence(s) of {self.max_model_len:,} tokens "
                f"({gib(self.min_sequences * self.kv_per_sequence)}) = {gib(need)} GiB with a {MARGIN:.0%} margin on the "
                f"estimated parts (room for {self.sequences} such sequences)")


def vllm_fit(m: ModelFacts, *, utilization: float, tp: int = 1, max_model_len: int | None = None,
             max_num_seqs: int = VLLM_MAX_NUM_SEQS, max_num_batched_tokens: int = VLLM_MAX_BATCHED_TOKENS,
             max_loras: int = 0, lora_rank_slot: int = 0, min_sequences: int = 1,
             weight_bytes: float = 2.0) -> VLLMFit:
    """vLLM's budget on each of its GPUs at these engine arguments (``max_model_len`` None: the model's
    ``max_position_embeddings``, what vLLM takes when none is given)."""
    length = max_model_len or m.context
    seqs = min(max_num_seqs, max_num_batched_tokens)
    profile = max_num_batched_tokens * (2 * m.intermediate + 4 * m.hidden) * 2 // tp + \
        seqs * m.vocab * VLLM_SAMPLER_WARMUP
    budget = int(utilization * GPU_BYTES)
    weights = int(m.params * weight_bytes / tp)
    lora = max_loras * lora_slot_bytes(m, lora_rank_slot, tp) if max_loras else 0
    fit = VLLMFit(budget=budget, weights=weights, profile=profile, graphs=int(VLLM_CUDA_GRAPHS), lora=lora,
                  context=int(CUDA_CONTEXT), kv=0, max_model_len=length,
                  kv_per_sequence=length * m.kv_bytes_per_token // tp, min_sequences=min_sequences)
    fit.kv = budget - fit.fixed
    return fit


def gib(x: float) -> str:
    return f"{x / GiB:.1f}"


@dataclass
class Phase:
    """What a process holds at one moment of the job (bytes per component); ``reserved``: the part of the total that
    is an exact reservation (vLLM's share), which takes no margin."""

    name: str
    parts: dict[str, int] = field(default_factory=dict)
    reserved: int = 0

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def with_margin(self) -> float:
        return self.reserved + (self.total - self.reserved) * (1 + MARGIN)


def peak(phases: list[Phase]) -> Phase:
    """The phase that needs the most (with the margin)."""
    return max(phases, key=lambda ph: ph.with_margin)


def fits(phase: Phase, gpu_bytes: int = GPU_BYTES) -> bool:
    """Whether ``phase`` with the margin fits a GPU."""
    return phase.with_margin <= gpu_bytes


def generate_peak(m: ModelFacts, weights: int, batch: int, prompt: int, new_tokens: int) -> list[Phase]:
    """transformers ``generate`` of ``batch`` prompts of ``prompt`` tokens to ``new_tokens``: the prompt's forward
    pass, then the end of decoding."""
    base = {"weights": weights, "CUDA context": int(CUDA_CONTEXT)}
    return [Phase("prefill", {**base, "KV cache (prompts)": batch * prompt * m.kv_bytes_per_token,
                              "prompt activations": prefill(m, batch, prompt)}),
            Phase("decode", {**base, f"KV cache ({batch} x {prompt + new_tokens:,} tokens)":
                             generate_kv(m, batch, prompt + new_tokens)})]


def generate_batch(m: ModelFacts, weights: int, requested: int, prompt: int, new_tokens: int,
                   gpu_bytes: int = GPU_BYTES) -> int:
    """The largest batch up to ``requested`` whose ``generate`` fits ``gpu_bytes`` with the margin (0: not even one
    sequence). Greedy decoding gives each prompt its own tokens whatever the batch (left padding and the attention
    mask keep prompts apart; only float rounding of differently shaped matmuls can differ), and KL's sampling is
    seeded per prompt: a smaller batch changes the time, not what is generated."""
    lo, hi = 0, requested
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if all(fits(ph, gpu_bytes) for ph in generate_peak(m, weights, mid, prompt, new_tokens)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def facts_from_config(config) -> ModelFacts:
    """:class:`ModelFacts` of a transformers config (a checkpoint's own, at run time), counted on the meta device:
    any causal LM transformers builds, its decoder blocks found by :func:`esrepro.models.architecture.
    decoder_layers`."""
    import torch

    model = meta_model(config)
    params = sum(p.numel() for p in model.parameters())
    _, blocks = decoder_layers(model)
    layer = blocks[0]
    layer_params = sum(p.numel() for p in layer.parameters())
    linears = tuple((m.in_features, m.out_features) for m in layer.modules() if isinstance(m, torch.nn.Linear))
    kinds = list(getattr(config, "layer_types", None) or [])
    sliding = sum(1 for k in kinds if "sliding" in str(k))
    window = getattr(config, "sliding_window", None) if sliding else None
    names = {n.rsplit(".", 2)[-2] for n, _ in layer.named_parameters() if n.count(".") >= 2}
    return ModelFacts(hidden=config.hidden_size, intermediate=config.intermediate_size,
                      layers=config.num_hidden_layers, heads=config.num_attention_heads,
                      kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                      vocab=config.vocab_size, context=config.max_position_embeddings,
                      tied=bool(getattr(config, "tie_word_embeddings", False)), params=params,
                      layer_params=layer_params, root_params=params - layer_params * len(blocks),
                      largest_tensor=max(p.numel() for p in model.parameters()),
                      architecture=(config.architectures or [type(model).__name__])[0],
                      decoder_layer=type(layer).__name__,
                      head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                      layer_linears=linears, sliding_window=window, sliding_layers=sliding,
                      qk_norm=bool({"q_norm", "k_norm"} & names))


def runtime_generate_batch(model_dir, requested: int, prompt: int, new_tokens: int, device: str,
                           precision: str = "native", gpu_bytes: int = GPU_BYTES) -> int:
    """A job's ``generate`` batch on its GPU: :func:`generate_batch` for the checkpoint in ``model_dir`` on an H100
    (``gpu_bytes``: the registry's ``gpu_model`` of every paper job; read without initialising CUDA in a process
    that may only drive Ray actors), ``requested`` itself off CUDA; a RuntimeError when not one sequence fits."""
    if not str(device).startswith("cuda"):
        return requested
    from transformers import AutoConfig

    m = facts_from_config(AutoConfig.from_pretrained(str(model_dir)))
    total = gpu_bytes
    weights = quantised_weights(m, precision)
    batch = generate_batch(m, weights, requested, prompt, new_tokens, total)
    if batch < 1:
        raise RuntimeError(f"{model_dir}: not one sequence of {prompt + new_tokens} tokens fits {total / GiB:.1f} GiB "
                           f"beside {weights / GiB:.1f} GiB of weights")
    return batch
