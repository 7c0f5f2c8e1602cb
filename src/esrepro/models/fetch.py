"""Downloading a hub model at a revision; a branch name is resolved to its commit and recorded.

Only what the pipeline loads is fetched (:data:`MODEL_FILES`): a hub repository often carries the same weights
in other formats too (Meta's ``original/*.pth``, ~16 GB for an 8B model), which would cost the download and
every later hash of the model folder.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from esrepro.io import atomic_path
from esrepro.models.architecture import config_differences, read_config_json

COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class FilePatterns:
    """``snapshot_download``'s allow and ignore patterns (fnmatch; ``*`` also matches ``/``)."""

    allow: tuple[str, ...]
    ignore: tuple[str, ...]


#: The files of a hub model the pipeline fetches, at the repository's top level: the model and generation configs
#: and every other ``*.json`` (weight index, tokenizer config, special tokens, chat template), safetensors weights,
#: tokenizer files (BPE vocabulary and merges, a SentencePiece or tiktoken model), ``*.jinja`` chat templates and
#: the licence. Never: subfolders (``original/`` with Meta's consolidated ``*.pth``, ``onnx/``, ``gguf/``), PyTorch
#: ``*.bin`` weights (fetched only from a repository without safetensors, :func:`file_patterns`), GGUF, ONNX,
#: TensorFlow or Flax weights.
MODEL_FILES = FilePatterns(
    allow=("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja",
           "LICENSE*"),
    ignore=("*/*", "*.pth", "*.pt", "*.bin", "*.gguf", "*.onnx", "*.onnx_data", "*.h5", "*.msgpack", "*.ot"),
)
#: PyTorch weights: fetched instead of safetensors only where a repository has no ``*.safetensors``.
BIN_WEIGHTS = "*.bin"


def file_patterns(repo_files: Iterable[str]) -> FilePatterns:
    """:data:`MODEL_FILES` for a repository holding ``repo_files``: with ``*.bin`` weights allowed when it has no
    top-level safetensors."""
    if any(f.endswith(".safetensors") and "/" not in f for f in repo_files):
        return MODEL_FILES
    return FilePatterns(allow=(*MODEL_FILES.allow, BIN_WEIGHTS),
                        ignore=tuple(p for p in MODEL_FILES.ignore if p != BIN_WEIGHTS))


def select_files(repo_files: Iterable[str]) -> list[str]:
    """The files of ``repo_files`` a fetch downloads (the hub client's own filter, as ``snapshot_download`` applies
    it)."""
    from huggingface_hub.utils import filter_repo_objects

    files = list(repo_files)
    patterns = file_patterns(files)
    return sorted(filter_repo_objects(files, allow_patterns=list(patterns.allow),
                                      ignore_patterns=list(patterns.ignore)))


class ConfigMismatch(ValueError):
    """A downloaded config.json that differs from the registry entry's ``config``."""


def check_config(model: str, hub_id: str, commit: str, stated: Mapping[str, Any], folder: str | Path) -> None:
    """Raise :class:`ConfigMismatch` naming the entry and each field where ``folder``'s config.json (the download of
    ``hub_id`` at ``commit``) differs from the entry's ``config`` (:func:`esrepro.models.architecture.
    config_differences`)."""
    differences = config_differences(stated, read_config_json(folder, f"model {model!r}"))
    if differences:
        raise ConfigMismatch(
            f"model {model!r}: the config.json of {hub_id}@{commit} differs from the registry entry's config "
            f"(models.{model}.config): " + "; ".join(differences) + ". Nothing was written: correct the entry's "
            f"config (esrepro add-model {model} --hub-id {hub_id} --revision {commit} --force writes it from the "
            "hub), or pin the revision whose config it states")


def fetch_hub_model(model: str, hub_id: str, revision: str, out: str | Path,
                    config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Download what a model needs of ``hub_id`` at ``revision`` (:data:`MODEL_FILES`) into ``out`` atomically.

    A revision that is not a 40-hex commit (e.g. ``main``) is resolved first and a warning says the model is not
    pinned. With ``config`` (the registry entry's), the downloaded config.json must agree with it field by field
    (:func:`check_config`), else nothing is written. Returns the record for the model's manifest: the commit
    actually downloaded, the patterns and the files fetched.
    """
    from huggingface_hub import HfApi, snapshot_download

    commit = revision
    with atomic_path(out, is_dir=True) as tmp:
        try:
            api = HfApi()
            if not COMMIT.match(revision):
                commit = api.model_info(hub_id, revision=revision).sha
                print(f"WARNING: model {model!r}: {hub_id}@{revision} is not a pinned commit; resolved to {commit} "
                      f"(put revision: {commit} in the registry to pin it)", file=sys.stderr, flush=True)
            repo_files = api.list_repo_files(hub_id, revision=commit)
            patterns = file_patterns(repo_files)
            snapshot_download(hub_id, revision=commit, local_dir=tmp, allow_patterns=list(patterns.allow),
                              ignore_patterns=list(patterns.ignore))
            # the hub client's own bookkeeping (file metadata, locks): not part of the model, nor of its hashes
            shutil.rmtree(Path(tmp) / ".cache", ignore_errors=True)
        except Exception as exc:  # the hub client raises many types; name the model
            raise OSError(f"model {model!r}: could not fetch {hub_id}@{revision}: {exc}") from exc
        if config is not None:
            check_config(model, hub_id, commit, config, tmp)
    return {"hub_id": hub_id, "revision": revision, "commit": commit, "allow_patterns": list(patterns.allow),
            "ignore_patterns": list(patterns.ignore), "files": select_files(repo_files)}
