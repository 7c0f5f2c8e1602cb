"""``esrepro add-model --from-dir``: a model folder becomes a ``path`` entry of the registry, appended as text (the
registry's comments and anchors stay), its config facts beside it and its resources from the memory model; what
would not load is refused with both files as they were. The hub side is tests/test_model_hub.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from esrepro.config import ConfigError, load_registry
from esrepro.models.add import add_model, resources_for, size_text
from esrepro.models.memory import entry_facts
from model_folders import CPU, bert_dir, causal_dir, esrepro


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return causal_dir(tmp_path_factory.mktemp("add") / "my-model")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A working directory holding a copy of the repository's registry and its config files."""
    shutil.copytree(REPO / "config" / "model_configs", tmp_path / "config" / "model_configs")
    shutil.copy(REPO / "config" / "models.yaml", tmp_path / "config" / "models.yaml")
    return tmp_path


def test_a_folder_becomes_a_path_entry_appended_to_the_registry(folder, repo):
    original = (repo / "config/models.yaml").read_text()
    proc = esrepro(["add-model", "mine", "--from-dir", str(folder), "--display", "My model"], repo)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("config/models.yaml: models.mine added:\n")
    text = (repo / "config/models.yaml").read_text()
    assert text.startswith(original)  # every comment, anchor and entry as it was
    entry = yaml.safe_load(text)["models"]["mine"]
    assert entry == {"display": "My model", "family": "qwen2", "size": "28.4K", "dtype": "float32",
                     "path": str(folder), "config": "config/model_configs/mine.json", "chat_template": False,
                     "resources": CPU}
    facts = json.loads((repo / entry["config"]).read_text())
    assert facts["hidden_size"] == 32 and "transformers_version" not in facts and "dtype" not in facts
    registry = load_registry(repo / "config/models.yaml", root=repo)
    assert registry["mine"].path == str(folder) and registry["qwen2.5-7b-instruct"].config["hidden_size"] == 3584


def test_force_replaces_the_entry_and_nothing_else(folder, repo):
    add_model("mine", repo / "config/models.yaml", from_dir=folder, root=repo)
    once = (repo / "config/models.yaml").read_text()
    with pytest.raises(ConfigError, match=r"models\.mine exists already \(--force replaces it\)"):
        add_model("mine", repo / "config/models.yaml", from_dir=folder, root=repo)
    written = add_model("mine", repo / "config/models.yaml", from_dir=folder, display="Renamed", force=True, root=repo)
    assert written.replaced
    assert (repo / "config/models.yaml").read_text() == once.replace("display: my-model", "display: Renamed")
    # an entry of the repository's, replaced in the middle of the registry: the entries around it stay
    written = add_model("qwen2.5-32b", repo / "config/models.yaml", from_dir=folder, force=True, root=repo)
    entries = load_registry(repo / "config/models.yaml", root=repo)
    assert entries["qwen2.5-32b"].path == str(folder) and entries["llama-3.1-8b"].hub_id == "meta-llama/Llama-3.1-8B"
    assert list(entries)[-2:] == ["qwen2.5-32b", "mine"]


def test_what_would_not_load_is_refused_and_both_files_stay_as_they_were(folder, repo, tmp_path):
    registry = repo / "config/models.yaml"
    before = registry.read_text()
    bert = bert_dir(tmp_path / "bert")
    with pytest.raises(ConfigError) as err:
        add_model("enc", registry, from_dir=bert, root=repo)
    assert f"add-model enc: {bert / 'config.json'}: model_type: model_type 'bert' is an encoder" in str(err.value)
    with pytest.raises(ConfigError, match=r"--from-dir .*nowhere: .*nowhere is not a folder"):
        add_model("gone", registry, from_dir=tmp_path / "nowhere", root=repo)
    with pytest.raises(ConfigError, match=r"key 'a/b': use letters"):
        add_model("a/b", registry, from_dir=folder, root=repo)
    with pytest.raises(ConfigError, match=r"exactly one of --hub-id"):
        add_model("x", registry, root=repo)
    with pytest.raises(ConfigError, match=r"--hub-id Org/x needs --revision"):
        add_model("x", registry, hub_id="Org/x", root=repo)
    # a registry that no longer validates with the entry (an alias the replaced entry defined): restored
    with pytest.raises(ConfigError):
        add_model("qwen2.5-7b-instruct", registry, from_dir=folder, force=True, root=repo)
    assert registry.read_text() == before
    assert not (repo / "config/model_configs/enc.json").exists()
    assert (repo / "config/model_configs/qwen2.5-7b-instruct.json").read_text() == \
        (REPO / "config/model_configs/qwen2.5-7b-instruct.json").read_text()


def test_resources_follow_the_memory_model_as_the_registrys_entries_do():
    registry = load_registry(REPO / "config" / "models.yaml", root=REPO)

    def rule(key: str, name: str) -> dict:
        return resources_for(entry_facts(registry[key], key))[name]

    for key in ("qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-3b-instruct", "llama-3.2-1b-instruct",
                "llama-3.2-3b-instruct"):
        assert (rule(key, "train")["gpu"], rule(key, "train_es")["gpu"]) == (4, 4), key
        assert "nodes" not in rule(key, "train_es")
    for key in ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "qwen2.5-math-7b"):
        assert rule(key, "train")["gpu"] == 8, key
        assert (rule(key, "train_es")["nodes"], rule(key, "train_es")["gpu"]) == (2, 4), key
        assert rule(key, "default")["gpu"] == 1
    assert rule("qwen2.5-7b-instruct", "train")["mem_mb"] == 384_000  # the registry's: 8 x (32 GB + 2 bytes x 7.6B)
    # a 32B model: one engine per 2 GPUs (its bf16 weights and a full-context sequence leave no room on one), 4 engines
    assert (rule("qwen2.5-32b", "train_es")["nodes"], rule("qwen2.5-32b", "train_es")["gpu"]) == (2, 4)
    assert rule("qwen2.5-32b", "train")["gpu"] == 8 and rule("qwen2.5-32b", "train")["runtime"] == 10_080
    for key in registry:
        for res in resources_for(entry_facts(registry[key], key)).values():
            assert res.get("runtime", 0) <= 10_080 and res["mem_mb"] % 1000 == 0
    assert resources_for(entry_facts(registry["tiny"], "tiny")) == CPU  # a toy model: the tiny entries' CPUs


def test_size_text():
    assert [size_text(n) for n in (7_615_616_512, 494_032_768, 995_968, 28_416, 12)] == \
        ["7.6B", "494.0M", "996.0K", "28.4K", "12"]
