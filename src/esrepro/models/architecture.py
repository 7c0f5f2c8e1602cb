"""A model is its transformers config: its shapes, layer kinds and linear layers come from a build on torch's meta
device, never from a table typed per family.

A registry entry states its config three ways (:func:`entry_config_facts`): a locally built model's ``build``
block (the tiny builder's architecture), a hub model's ``config`` (its ``config.json`` as a mapping, or a JSON file
of the repository holding it: planning runs before any download), or a local folder's own ``config.json``
(``path``). :func:`config_from_facts` turns such a mapping into the transformers config ``AutoConfig`` would read
from that ``config.json``; :func:`meta_model` builds its causal LM without weights.

Which linear layers a method adapts is read off that model (:func:`decoder_linears`): the ``nn.Linear`` modules
inside its decoder blocks (the blocks are the modules of the classes transformers keeps whole,
``_no_split_modules``). Attention's linears are those under a block's attention module (a child whose name holds
``attn`` or ``attention``, transformers' names for it in every decoder family). Where a checkpoint fuses
projections (Phi-3's ``qkv_proj`` and ``gate_up_proj``), the fused linear is the target, as the tensor is.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

if TYPE_CHECKING:
    import torch

#: Keys of a ``config.json`` that record how and when it was written, not the model: never compared with an
#: entry's config and never passed on to transformers.
BOOKKEEPING = frozenset({"transformers_version", "_name_or_path", "_commit_hash", "_attn_implementation_autoset",
                         "torch_dtype", "dtype", "use_cache"})
#: Names transformers gives the attention module of a decoder block (``self_attn``, ``attention``, ``attn``).
ATTENTION_PARTS = ("attn", "attention")
#: What a method's targets can be: every linear layer of the decoder blocks, their attention's only, or module names.
TargetScope = Literal["all", "attention"] | Sequence[str]


class ArchitectureError(ValueError):
    """A config transformers cannot build, or a model whose decoder blocks cannot be found."""


def one_line(text: object, limit: int = 240) -> str:
    """An exception's (or any) text on one line, at most ``limit`` characters and ``...`` (transformers' messages
    list every class it knows)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit] + "..."


def config_from_facts(facts: Mapping[str, Any], where: str = "the config"):
    """The transformers config of a ``config.json`` mapping (``model_type`` names its class, as ``AutoConfig``
    reads it); bookkeeping keys (:data:`BOOKKEEPING`) left out."""
    from transformers import AutoConfig

    model_type = facts.get("model_type")
    if not model_type:
        raise ArchitectureError(f"{where}: no model_type (the config.json key naming the architecture)")
    rest = {k: v for k, v in facts.items() if k != "model_type" and k not in BOOKKEEPING}
    try:
        return AutoConfig.for_model(str(model_type), **rest)
    except (ValueError, KeyError) as exc:  # transformers' message lists every model type it knows: cut it short
        raise ArchitectureError(f"{where}: model_type {model_type!r} is not an architecture transformers "
                                f"knows ({one_line(exc, 200)})") from exc


def read_config_json(folder: str | Path, where: str | None = None) -> dict[str, Any]:
    """A model folder's ``config.json`` as a mapping."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{where or folder}: no config.json in {folder}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ArchitectureError(f"{where or folder}: {path} is not JSON ({exc})") from exc


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def config_differences(stated: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Each field ``stated`` gives (bookkeeping aside) that ``actual`` lacks or holds otherwise, as
    ``field: stated X, the model's config.json has Y``."""
    out = []
    for key in sorted(stated):
        if key in BOOKKEEPING:
            continue
        if key not in actual:
            out.append(f"{key}: stated {stated[key]!r}, the model's config.json has no {key}")
        elif not _same(stated[key], actual[key]):
            out.append(f"{key}: stated {stated[key]!r}, the model's config.json has {actual[key]!r}")
    return out


#: The architecture a build block builds when it names none.
DEFAULT_MODEL_TYPE = "qwen2"


def build_config_facts(architecture: Mapping[str, Any], vocab_size: int, eos_id: int | None = None) -> dict[str, Any]:
    """The ``config.json`` mapping the tiny builder (:mod:`esrepro.models.tiny`) gives a build block's
    ``architecture`` (its ``model_type``, default :data:`DEFAULT_MODEL_TYPE`, its shape and its ``options``): tied
    embeddings, rope theta 10,000 and the end-of-sequence id (None before the tokenizer is trained) as bos, eos and
    pad, unless the options say otherwise."""
    arch = dict(architecture)
    model_type = arch.pop("model_type", None) or DEFAULT_MODEL_TYPE
    options = arch.pop("options", None) or {}
    return {"model_type": model_type, "vocab_size": vocab_size, "tie_word_embeddings": True,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "rope_theta": 10000.0,
            **arch, **options}


