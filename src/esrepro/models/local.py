"""A transformers model folder on disk as a registry model (an entry's ``path``).

The base model folder every later job reads (``results/models/<model>/base``) is made of symbolic links, one per
file the pipeline loads from the folder (:func:`model_files`: what a hub fetch would take of the same repository,
:data:`esrepro.models.fetch.MODEL_FILES`), each to the file in the folder, so gigabytes of weights are neither
copied nor stored twice. Every loader (transformers, the tokenizer, vLLM, safetensors) opens the links as the
files; a directory's hash follows them (:func:`esrepro.provenance.manifest.sha256_tree`), so the base folder's
hash is the folder's content. The manifest records each file's sha256 (``resolved.files``, where a hub model's
records its commit), and every job that reads the model hashes it again before it starts
(:func:`esrepro.provenance.manifest.input_record`): a file changed since stops the job, naming the entry and the
file. Removing the base folder (Snakemake does before it reruns the job) removes the links, never the folder's
files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from esrepro.models.fetch import file_patterns, select_files
from esrepro.provenance.manifest import file_digests, tree_digest

#: A tokenizer the pipeline can load (esrepro.models.loading.load_tokenizer reads it first).
TOKENIZER_CONFIG = "tokenizer_config.json"


def folder_listing(folder: str | Path) -> list[str]:
    """Every file under ``folder`` (relative, POSIX), hidden folders' (``.git``, ``.cache``) left out."""
    folder = Path(folder)
    out = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts[:-1]):
            out.append(rel.as_posix())
    return sorted(out)


def model_files(folder: str | Path) -> list[str]:
    """The files of ``folder`` the pipeline loads: those a hub fetch takes of a repository holding the same files
    (top-level configs, safetensors, or ``*.bin`` weights where there are none, tokenizer files, chat templates;
    :func:`esrepro.models.fetch.select_files`)."""
    return select_files(folder_listing(folder))


def weight_files(files: list[str]) -> list[str]:
    """The weight files among ``files`` (safetensors, or PyTorch ``*.bin``)."""
    return [f for f in files if f.endswith((".safetensors", ".bin"))]


def link_folder(model: str, folder: str | Path, into: str | Path) -> dict[str, Any]:
    """Fill the empty folder ``into`` with symbolic links to the model files of ``folder`` (:func:`model_files`);
    returns the record for the model's manifest: the folder (absolute), the patterns, every file's sha256 and the
    folder's sha256 (what ``into`` hashes to). Call it inside :func:`esrepro.io.atomic_path`."""
    source = Path(folder).absolute()
    if not source.is_dir():
        raise FileNotFoundError(f"model {model!r}: {folder} is not a folder")
    listing = folder_listing(source)
    files = select_files(listing)
    if not weight_files(files):
        raise ValueError(f"model {model!r}: {source} holds no weights (*.safetensors, or *.bin) at its top level")
    patterns = file_patterns(listing)
    into = Path(into)
    for rel in files:
        os.symlink(source / rel, into / rel)
    digests = file_digests(into)  # through the links: the bytes every job reads
    missing = sorted(set(files) - set(digests))
    if missing:
        raise FileNotFoundError(f"model {model!r}: cannot read {', '.join(str(source / m) for m in missing)}")
    return {"path": str(source), "allow_patterns": list(patterns.allow), "ignore_patterns": list(patterns.ignore),
            "files": digests, "sha256": tree_digest(digests)}
