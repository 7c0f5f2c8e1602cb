"""Reading configuration files: YAML with file and line in every error, ``extends:`` chains, the registry, the
published numbers.

The ground floor of the planning rooms (docs/architecture.md): it reads files and validates them against their
settings classes (:mod:`esrepro.settings`) and imports nothing above them. A whole run's validated
:class:`~esrepro.pipeline.Pipeline` is built by :func:`esrepro.planning.load.load_pipeline`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from esrepro.settings.layers import ConfigError, validate_block
from esrepro.settings.registry import ModelEntry, Registry

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "workflow" / "schemas"

__all__ = ["ConfigError", "config_base", "load_registry", "load_yaml", "read_config", "validate_published"]


class _DuplicateKey(yaml.MarkedYAMLError):
    """A mapping names the same key twice (PyYAML would silently keep the last)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a merge key's ``<<: *anchor`` entries may be overridden)."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # merged in by construct_mapping; the mapping's own keys override them
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise _DuplicateKey(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file; a missing file, a syntax error or a duplicate key is one line naming file and line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def _config_file(registry: Path, name: str, root: str | Path | None) -> Path:
    """The file an entry's ``config`` names, relative to the repository: ``root`` where given and it holds the file,
    else the nearest folder at or above the registry's that holds it (the repository a registry file lives in)."""
    if root is not None and (Path(root) / name).is_file():
        return Path(root) / name
    for folder in (registry.absolute().parent, *registry.absolute().parents):
        if (folder / name).is_file():
            return folder / name
    return Path(root if root is not None else registry.parent) / name


def load_registry(path: str | Path, shown: str | None = None, root: str | Path | None = None) -> dict[str, ModelEntry]:
    """Load and validate the model registry; returns ``{model_key: entry}`` (errors name ``shown`` or ``path``).

    An entry whose ``config`` names a file (relative to the repository: ``root``, else the folder at or above the
    registry's that holds it) gets that file's mapping."""
    shown = shown or str(path)
    data = load_yaml(path)
    problems = []
    for key, entry in ((data or {}).get("models") or {}).items() if isinstance(data, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("config"), str):
            file = _config_file(Path(path), entry["config"], root)
            try:
                entry["config"] = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                problems.append(f"{shown}: models.{key}.config: cannot read {file} ({exc})")
            else:
                if not isinstance(entry["config"], dict):
                    problems.append(f"{shown}: models.{key}.config: {file} holds no JSON object")
    if problems:
        raise ConfigError(problems)
    return validate_block(Registry, data, shown).models


def validate_published(path: str | Path, shown: str | None = None) -> dict:
    """Load the papers' published numbers and check them against their JSON schema."""
    import jsonschema

    data = load_yaml(path)
    schema = load_yaml(SCHEMA_DIR / "published.schema.yaml")
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(map(str, e.path)))
    if errors:
        raise ConfigError([f"{shown or path}: {'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
                           for e in errors])
    return data


def config_base(config: dict, source: str | Path, root: str | Path = ".") -> dict:
    """``config`` read over the options of the file its ``extends:`` names (relative to ``root``), if it still names
    one (a config read by :func:`read_config` has none left); else ``config`` itself."""
    if not (isinstance(config, dict) and isinstance(config.get(EXTENDS), str)):
        return config
    own = copy.deepcopy({k: v for k, v in config.items() if k != EXTENDS})
    base = read_config(_base_file(str(source), config[EXTENDS], root), root)
    return _deep_update({k: v for k, v in base.items() if k not in NOT_INHERITED}, own)


def _deep_update(base: dict, new: dict) -> dict:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = value
    return base


EXTENDS = "extends"
#: Options a file's own: not inherited through ``extends`` (two configs would otherwise share one workspace).
NOT_INHERITED = ("workspace",)


def _base_file(name: str, base: str, root: str | Path) -> Path:
    """The file ``name``'s ``extends: base`` names (relative to ``root``, the working directory)."""
    file = Path(base) if Path(base).is_absolute() else Path(root) / base
    if not file.is_file():
        raise ConfigError(f"{name}: {EXTENDS}: no such config file {base!r} (paths are relative to the "
                          "working directory)")
    return file


def _chain(path: str | Path, root: str | Path) -> list[tuple[str, dict]]:
    """(name as written, options without ``extends``) of ``path`` and every file its ``extends:`` names, the base
    first; each file is read once."""
    chain: list[tuple[str, dict]] = []
    name, file = str(path), Path(path)
    while True:
        if name in [n for n, _ in chain]:
            raise ConfigError(f"{chain[-1][0]}: {EXTENDS}: {name} extends itself ("
                              + " -> ".join([*(n for n, _ in chain), name]) + ")")
        data = load_yaml(file)
        if not isinstance(data, dict):
            raise ConfigError(f"{name}: expected a mapping of options at the top level")
        base = data.pop(EXTENDS, None)
        chain.append((name, data))
        if base is None:
            return chain[::-1]
        if not isinstance(base, str):
            raise ConfigError(f"{name}: {EXTENDS}: expected the path of a config file, got {base!r}")
        name, file = base, _base_file(name, base, root)


def read_config(path: str | Path, root: str | Path = ".") -> dict:
    """A config file's options: those of the file its ``extends:`` names (recursively, relative to ``root``, the
    working directory), updated by its own (mappings merge key by key, anything else replaces; ``key: null`` sets
    null); :data:`NOT_INHERITED` options come from ``path`` alone."""
    merged: dict = {}
    chain = _chain(path, root)
    for i, (_, data) in enumerate(chain):
        own = data if i == len(chain) - 1 else {k: v for k, v in data.items() if k not in NOT_INHERITED}
        _deep_update(merged, own)
    return merged


def workflow_config(configfiles: list, overrides: dict, default: str = "config/config.yaml") -> tuple[dict, str]:
    """A run's raw config and its source name, as the Snakefile uses them.

    ``--configfile`` files replace the default config (they are not merged into it, so no
    tiny setting leaks into a paper run; a file may say ``extends: other.yaml`` to build on
    one); each is read strictly (duplicate keys and syntax errors name file and line);
    ``--config key=value`` overrides go on top.
    """
    files = [str(f) for f in configfiles] or [default]
    merged: dict = {}
    for path in files:
        _deep_update(merged, read_config(path))
    return _deep_update(merged, {k: v for k, v in dict(overrides).items()}), " + ".join(files)


def config_files(configfiles: list, default: str = "config/config.yaml") -> list[str]:
    """Every file a run's config is read from (the ``--configfile`` files and what they extend), for provenance."""
    return list(dict.fromkeys(name for path in ([str(f) for f in configfiles] or [default])
                              for name, _ in _chain(path, ".")))
