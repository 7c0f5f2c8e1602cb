"""``esrepro add-model``: a registry entry written from a model's own config.json.

The model is read where it lives: a hub repository at a revision (its ``config.json``, ``tokenizer_config.json`` and
file list through the hub API, no weights) or a transformers model folder on disk (offline; the entry's ``path``).
The entry states the config facts (``config/model_configs/<key>.json`` in the repository, as every path of a config
is relative to it: the config.json without :data:`~esrepro.models.architecture.BOOKKEEPING` keys), ``family`` (the
``model_type``), ``size`` (the parameter count of a meta-device build), ``dtype`` (the config's, else bfloat16),
``chat_template`` (the tokenizer has one) and ``resources`` sized by the memory model (:func:`resources_for`). The
entry is appended to the registry as text, so its comments and anchors stay as they are; the registry is then read
back and the new entry checked as validation checks it (:func:`esrepro.models.entry_check.entry_problems`). On any
failure both files are left as they were.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from esrepro.config import load_registry, load_yaml
from esrepro.io import atomic_path, write_json, write_text
from esrepro.models.architecture import BOOKKEEPING, ArchitectureError, config_from_facts, read_config_json
from esrepro.models.entry_check import config_problems, entry_problems, folder_problems
from esrepro.models.memory import GPU_BYTES, facts_from_config, vllm_fit
from esrepro.population.placement import GPU_MEMORY_UTILIZATION
from esrepro.settings.layers import ConfigError

#: What a registry key may be (Snakemake's ``model`` wildcard, workflow/rules/common.smk).
KEY = re.compile(r"^[A-Za-z0-9._-]+$")
#: dtypes a registry entry takes; a config stating another (or none) gets bfloat16.
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_DTYPE = "bfloat16"
#: Files naming a chat template beside the tokenizer (transformers 4.43+ writes the first).
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
#: The folder, relative to the repository, holding each entry's config facts.
CONFIGS = "config/model_configs"

# --- resources (resources_for) -------------------------------------------------------------------------------------
#: Below this many parameters a model runs on CPUs, as the registry's tiny entries do (a test or toy model).
CPU_PARAMS = 100_000_000
CPU_RESOURCES: dict[str, dict[str, Any]] = {"default": {"cpus_per_task": 1, "mem_mb": 4000, "runtime": 60}}
#: Bytes per trained parameter of full fine-tuning: float32 master weights, gradients and AdamW's two moments
#: (esrepro.models.memory), sharded over the job's GPUs.
TRAIN_STATE_BYTES = 16
#: The share of a GPU the sharded training state may take; the rest holds the gathered FSDP units, activations,
#: logits and, for GRPO, the colocated vLLM engine.
STATE_SHARE = 0.25
MIN_TRAIN_GPUS = 4
GPUS_PER_NODE = 8
#: ES jobs: 4 GPUs a node (two half nodes are found sooner than one whole node), one vLLM engine per ``tp`` GPUs.
ES_GPUS_PER_NODE = 4
ES_MIN_ENGINES = 4
#: bf16 weights above this (an eighth of a GPU, ~5B parameters) make an ES iteration long enough for 8 engines.
ES_LARGE_WEIGHTS_SHARE = 1 / 8
WEIGHT_BYTES = 2  # bf16
GPU_MODEL = "h100"  # what esrepro.models.memory.GPU_BYTES is
CPUS_PER_GPU = 8
HOST_BASE_MB, HOST_STEP_MB, DEFAULT_HOST_MIN_MB = 32_000, 16_000, 64_000
MAX_TRAIN_MINUTES, MAX_ES_MINUTES = 10_080, 8_640


@dataclass(frozen=True)
class Source:
    """A model as add-model reads it: its config.json, whether its tokenizer has a chat template, the entry's
    source fields (``hub_id``, ``revision``, ``gated``; or ``path``), its default display name and where it was
    read (``org/name@revision``, or the folder)."""

    config: dict[str, Any]
    chat_template: bool
    fields: dict[str, Any]
    name: str
    origin: str


@dataclass(frozen=True)
class Written:
    """What add-model wrote."""

    key: str
    registry: Path
    config_file: Path
    text: str
    replaced: bool

    def report(self) -> str:
        """The entry and the files, in words."""
        verb = "replaced" if self.replaced else "added"
        return (f"{self.registry}: models.{self.key} {verb}:\n{self.text.rstrip()}\n"
                f"{self.config_file}: its config facts (config.json without {', '.join(sorted(BOOKKEEPING))})")


def _chat_template(tokenizer_config: Mapping[str, Any] | None, files: list[str]) -> bool:
    return bool((tokenizer_config or {}).get("chat_template")) or any(f in files for f in CHAT_TEMPLATE_FILES)


def hub_source(hub_id: str, revision: str, gated: bool = False) -> Source:
    """Read ``hub_id`` at ``revision`` through the hub API (``HF_ENDPOINT``; a token for a gated repository):
    its file list, config.json and tokenizer_config.json."""
    from huggingface_hub import HfApi, hf_hub_download

    where = f"{hub_id}@{revision}"
    try:
        files = HfApi().list_repo_files(hub_id, revision=revision)
        with tempfile.TemporaryDirectory(prefix="esrepro-add-model.") as tmp:
            config = read_config_json(Path(hf_hub_download(hub_id, "config.json", revision=revision,
                                                           local_dir=tmp)).parent, where)
            tokenizer = None
            if "tokenizer_config.json" in files:
                path = hf_hub_download(hub_id, "tokenizer_config.json", revision=revision, local_dir=tmp)
                tokenizer = json.loads(Path(path).read_text(encoding="utf-8"))
    except ArchitectureError:
        raise
    except Exception as exc:  # the hub client raises many types; name the repository
        raise OSError(f"{where}: cannot read its config.json through the hub API: {exc}") from exc
    return Source(config, _chat_template(tokenizer, files), {"hub_id": hub_id, "revision": revision, "gated": gated},
                  hub_id.split("/", 1)[1], where)


def dir_source(folder: str | Path) -> Source:
    """Read the model folder ``folder`` (offline): config.json and tokenizer_config.json; a folder that is not a
    transformers model folder (no config.json, weights or tokenizer) is refused, naming what it lacks."""
    folder = Path(folder).absolute()
    problems = folder_problems(folder, f"--from-dir {folder}")
    if problems:
        raise ConfigError(problems)
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    files = [p.name for p in folder.iterdir()]
    return Source(read_config_json(folder), _chat_template(tokenizer, files), {"path": str(folder)}, folder.name,
                  str(folder))


def config_facts(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config.json without its bookkeeping keys: what the entry states."""
    return {k: v for k, v in config.items() if k not in BOOKKEEPING}


