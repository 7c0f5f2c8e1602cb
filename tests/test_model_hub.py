"""Hub models against a local hub mirror over HTTP (esrepro.rehearsal.hub_mirror): the fetch checks the downloaded
config.json against the registry entry's config, field by field, and writes nothing when they differ;
``esrepro add-model --hub-id`` writes an entry from the repository's config.json at a revision, which then fetches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from esrepro.models.architecture import BOOKKEEPING
from model_folders import causal_dir, esrepro, hub_env, serve_folder

REPO_ID = "test-org/tiny-chat"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A mirror serving one causal LM whose tokenizer has a chat template."""
    tmp = tmp_path_factory.mktemp("hub")
    folder = causal_dir(tmp / "model")
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    server = serve_folder(tmp / "mirror", REPO_ID, folder)
    yield {"folder": folder, "config": json.loads((folder / "config.json").read_text()),
           "env": hub_env(server.url, tmp / "hf_home"), "tmp": tmp}
    server.shutdown()
    server.server_close()


def _fetch(hub: dict, work: Path, config: dict) -> tuple:
    spec = {"display": "tiny", "dtype": "float32", "hub_id": REPO_ID, "revision": "main", "config": config}
    proc = esrepro(["fetch-model", "--model", "tiny-chat", "--spec", json.dumps(spec), "--out", "base"], work,
                   hub["env"])
    return proc, work / "base"


def test_a_download_whose_config_agrees_with_the_entry_is_fetched(hub, tmp_path):
    stated = {k: v for k, v in hub["config"].items() if k not in BOOKKEEPING}
    proc, out = _fetch(hub, tmp_path, stated)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resolved"]["hub_id"] == REPO_ID and "model.safetensors" in manifest["resolved"]["files"]
    assert json.loads((out / "config.json").read_text()) == hub["config"]


def test_a_download_whose_config_differs_stops_naming_the_entry_and_each_field(hub, tmp_path):
    stated = {**hub["config"], "hidden_size": 64, "rope_theta": 1e6, "torch_dtype": "bfloat16"}
    proc, out = _fetch(hub, tmp_path, stated)
    assert proc.returncode != 0
    message = proc.stderr
    assert f"model 'tiny-chat': the config.json of {REPO_ID}@" in message and "models.tiny-chat.config" in message
    assert "hidden_size: stated 64, the model's config.json has 32" in message
    assert "rope_theta: stated 1000000.0, the model's config.json has no rope_theta" in message
    assert "torch_dtype" not in message  # bookkeeping: never compared
    assert not out.exists() and not list(tmp_path.glob(".base*"))  # nothing written, no temporary left


@pytest.mark.slow
def test_add_model_from_the_hub_writes_an_entry_that_fetches(hub, tmp_path):
    (tmp_path / "config").mkdir()
    registry = tmp_path / "config" / "models.yaml"
    head = "# my registry: this comment stays\nmodels:\n  # the first entry\n"
    registry.write_text(head)
    args = ["add-model", "tiny-chat", "--hub-id", REPO_ID, "--revision", "main", "--registry", "config/models.yaml"]
    proc = esrepro(args, tmp_path, hub["env"])
    assert proc.returncode == 0, proc.stderr
    assert "config/models.yaml: models.tiny-chat added" in proc.stdout
    assert registry.read_text().startswith(head)
    entry = yaml.safe_load(registry.read_text())["models"]["tiny-chat"]
    assert {k: entry[k] for k in ("display", "family", "dtype", "hub_id", "revision", "gated", "chat_template")} == \
        {"display": "tiny-chat", "family": "qwen2", "dtype": "float32", "hub_id": REPO_ID, "revision": "main",
         "gated": False, "chat_template": True}
    assert entry["size"] == "28.4K" and entry["config"] == "config/model_configs/tiny-chat.json"
    facts = json.loads((tmp_path / entry["config"]).read_text())
    assert facts == {k: v for k, v in hub["config"].items() if k not in BOOKKEEPING}
    assert "torch_dtype" not in facts and "transformers_version" not in facts

    from esrepro.config import load_registry

    written = load_registry(registry, root=tmp_path)["tiny-chat"]
    proc, out = _fetch(hub, tmp_path, written.config)  # the entry's config is what the download holds
    assert proc.returncode == 0, proc.stderr

    again = esrepro(args, tmp_path, hub["env"])  # the key exists: refused, the registry as it was
    assert again.returncode != 0 and "models.tiny-chat exists already (--force replaces it)" in again.stderr
    before = registry.read_text()
    missing = esrepro(["add-model", "other", "--hub-id", "test-org/nonesuch", "--revision", "main",
                       "--registry", "config/models.yaml"], tmp_path, hub["env"])
    assert missing.returncode != 0 and "test-org/nonesuch@main: cannot read its config.json" in missing.stderr
    assert registry.read_text() == before and not (tmp_path / "config/model_configs/other.json").exists()
