"""Config and registry validation: errors name the file and the field."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from esrepro.config import ConfigError, check_config, load_registry, load_yaml, method_settings, rule_resources
from conftest import REPO


@pytest.fixture()
def cfg():
    return load_yaml(REPO / "config" / "config.yaml")


def test_shipped_configs_validate():
    for name in ("config.yaml", "paper.yaml"):
        registry = check_config(load_yaml(REPO / "config" / name), name, root=REPO)
        assert "tiny" in registry
    paper = load_yaml(REPO / "config" / "paper.yaml")
    assert len(paper["models"]) == 7
    es = paper["train"]["countdown"]["es"]
    assert (es["population"], es["sigma"], es["alpha"], es["iterations"], es["max_new_tokens"]) == (30, 0.001, 0.0005, 500, 1024)


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("train", "countdown", "es", "sigma"), -1.0, "train.countdown.es.sigma"),
        (("train", "countdown", "es", "noise"), "gaussian", "train.countdown.es.noise"),
        (("train", "countdown", "es", "populaton"), 3, "train.countdown.es"),
        (("data", "countdown", "source", "kind"), "ftp", "data.countdown.source.kind"),
        (("seeds",), "zero", "seeds"),
        (("threads",), 0, "threads"),
    ],
)
def test_config_error_names_file_and_field(cfg, path, value, field):
    bad = copy.deepcopy(cfg)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError) as err:
        check_config(bad, "config/config.yaml", root=REPO)
    assert f"config/config.yaml: {field}" in str(err.value)


def test_unknown_model_and_missing_dataset_are_named(cfg):
    bad = copy.deepcopy(cfg)
    bad["models"] = ["tiny", "gpt-7"]
    with pytest.raises(ConfigError, match=r"models\.1: 'gpt-7' is not in the registry"):
        check_config(bad, "config/config.yaml", root=REPO)
    bad = copy.deepcopy(cfg)
    del bad["data"]["countdown"]
    with pytest.raises(ConfigError, match=r"train\.countdown: no data\.countdown entry"):
        check_config(bad, "config/config.yaml", root=REPO)


def test_registry_error_names_model_and_field(tmp_path):
    reg = load_yaml(REPO / "config" / "models.yaml")
    reg["models"]["qwen2.5-0.5b-instruct"]["dtype"] = "float8"
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(reg))
    with pytest.raises(ConfigError, match=r"models\.yaml: models\.qwen2\.5-0\.5b-instruct\.dtype: 'float8'"):
        load_registry(path)


def test_published_numbers_are_validated(cfg, tmp_path):
    pub = load_yaml(REPO / "config" / "published.yaml")
    pub["tables"]["table1_countdown"]["models"]["qwen2.5-3b-instruct"]["es"] = "sixty"
    (tmp_path / "published.yaml").write_text(yaml.safe_dump(pub))
    bad = copy.deepcopy(cfg)
    bad["published"] = str(tmp_path / "published.yaml")
    bad["registry"] = str(REPO / "config" / "models.yaml")
    with pytest.raises(ConfigError, match=r"published\.yaml: tables\.table1_countdown\.models\.qwen2\.5-3b-instruct\.es"):
        check_config(bad, "config/config.yaml", root=REPO)


def test_registry_overrides_and_resources():
    cfg = load_yaml(REPO / "config" / "paper.yaml")
    reg = load_registry(REPO / "config" / "models.yaml")
    reg["qwen2.5-7b-instruct"]["methods"] = {"es": {"sigma": 0.002}}
    s = method_settings(cfg, reg, "qwen2.5-7b-instruct", "countdown", "es")
    assert s["sigma"] == 0.002 and s["population"] == 30
    assert rule_resources(reg["qwen2.5-7b-instruct"], "train")["gpu"] == 8
    assert rule_resources(reg["qwen2.5-7b-instruct"], "evaluate")["gpu"] == 1


def test_snakemake_refuses_a_bad_config_before_any_job(tmp_path):
    bad = load_yaml(REPO / "config" / "config.yaml")
    bad["train"]["countdown"]["es"]["restore"] = "approximately"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "train.countdown.es.restore" in proc.stdout + proc.stderr
    assert str(path) in proc.stdout + proc.stderr
