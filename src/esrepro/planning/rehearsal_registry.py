"""The model registry as the rehearsal runs it: the same models and layouts, on CPUs, with thinned RL grids, each hub
model stated by the config of its random-weight replica (:func:`replica_config`: what the mirror serves, so the
fetch's config check compares what it downloads); and an RL run's per-step batch thinned for the paper job's
training processes (:func:`rl_batch`).

Pure functions of a registry and the rehearsal's settings, below the pipeline: the rehearsal transforms the config
and the registry (:mod:`esrepro.planning.rehearsal_bounds`) before the pipeline that runs is built.

A replica's ``config.json`` (:func:`replica_config`) is the registry entry's own config
(:func:`esrepro.models.architecture.entry_config_facts`: its model type, architecture class, rope, tied embeddings,
norms, layer kinds, whatever it states) at the toy structure of :data:`esrepro.models.tokenizer_families.STRUCTURE`, with
the replica tokenizer's vocabulary and token ids. What the real config states is kept as it is, except what cannot
stay at toy size (:func:`toy_config`):

- the width, depth and heads become STRUCTURE's; an explicit ``head_dim`` becomes the toy head's (32);
- the key-value heads keep the attention's kind: as many as the query heads where the real model has as many
  (multi-head: OLMo 2, Phi-3), one where it has one (multi-query: Gemma 3 1B), else STRUCTURE's 2 (grouped-query);
- every per-layer list (a list as long as the real depth: ``layer_types``, ``no_rope_layers``) keeps two of its
  layers, the first and the first of another kind where there is one, so the toy model has each kind the real one
  has (Gemma 3: a sliding and a full attention layer); counts of layers (``max_window_layers``,
  ``first_k_dense_replace``) are clipped to the toy depth, and so is a period of layer kinds
  (``sliding_window_pattern``, Gemma 3's: every n-th layer full), so the toy's last layer keeps the other kind;
- a further MLP width (``*_intermediate_size``: experts', shared experts') becomes the toy's;
- Gemma's ``query_pre_attn_scalar`` (the attention scale, set to the real head size) is scaled with the head;
- rope factors given per frequency (``short_factor``/``long_factor`` of Phi-3's LongRoPE, one per pair of
  rotary dimensions) are resampled to the toy head's pairs, which transformers checks;
- token ids (``*_token_id``) and ``vocab_size`` belong to the real vocabulary: the replica's are set
  (:func:`replica_tokens`), a pad id only where the real config or its class's defaults give one; bookkeeping keys
  (:data:`esrepro.models.architecture.BOOKKEEPING`) go, and ``torch_dtype`` is the entry's dtype.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Mapping

from esrepro.models.architecture import BOOKKEEPING, config_from_facts, entry_config_facts
from esrepro.models.tokenizer_families import BPE_VOCAB, STRUCTURE, Facts, facts_for
from esrepro.rl.grpo_parallel import process_batch
from esrepro.settings.methods import GRPO_ALGORITHMS
from esrepro.settings.pipeline import Rehearsal
from esrepro.settings.registry import ModelEntry, Resources


def cpu_resources(res: Resources, rehearsal: Rehearsal) -> Resources:
    """One rule's resources on CPUs: no GPUs; a multi-node job keeps its Ray cluster on one node (scripts/ray-slurm)
    with ``rehearsal.ray_cpus`` CPUs for its engines; a job of several GPUs keeps one training process per GPU (at
    most ``rehearsal.rl_processes``: an RL job's count, esrepro.planning.cluster.rl_job; an ESSA SFT takes at most
    ``rehearsal.processes`` of them, esrepro.planning.cluster.launcher)."""
    processes = min(res.training_processes(), rehearsal.rl_processes) if res.gpu > 1 or res.processes else None
    ray = res.ray_cluster or res.nodes > 1
    return res.model_copy(update={
        "gpu": 0, "gpu_model": None, "cpus_per_gpu": None, "cpus_per_task": rehearsal.ray_cpus if ray else rehearsal.cpus,
        "mem_mb": rehearsal.mem_mb, "runtime": rehearsal.runtime, "nodes": 1, "processes": processes,
        "ray_cluster": ray})


def thin_method(method: dict, rehearsal: Rehearsal) -> dict:
    """A registry method entry with its RL grid cut to the first value of every setting, no extra cells, and at
    most ``rehearsal.ray_cpus`` engines (one CPU each)."""
    out = {k: v for k, v in method.items() if k != "cells"}
    if isinstance(out.get("engines"), int):
        out["engines"] = min(out["engines"], rehearsal.ray_cpus)
    if isinstance(out.get("grid"), dict):
        out["grid"] = {k: list(v)[:1] for k, v in out["grid"].items()}
    return out


def rehearsal_registry(registry: dict[str, ModelEntry], rehearsal: Rehearsal) -> dict[str, ModelEntry]:
    """Every registry entry as the rehearsal runs it (:func:`cpu_resources`, :func:`thin_method`, the dtype; a hub
    model's config its replica's, :func:`replica_config`)."""
    out = {}
    for key, entry in registry.items():
        update: dict = {
            "resources": {rule: cpu_resources(r, rehearsal) for rule, r in entry.resources.items()},
            "methods": {name: thin_method(dict(m), rehearsal) for name, m in entry.methods.items()},
        }
        if entry.hub_id:
            update["config"] = replica_config(key, entry)
        if rehearsal.dtype:
            update["dtype"] = rehearsal.dtype
        out[key] = entry.model_copy(update=update)
    return out


def rl_batch(settings: dict, world: int) -> dict[str, Any]:
    """The per-step batch fields of an RL run thinned to toy size so that ``world`` processes share it as they share
    the paper's (``settings``: the paper run's method settings; ``world``: the paper job's processes), and no more
    processes up to ``world`` do: one completion (GRPO) or two prompts (PPO) per process and step.

    GRPO keeps how the paper's batch divides: the accumulation steps where the paper's divide by ``world`` (then one
    group of 2 per micro-step and process), else the micro-batch (``world`` completions, in groups of
    gcd(num_generations, ``world``): a group spans processes where the paper's does). PPO keeps two mini-batches per
    step: ``2 x world`` prompts, mini-batches of ``world``, one response per pass."""
    algorithm = settings.get("algorithm")
    if algorithm in GRPO_ALGORITHMS:
        process_batch(settings, world)  # the paper's batch admits the paper's world (else a ValueError naming it)
        if int(settings.get("gradient_accumulation_steps", 1)) % world == 0:
            return {"per_device_train_batch_size": 2, "gradient_accumulation_steps": world, "num_generations": 2}
        group = math.gcd(int(settings["num_generations"]), world)
        return {"per_device_train_batch_size": world, "gradient_accumulation_steps": 1,
                "num_generations": group if group > 1 else world}
    if algorithm == "ppo":
        return {"prompts_per_step": 2 * world, "mini_batch_size": world, "micro_batch_size": 1,
                "rollout_batch_size": None}
    raise ValueError(f"algorithm {algorithm!r} is not an RL algorithm")


# --- replicas' configs ----------------------------------------------------------------------------------------------
#: The toy head size: STRUCTURE's width over its heads.
TOY_HEAD = STRUCTURE["hidden_size"] // STRUCTURE["num_attention_heads"]
#: Config keys that count decoder layers (clipped to the toy depth).
LAYER_COUNTS = ("max_window_layers", "first_k_dense_replace")
#: Config keys giving a period of layer kinds (clipped to the toy depth: its last layer is then of the other kind).
LAYER_PERIODS = ("sliding_window_pattern",)
#: Config keys holding rope settings (transformers 4's ``rope_scaling``, transformers 5's ``rope_parameters``).
ROPE_KEYS = ("rope_scaling", "rope_parameters")


def toy_kv_heads(heads: int, kv_heads: int | None) -> int:
    """The toy key-value heads keeping the real attention's kind (multi-head, multi-query, grouped-query)."""
    if kv_heads is None or kv_heads == heads:
        return STRUCTURE["num_attention_heads"]
    return 1 if kv_heads == 1 else STRUCTURE["num_key_value_heads"]


def layer_picks(facts: Mapping[str, Any]) -> list[int]:
    """The real layers the toy model's keep: the first, and the first whose entries of the per-layer lists differ
    from it (else the second)."""
    depth = int(facts["num_hidden_layers"])
    lists = [v for v in facts.values() if isinstance(v, list) and len(v) == depth and depth > 1]
    other = next((i for i in range(1, depth) if any(v[i] != v[0] for v in lists)), 1)
    return [0, other][:STRUCTURE["num_hidden_layers"]] if depth > 1 else [0]


def _rope(value: Any, pairs: int) -> Any:
    """A rope mapping with every per-frequency factor list resampled to ``pairs`` entries (nested mappings too:
    transformers 5 keeps one per layer kind)."""
    if not isinstance(value, Mapping):
        return value
    out = {}
    for key, v in value.items():
        if isinstance(v, list) and "factor" in key and v and len(v) != pairs:
            out[key] = [v[i * len(v) // pairs] for i in range(pairs)]
        else:
            out[key] = _rope(v, pairs)
    return out


def toy_config(facts: Mapping[str, Any], where: str = "the config") -> dict[str, Any]:
    """The config.json mapping ``facts`` (a real model's) at the toy structure, without its token ids and
    vocabulary size (the module's docstring lists what changes and why)."""
    missing = [k for k in ("model_type", "num_hidden_layers", "num_attention_heads") if k not in facts]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)} (a replica scales the config's shape)")
    depth, heads = int(facts["num_hidden_layers"]), int(facts["num_attention_heads"])
    real_head = facts.get("head_dim") or (int(facts["hidden_size"]) // heads if facts.get("hidden_size") else None)
    picks = layer_picks(facts)
    out: dict[str, Any] = {}
    for key, value in facts.items():
        if key in BOOKKEEPING or key == "vocab_size" or key.endswith("_token_id"):
            continue
        if isinstance(value, list) and len(value) == depth and depth > 1:
            value = [value[i] for i in picks]
        elif key in LAYER_COUNTS + LAYER_PERIODS and isinstance(value, int) and not isinstance(value, bool):
            value = min(value, STRUCTURE["num_hidden_layers"])
        elif key.endswith("_intermediate_size") and isinstance(value, int):
            value = STRUCTURE["intermediate_size"]
        elif key == "query_pre_attn_scalar" and real_head:
            scaled = value * TOY_HEAD / real_head
            value = int(scaled) if float(scaled).is_integer() else scaled
        out[key] = value
    out.update(STRUCTURE, num_key_value_heads=toy_kv_heads(heads, facts.get("num_key_value_heads")))
    if "head_dim" in facts:
        out["head_dim"] = TOY_HEAD
    rotary = float(facts.get("partial_rotary_factor") or 1.0)
    for key in ROPE_KEYS:
        if key in out:
            out[key] = _rope(out[key], int(TOY_HEAD * rotary) // 2)
    return out


def replica_tokens(facts: Facts) -> tuple[dict[str, int], int]:
    """The replica tokenizer's ids of ``facts``' special and added tokens (in order after the :data:`BPE_VOCAB` BPE
    symbols, as :func:`esrepro.rehearsal.replica_tokenizer.train_tokenizer` adds them) and the config's vocabulary
    size (rounded up to ``facts.pad_vocab_to``)."""
    tokens = facts.specials + facts.plain_added
    n = BPE_VOCAB + len(tokens)
    return {t: BPE_VOCAB + i for i, t in enumerate(tokens)}, -(-n // facts.pad_vocab_to) * facts.pad_vocab_to


def _entry(entry: Any) -> Any:
    return SimpleNamespace(**entry) if isinstance(entry, Mapping) else entry


def replica_facts(name: str, entry: Any) -> tuple[dict[str, Any], Facts]:
    """The real config.json of registry model ``name`` (its ``entry``: a ModelEntry, or a mapping with hub_id,
    config and optionally chat_template) and its replica's tokenizer facts."""
    entry = _entry(entry)
    if not getattr(entry, "hub_id", None):
        raise ValueError(f"model {name!r}: not a hub model (no hub_id): nothing to replicate")
    real = entry_config_facts(entry, name)
    return real, facts_for(entry.hub_id, str(real.get("model_type")), bool(getattr(entry, "chat_template", False)))


def replica_config(name: str, entry: Any) -> dict[str, Any]:
    """The ``config.json`` of registry model ``name``'s replica (the module's docstring): the entry's config at toy
    size with the replica's vocabulary and token ids, its dtype as ``torch_dtype``, keys sorted."""
    real, facts = replica_facts(name, entry)
    ids, vocab = replica_tokens(facts)
    eos = [ids[t] for t in facts.config_eos]
    where = f"model {name!r}: config"
    config = {**toy_config(real, where), "vocab_size": vocab, "bos_token_id": ids[facts.config_bos],
              "eos_token_id": eos[0] if len(eos) == 1 else eos, "torch_dtype": getattr(_entry(entry), "dtype", None)}
    if "pad_token_id" in real or _default_pad(str(real["model_type"]), where):
        config["pad_token_id"] = ids[facts.pad_token or facts.config_eos[0]]
    return dict(sorted(config.items()))


def _default_pad(model_type: str, where: str) -> bool:
    """Whether transformers' config class of ``model_type`` gives a pad id by default (Phi-3's is 32,000: beyond a
    replica's vocabulary, the embedding refuses it)."""
    return config_from_facts({"model_type": model_type}, where).pad_token_id is not None