def dtype_of(config: Mapping[str, Any]) -> str:
    """The dtype a config.json states (``torch_dtype``, or transformers 5's ``dtype``), else bfloat16."""
    stated = config.get("torch_dtype") or config.get("dtype")
    return stated if stated in DTYPES else DEFAULT_DTYPE


def size_text(params: int) -> str:
    """A parameter count as the registry writes it: ``7.6B``, ``494.0M``, ``1.0M``."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if params >= scale:
            return f"{params / scale:.1f}{suffix}"
    return str(params)


def _pow2(n: float) -> int:
    """The smallest power of two at least ``n`` (1 for n <= 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


def _round_up(x: float, step: int) -> int:
    return int(math.ceil(x / step) * step)


def _host_mb(params: int, bytes_per_param: int) -> int:
    """Host memory of one process, MB: :data:`HOST_BASE_MB` plus ``bytes_per_param`` a parameter, rounded up to
    :data:`HOST_STEP_MB`."""
    return _round_up(HOST_BASE_MB + bytes_per_param * params / 1e6, HOST_STEP_MB)


def _gpu(gpus: int, mem_mb: int, runtime: int, nodes: int = 1) -> dict[str, Any]:
    return {**({"nodes": nodes} if nodes > 1 else {}), "gpu": gpus, "gpu_model": GPU_MODEL,
            "cpus_per_gpu": CPUS_PER_GPU, "mem_mb": mem_mb, "runtime": runtime}


def resources_for(m) -> dict[str, dict[str, Any]]:
    """Per-rule resources of a model with :class:`~esrepro.models.memory.ModelFacts` ``m`` (P = ``m.params``), from the
    memory model (:data:`esrepro.models.memory.GPU_BYTES`, an H100 80GB, is one GPU):

    - under :data:`CPU_PARAMS` parameters (a toy model): the tiny entries' CPU resources, one thread;
    - ``default`` (evaluation, KL, one process): the fewest GPUs (a power of two) whose share of
      ``gpu_memory_utilization`` (0.85, esrepro.population.placement) holds the bf16 weights; host memory 32 GB + 8
      bytes a parameter (KL holds two models), at least 64 GB; runtime 120 min + 30 min per billion parameters,
      rounded up to the hour;
    - ``train`` (full fine-tuning under FSDP: PPO, GRPO): GPUs such that the sharded training state (16 bytes a
      parameter: float32 master weights, gradients, AdamW's moments) takes at most a quarter of each GPU, the rest
      left to gathered units, activations, logits and GRPO's colocated engine: at least 4, a power of two, at most
      one node of 8 (the RL launchers run on one node; where 8 GPUs are too few, from about 11B parameters, the
      plan check says so: esrepro plan-check). That gives the registry's 4 GPUs to the 0.5-3B models and 8 to the
      7-8B ones;
    - ``train_es`` (one vLLM engine per ``tp`` GPUs, ``tp`` the smallest power of two at which
      :func:`esrepro.models.memory.vllm_fit` fits the engine with one full-context sequence): 4 engines, or 8 where the bf16
      weights exceed an eighth of a GPU (about 5B parameters: the registry's 7-8B entries' 2 nodes x 4), at least 4
      engines of ``tp`` GPUs, 4 GPUs a node;
    - training host memory per node: per GPU (one process each) 32 GB + 2 bytes a parameter (a bf16 copy of the
      weights while it loads them), rounded up to 16 GB (the registry's 7B entries' 384 GB for 8 GPUs);
    - runtimes are per-attempt ceilings (a job asks for its estimate x 1.25 within them, docs/scaling.md):
      ``train`` 1 day x ceil(1 + P/3B), at most 7 days; ``train_es`` 1 day x ceil(P/3.5B), at most 6 days.
    """
    p = int(m.params)
    if p < CPU_PARAMS:
        return {rule: dict(r) for rule, r in CPU_RESOURCES.items()}
    weights = WEIGHT_BYTES * p
    default_gpus = _pow2(weights / (GPU_MEMORY_UTILIZATION * GPU_BYTES))
    default = _gpu(default_gpus, max(DEFAULT_HOST_MIN_MB, _host_mb(p, 8)), _round_up(120 + 30 * p / 1e9, 60))

    train_gpus = min(GPUS_PER_NODE, max(MIN_TRAIN_GPUS, _pow2(TRAIN_STATE_BYTES * p / (STATE_SHARE * GPU_BYTES))))
    train = _gpu(train_gpus, train_gpus * _host_mb(p, WEIGHT_BYTES),
                 min(MAX_TRAIN_MINUTES, 1440 * math.ceil(1 + p / 3e9)))

    tp = next((t for t in (1, 2, 4, 8) if vllm_fit(m, utilization=GPU_MEMORY_UTILIZATION, tp=t).problem() is None),
              8)
    es_gpus = max(8 if weights > ES_LARGE_WEIGHTS_SHARE * GPU_BYTES else 4, ES_MIN_ENGINES * tp)
    es_per_node = min(es_gpus, ES_GPUS_PER_NODE)
    train_es = _gpu(es_per_node, es_per_node * _host_mb(p, WEIGHT_BYTES),
                    min(MAX_ES_MINUTES, 1440 * math.ceil(p / 3.5e9)), math.ceil(es_gpus / ES_GPUS_PER_NODE))
    return {"default": default, "train": train, "train_es": train_es}


# --- the registry as text -------------------------------------------------------------------------------------------
def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


def _flow(mapping: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in mapping.items()) + "}"


def _key_text(key: str) -> str:
    return key if yaml.safe_load(f"{key}: 0") == {key: 0} else json.dumps(key)


def entry_text(key: str, entry: Mapping[str, Any], indent: int = 2) -> str:
    """Registry entry ``key`` as YAML lines at ``indent`` (resources as one flow mapping a rule)."""
    pad, inner = " " * indent, " " * (2 * indent)
    lines = [f"{pad}# written by esrepro add-model (resources: esrepro.models.add.resources_for)",
             f"{pad}{_key_text(key)}:"]
    for field, value in entry.items():
        if field == "resources":
            lines.append(f"{inner}resources:")
            lines += [f"{inner}{' ' * indent}{rule}: {_flow(r)}" for rule, r in value.items()]
        else:
            lines.append(f"{inner}{field}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(line: str) -> bool:
    """A line holding YAML (not blank, not a comment)."""
    return bool(line.strip()) and not line.lstrip().startswith("#")


def _models_block(lines: list[str], where: str) -> tuple[int, int, int]:
    """(the ``models:`` line, the line after its block's last content, the entries' indent) of the registry."""
    start = next((i for i, line in enumerate(lines) if re.match(r"^models:\s*(#.*)?$", line)), None)
    if start is None:
        raise ConfigError(f"{where}: no top-level 'models:' mapping to add the entry to")
    end = next((i for i in range(start + 1, len(lines)) if _content(lines[i]) and _indent(lines[i]) == 0),
               len(lines))
    # blank lines, and the comments at the margin that open the next top-level key, are not the block's
    while end > start + 1 and (not lines[end - 1].strip() or (end < len(lines) and _indent(lines[end - 1]) == 0
                                                             and not _content(lines[end - 1]))):
        end -= 1
    indent = next((_indent(line) for line in lines[start + 1:end] if _content(line)), 2)
    return start, end, indent


def _entry_span(lines: list[str], key: str, start: int, end: int, indent: int) -> tuple[int, int] | None:
    """The lines of entry ``key`` inside the models block (from its key line to its last content line)."""
    pattern = re.compile(rf"^ {{{indent}}}(?:{re.escape(key)}|[\"']{re.escape(key)}[\"'])\s*:")
    first = next((i for i in range(start + 1, end) if pattern.match(lines[i])), None)
    if first is None:
        return None
    last = first + 1
    for i in range(first + 1, end):
        if _content(lines[i]) and _indent(lines[i]) <= indent:
            break
        if _content(lines[i]):
            last = i + 1
    return first, last


def _with_entry(text: str, key: str, entry: Mapping[str, Any], where: str) -> tuple[str, str, bool]:
    """The registry text with entry ``key`` appended to its models block (or replacing the entry of that key), the
    entry's text and whether it replaced one."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    start, end, indent = _models_block(lines, where)
    new = entry_text(key, entry, indent)
    span = _entry_span(lines, key, start, end, indent)
    if span is not None:
        first, last = span
        if first > 0 and lines[first - 1].strip().startswith("# written by esrepro add-model"):
            first -= 1
        out = lines[:first] + [new] + lines[last:]
    else:
        out = lines[:end] + ["\n", new] + lines[end:]
    return "".join(out), new, span is not None


# --- add-model ------------------------------------------------------------------------------------------------------
def build_entry(key: str, source: Source, config_ref: str, display: str | None = None) -> dict[str, Any]:
    """The registry entry of ``source`` as a mapping, its config named by ``config_ref``."""
    problems = config_problems(source.config, f"add-model {key}", f"{source.origin}/config.json")
    if problems:
        raise ConfigError(problems)
    facts = facts_from_config(config_from_facts(source.config, f"model {key!r}"))
    fields = dict(source.fields)
    gated = fields.pop("gated", None)
    entry: dict[str, Any] = {"display": display or source.name, "family": str(source.config["model_type"]),
                             "size": size_text(facts.params), "dtype": dtype_of(source.config), **fields}
    if gated is not None:
        entry["gated"] = bool(gated)
    entry.update({"config": config_ref, "chat_template": source.chat_template, "resources": resources_for(facts)})
    return entry


def add_model(key: str, registry: str | Path = "config/models.yaml", hub_id: str | None = None,
              revision: str | None = None, from_dir: str | Path | None = None, display: str | None = None,
              gated: bool = False, force: bool = False, root: str | Path = ".") -> Written:
    """Write registry entry ``key`` of a hub model (``hub_id`` at ``revision``) or a model folder (``from_dir``) into
    ``registry`` and its config facts into ``config/model_configs/<key>.json`` under ``root`` (the repository, which
    the entry's paths are relative to); refuses an existing ``key`` unless ``force``. The registry is read back and
    the entry checked; on failure both files are restored."""
    if not KEY.match(key):
        raise ConfigError(f"add-model: key {key!r}: use letters, digits, '.', '_' and '-' only (it names folders "
                          "and Snakemake wildcards)")
    if (hub_id is None) == (from_dir is None):
        raise ConfigError("add-model: give exactly one of --hub-id ID --revision REV (a hub model) or --from-dir "
                          "DIR (a model folder)")
    if hub_id is not None and not revision:
        raise ConfigError(f"add-model: --hub-id {hub_id} needs --revision (a commit, or a branch such as main)")
    if from_dir is not None and (revision or gated):
        raise ConfigError("add-model: --revision and --gated apply to a hub model (--hub-id)")
    registry = Path(registry)
    text = registry.read_text(encoding="utf-8") if registry.exists() else "models:\n"
    existing = ((load_yaml(registry) or {}).get("models") or {}) if registry.exists() else {}
    if key in existing and not force:
        raise ConfigError(f"{registry}: models.{key} exists already (--force replaces it)")

    source = hub_source(hub_id, revision, gated) if hub_id is not None else dir_source(from_dir)
    config_file = Path(root) / CONFIGS / f"{key}.json"
    entry = build_entry(key, source, f"{CONFIGS}/{key}.json", display)
    new_text, written, replaced = _with_entry(text, key, entry, str(registry))

    old_config = config_file.read_bytes() if config_file.exists() else None
    old_registry = registry.read_bytes() if registry.exists() else None
    try:
        write_json(config_file, config_facts(source.config))
        write_text(registry, new_text)
        problems = entry_problems(key, load_registry(registry, root=root)[key], str(registry))
        if problems:
            raise ConfigError(problems)
    except BaseException:
        _restore(config_file, old_config)
        _restore(registry, old_registry)
        raise
    return Written(key, registry, config_file, written, replaced)


def _restore(path: Path, data: bytes | None) -> None:
    """Put ``path`` back as it was (``data``: its bytes, None: it did not exist)."""
    if data is None:
        path.unlink(missing_ok=True)
    else:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
