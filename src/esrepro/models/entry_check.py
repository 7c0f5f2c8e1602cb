"""Whether a registry entry is a causal LM transformers can load, checked before any job (:mod:`esrepro.planning.checks`)
and by ``esrepro add-model``.

A hub entry's ``config`` and a local folder's ``config.json`` must build in transformers (``AutoConfig`` by their
``model_type``) into a causal LM with decoder blocks, built on the meta device (no weights). An encoder (BERT,
RoBERTa: transformers has a causal LM class for them, which needs ``is_decoder``), an encoder-decoder, or a config
whose ``architectures`` name no causal LM class is refused. A folder must also hold weights and a tokenizer, and
where its entry states ``config`` too, the two agree field by field. A locally built entry (``build``) naming a
``model_type`` is checked the same way on the tiny builder's config (:func:`~esrepro.models.architecture.
build_config_facts`); the default Qwen2 build is not (validating the tiny default loads no transformers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from esrepro.models.architecture import (
    ArchitectureError,
    build_config_facts,
    cached_meta_model,
    config_differences,
    config_from_facts,
    decoder_layers,
    one_line,
    read_config_json,
)
from esrepro.models.local import TOKENIZER_CONFIG, model_files, weight_files
from esrepro.settings.layers import at

#: Class-name endings of causal LM heads in transformers (``Qwen2ForCausalLM``, ``GPT2LMHeadModel``).
CAUSAL_LM_CLASSES = ("ForCausalLM", "LMHeadModel")


def _field(facts: Mapping[str, Any], message: str) -> str | None:
    """The config key a failure's message names (the longest that appears in it), if any."""
    named = [k for k in facts if k in message]
    return max(named, key=len) if named else None


def _not_causal(facts: Mapping[str, Any], config) -> str | None:
    """Why ``config`` (of ``facts``) is not a decoder-only causal LM, or None."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return f"model_type {config.model_type!r} is an encoder-decoder model, not a causal LM"
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return (f"model_type {config.model_type!r} is an encoder (a masked LM; its causal LM class needs "
                "is_decoder: true), not a causal LM")
    architectures = facts.get("architectures")
    if architectures and not any(str(a).endswith(CAUSAL_LM_CLASSES) for a in architectures):
        return f"architectures {list(architectures)} names no causal LM class (*ForCausalLM, *LMHeadModel)"
    return None


def _line(where: str, file: str | None, field: str | None, text: str) -> str:
    """``where.field: text``, or ``where: file: field: text`` for a folder's config.json."""
    if file is None:
        return f"{where}{'.' + field if field else ''}: {text}"
    return f"{where}: {file}{': ' + field if field else ''}: {text}"


def config_problems(facts: Mapping[str, Any], where: str, file: str | None = None) -> list[str]:
    """Why the ``config.json`` mapping ``facts`` is not a causal LM transformers builds, one line each naming
    ``where`` (``file: models.<key>.config``; with ``file``, the config.json it was read from) and the field at
    fault where one is; empty when it is one."""
    import transformers

    try:
        config = config_from_facts(facts, "")
    except ArchitectureError as exc:
        text = (f"model_type {facts.get('model_type')!r} is not an architecture transformers "
                f"{transformers.__version__} knows" if facts.get("model_type") else str(exc).removeprefix(": "))
        return [_line(where, file, "model_type", text)]
    except Exception as exc:  # a value the config class refuses (its own checks raise many types)
        return [_line(where, file, _field(facts, str(exc)),
                      f"transformers refuses it: {type(exc).__name__}: {one_line(exc)}")]
    why = _not_causal(facts, config)
    if why:
        return [_line(where, file, "model_type" if why.startswith("model_type") else "architectures", why)]
    try:
        decoder_layers(cached_meta_model(facts))
    except ArchitectureError as exc:
        return [_line(where, file, "model_type", one_line(exc))]
    except Exception as exc:  # shapes the model class cannot build
        return [_line(where, file, _field(facts, str(exc)),
                      f"the model does not build: {type(exc).__name__}: {one_line(exc)}")]
    return []


def folder_problems(folder: str | Path, where: str) -> list[str]:
    """What a local model folder lacks (a folder, config.json, weights, a tokenizer), one line each."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{where}: {folder} is not a folder"]
    out = []
    if not (folder / "config.json").is_file():
        out.append(f"{where}: no config.json in {folder} (not a transformers model folder)")
    files = model_files(folder)
    if not weight_files(files):
        out.append(f"{where}: {folder} holds no weights (*.safetensors, or *.bin) at its top level")
    if TOKENIZER_CONFIG not in files:
        out.append(f"{where}: {folder} has no tokenizer ({TOKENIZER_CONFIG})")
    return out


def entry_problems(key: str, entry: Any, source: str) -> list[str]:
    """Why registry entry ``key`` (a :class:`~esrepro.settings.registry.ModelEntry` of registry file ``source``) is
    not a causal LM transformers can load, one line each naming the entry and the field; empty when it is one (and
    for a locally built Qwen2)."""
    build = getattr(entry, "build", None)
    if build is not None:
        if build.architecture.model_type is None:  # the tiny default's Qwen2 (esrepro.models.tiny)
            return []
        facts = build_config_facts(build.architecture.model_dump(mode="json"), build.tokenizer.vocab_size)
        return config_problems(facts, at(source, "models", key, "build", "architecture"))
    stated = entry.config if isinstance(entry.config, dict) else None
    if entry.path is None:
        if stated is None:
            return [at(source, "models", key, "config") + ": no config (the model's config.json as a mapping, or a "
                    "JSON file under the repository such as config/model_configs/<key>.json)"]
        return config_problems(stated, at(source, "models", key, "config"))
    where = at(source, "models", key, "path")
    out = folder_problems(entry.path, where)
    if not (Path(entry.path) / "config.json").is_file():
        return out
    try:
        own = read_config_json(entry.path, where)
    except ArchitectureError as exc:
        return [*out, str(exc)]
    if stated is not None:
        own_file = Path(entry.path) / "config.json"
        out += [at(source, "models", key, "config") + f".{diff} ({own_file})"
                for diff in config_differences(stated, own)]
    return out + config_problems(own, where, str(Path(entry.path) / "config.json"))
