"""Helpers of the tests of models from the hub and from disk: model folders (a causal LM, an encoder), a minimal
run config over a registry of such entries, the esrepro command, and a local hub mirror serving a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from conftest import REPO, make_model_dir

#: A run small enough for seconds: Countdown's generated data, ES for 2 iterations, a 10-problem evaluation.
SMALL_RUN: dict[str, Any] = {
    "scale": "tiny",
    "seeds": [0],
    "data": {"countdown": {"source": {"kind": "generated", "n_train": 16, "n_test": 20}}},
    "defaults": {"es": {"iterations": 2, "population": 4, "train_examples": 4, "sigma": 0.05, "alpha": 0.05,
                        "max_new_tokens": 16, "batch_size": 4}},
    "train": {"countdown": {"methods": ["es"]}},
    "evaluate": {"countdown": {"limit": 10, "max_new_tokens": 16, "batch_size": 10}},
}
#: CPU resources of a toy model (the registry's tiny entries').
CPU = {"default": {"cpus_per_task": 1, "mem_mb": 4000, "runtime": 60}}


def causal_dir(path: Path) -> Path:
    """A random-init Qwen2 LM and its tokenizer (tests/conftest.py)."""
    return make_model_dir(path)


def bert_dir(path: Path) -> Path:
    """A tiny BERT masked LM with a tokenizer: a transformers model folder, but an encoder."""
    from transformers import BertConfig, BertForMaskedLM

    from esrepro.models.tiny import train_tokenizer

    tok = train_tokenizer([f"{a} plus {b}" for a in range(50) for b in range(20)], vocab_size=300)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_registry(path: Path, entries: dict[str, dict]) -> Path:
    """A registry holding ``entries`` (each with the CPU resources unless it states its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    models = {k: {"display": k, "dtype": "float32", "resources": CPU, **v} for k, v in entries.items()}
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path


def run_config(registry: Path | str, model: str) -> dict:
    """:data:`SMALL_RUN` of ``model`` in ``registry``, with the repository's published numbers."""
    return {**json.loads(json.dumps(SMALL_RUN)), "registry": str(registry), "models": [model],
            "published": str(REPO / "config" / "published.yaml")}


def esrepro(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``esrepro ARGS`` in a fresh interpreter (this checkout's code) in ``cwd``."""
    base = {**os.environ, **(env or {})}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "esrepro.cli", *args], cwd=cwd, env=base, capture_output=True,
                          text=True, timeout=timeout)


def hub_env(url: str, home: Path) -> dict[str, str]:
    """The environment of a process whose huggingface_hub talks to the mirror at ``url`` (and nothing else)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_ENDPOINT": url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"})
    return env


def serve_folder(root: Path, repo_id: str, folder: Path):
    """A hub mirror under ``root`` holding ``folder`` as model repository ``repo_id`` (one commit), served on a
    local port: the started :class:`~esrepro.rehearsal.hub_mirror.MirrorServer` (``shutdown()`` it)."""
    import shutil

    from esrepro.rehearsal.hub_mirror import MirrorServer
    from esrepro.rehearsal.mirror_layout import repo_dir, repo_key, repo_record, write_index

    shutil.copytree(folder, repo_dir(root, "model", repo_id))
    write_index(root, {"repos": {repo_key("model", repo_id): repo_record(root, "model", repo_id, None,
                                                                         origin="copy")}, "urls": {}})
    server = MirrorServer(root, log_file=open(root / "requests.log", "w"))
    server.start()
    return server