def entry_config_facts(entry: Any, key: str = "") -> dict[str, Any]:
    """The ``config.json`` mapping of a registry entry (a :class:`~esrepro.settings.registry.ModelEntry`): its
    ``config`` where it states one (a hub model's, checked against the download), a local folder's own
    ``config.json`` (``path``), or the tiny builder's config of its ``build`` block."""
    name = key or getattr(entry, "display", "") or "model"
    stated = getattr(entry, "config", None)
    if isinstance(stated, str):
        raise ArchitectureError(f"model {name!r}: config {stated!r} was not read (load the registry with "
                                "esrepro.config.load_registry, which reads it)")
    if stated:
        return dict(stated)
    if getattr(entry, "path", None):
        return read_config_json(entry.path, f"model {name!r}")
    build = getattr(entry, "build", None)
    if build is not None:
        return build_config_facts(build.architecture.model_dump(mode="json"), build.tokenizer.vocab_size)
    raise ArchitectureError(f"model {name!r}: no config (a hub model states its config.json as config: a mapping "
                            "or a JSON file under the repository; esrepro add-model writes it)")


def entry_config(entry: Any, key: str = ""):
    """The transformers config of a registry entry (:func:`entry_config_facts`)."""
    name = key or getattr(entry, "display", "") or "model"
    return config_from_facts(entry_config_facts(entry, key), f"model {name!r}")


def facts_key(facts: Mapping[str, Any]) -> str:
    """A mapping as a canonical string (the cache key of a meta build)."""
    return json.dumps(facts, sort_keys=True, default=str)


def meta_model(config) -> "torch.nn.Module":
    """The causal LM of ``config`` built on torch's meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config)
        except ValueError as exc:
            raise ArchitectureError(f"model_type {config.model_type!r}: not a causal LM transformers can build "
                                    f"({exc})") from exc


@functools.lru_cache(maxsize=64)
def _meta_from_key(key: str) -> "torch.nn.Module":
    return meta_model(config_from_facts(json.loads(key)))


def cached_meta_model(facts: Mapping[str, Any]) -> "torch.nn.Module":
    """:func:`meta_model` of a ``config.json`` mapping, built once per distinct mapping (never modify it)."""
    return _meta_from_key(facts_key(facts))


def decoder_layers(model: "torch.nn.Module") -> tuple[str, Sequence["torch.nn.Module"]]:
    """The qualified name of the module list holding ``model``'s decoder blocks, and the blocks: the list whose
    entries are of a class transformers keeps whole (``_no_split_modules``), else the one with as many entries
    as the config's ``num_hidden_layers``."""
    import torch

    whole = set(getattr(model, "_no_split_modules", None) or ())
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    found = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        if type(module[0]).__name__ in whole:
            return name, module
        if found is None and layers is not None and len(module) == layers:
            found = (name, module)
    if found is None:
        raise ArchitectureError(f"{type(model).__name__}: no list of decoder blocks found "
                                f"(_no_split_modules {sorted(whole)}, num_hidden_layers {layers})")
    return found


def _in_attention(relative: str) -> bool:
    return any(part in piece for piece in relative.split(".")[:-1] for part in ATTENTION_PARTS)


def decoder_linears(model: "torch.nn.Module", scope: TargetScope = "all") -> list[str]:
    """Qualified names of the ``nn.Linear`` modules inside ``model``'s decoder blocks, in module order: all of
    them, attention's only (``scope="attention"``), or those whose own name is one of ``scope``'s names."""
    import torch

    prefix, blocks = decoder_layers(model)
    out = []
    for i, block in enumerate(blocks):
        for rel, module in block.named_modules():
            if not isinstance(module, torch.nn.Linear) or not rel:
                continue
            if scope == "attention" and not _in_attention(rel):
                continue
            if not isinstance(scope, str) and rel.rsplit(".", 1)[-1] not in scope:
                continue
            out.append(f"{prefix}.{i}.{rel}")
    if not out:
        raise ArchitectureError(f"{type(model).__name__}: no linear layer in its decoder blocks matches targets "
                                f"{scope!r}")
    return out


def target_module_names(model: "torch.nn.Module", scope: TargetScope = "all") -> list[str]:
    """The distinct last names of :func:`decoder_linears` (what peft's and vLLM's ``target_modules`` take), sorted."""
    return sorted({name.rsplit(".", 1)[-1] for name in decoder_linears(model, scope)})


def linear_weight_names(model: "torch.nn.Module", scope: TargetScope = "all") -> frozenset[str]:
    """The HF parameter names (``<module>.weight``) of :func:`decoder_linears`."""
    return frozenset(f"{name}.weight" for name in decoder_linears(model, scope))
