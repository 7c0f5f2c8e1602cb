"""Config and registry validation: every malformed input is refused before any job, naming file and field."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

from conftest import REPO
from esrepro.config import ConfigError, load_registry, load_yaml, read_config
from esrepro.planning.load import check_config, load_pipeline


@pytest.fixture()
def cfg():
    return load_yaml(REPO / "config" / "config.yaml")


def with_model_configs(folder: Path) -> Path:
    """``folder`` holding a copy of config/model_configs (as ``config/model_configs``), the config.json files the
    registry's hub entries name relative to the repository: a copy of config/models.yaml written in ``folder`` finds
    them (esrepro.config.load_registry looks in the registry's folder and those above it)."""
    shutil.copytree(REPO / "config" / "model_configs", folder / "config" / "model_configs", dirs_exist_ok=True)
    return folder


def test_shipped_configs_validate():
    for name in ("config.yaml", "paper.yaml"):
        registry = check_config(load_yaml(REPO / "config" / name), name, root=REPO)
        assert "tiny" in registry
    paper = load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "paper.yaml", root=REPO)
    assert len(paper.models) == 7
    es = paper.method_settings("qwen2.5-7b-instruct", "countdown", "es")
    assert (es.population, es.sigma, es.alpha, es.iterations, es.max_new_tokens) == (30, 0.001, 0.0005, 500, 1024)


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("defaults", "es", "sigma"), -1.0, "defaults.es.sigma"),
        (("defaults", "es", "noise"), "gaussian", "defaults.es.noise"),
        (("defaults", "es", "populaton"), 3, "defaults.es.populaton"),
        (("data", "countdown", "source", "kind"), "ftp", "data.countdown.source.kind"),
        (("seeds",), "zero", "seeds"),
        (("models",), [], "models"),
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
    bad = read_config(REPO / "config" / "config.yaml", REPO)  # with what it extends (the shared generator)
    del bad["data"]["countdown"]
    with pytest.raises(ConfigError, match=r"train\.countdown: no data\.countdown entry"):
        check_config(bad, "config/config.yaml", root=REPO)


def test_registry_error_names_model_and_field(tmp_path):
    reg = load_yaml(REPO / "config" / "models.yaml")
    reg["models"]["qwen2.5-0.5b-instruct"]["dtype"] = "float8"
    path = with_model_configs(tmp_path) / "models.yaml"
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


def test_registry_overrides_and_resources(tmp_path):
    reg = load_yaml(REPO / "config" / "models.yaml")
    reg["models"]["qwen2.5-7b-instruct"]["methods"] = {"es": {"sigma": 0.002}}
    (tmp_path / "config").mkdir()
    with_model_configs(tmp_path / "config")
    (tmp_path / "config" / "models.yaml").write_text(yaml.safe_dump(reg))
    (tmp_path / "config" / "published.yaml").write_text((REPO / "config" / "published.yaml").read_text())
    p = load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=tmp_path)
    s = p.method_settings("qwen2.5-7b-instruct", "countdown", "es")
    assert s.sigma == 0.002 and s.population == 30
    assert p.resources("qwen2.5-7b-instruct", "train").gpu == 8
    assert p.resources("qwen2.5-7b-instruct", "evaluate").gpu == 1
    assert p.resources("qwen2.5-7b-instruct", "fetch").gpu == 0
    # steps that only read logs or compare checkpoints hold no GPU; the histogram keeps the entry's memory
    for rule in ("select", "param_shift"):
        res = p.resources("qwen2.5-7b-instruct", rule)
        assert (res.gpu, res.gpu_model, res.nodes) == (0, None, 1), rule
    assert p.resources("qwen2.5-7b-instruct", "param_shift").mem_mb == p.resources("qwen2.5-7b-instruct",
                                                                                   "default").mem_mb
    assert p.resources("qwen2.5-7b-instruct", "param_shift").threads() == 8


def test_snakemake_refuses_a_bad_config_before_any_job(tmp_path):
    bad = load_yaml(REPO / "config" / "config.yaml")
    bad["defaults"]["es"]["restore"] = "approximately"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "defaults.es.restore" in proc.stdout + proc.stderr
    assert str(path) in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout + proc.stderr


# --- malformed configs and registries: each refused with file and field, one line per problem -------------


@pytest.fixture()
def refused(tmp_path) -> Callable[..., list[str]]:
    """Apply edits to copies of config/config.yaml and config/models.yaml; return the problem lines."""

    def run(config_edit=None, registry_edit=None, config_text=None, registry_text=None) -> list[str]:
        root = tmp_path / "repo"
        (root / "config").mkdir(parents=True, exist_ok=True)
        with_model_configs(root)
        cfg = load_yaml(REPO / "config" / "config.yaml")
        reg = load_yaml(REPO / "config" / "models.yaml")
        if config_edit:
            config_edit(cfg)
        if registry_edit:
            registry_edit(reg["models"])
        (root / "config" / "models.yaml").write_text(registry_text or yaml.safe_dump(reg, sort_keys=False))
        for name in ("published.yaml", "essa_tiny.yaml", "tiny_methods.yaml"):  # the published numbers; what
            # config.yaml extends
            (root / "config" / name).write_text((REPO / "config" / name).read_text())
        path = root / "config" / "config.yaml"
        path.write_text(config_text or yaml.safe_dump(cfg, sort_keys=False))
        with pytest.raises(ConfigError) as err:
            load_pipeline(load_yaml(path), "config/config.yaml", root=root)
        lines = err.value.problems
        assert lines and all("\n" not in line for line in lines)
        return lines

    return run


def _set(path: str, value) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        keys = path.split("/")
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value
    return edit


def _drop(path: str) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        keys = path.split("/")
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return edit


CONFIG = "config/config.yaml: "
REGISTRY = "config/models.yaml: "
MALFORMED = [
    # (id, config edit, registry edit, expected fragment of the (first) problem line)
    ("es-sigma-negative", _set("defaults/es/sigma", -0.5), None, CONFIG + "defaults.es.sigma: -0.5"),
    ("registry-override-sigma", None, _set("tiny/methods/es", {"sigma": -0.5}),
     REGISTRY + "models.tiny.methods.es.sigma: -0.5"),
    ("registry-override-unknown-key", None, _set("tiny/methods/es", {"sigmma": 0.1}),
     REGISTRY + "models.tiny.methods.es.sigmma: not an option here; did you mean sigma?"),
    ("too-many-train-examples", _set("defaults/es/train_examples", 100000), None,
     CONFIG + "defaults.es.train_examples: 100000 training examples, but data.countdown prepares 192"),
    ("rl-train-examples-too-many", _set("methods/grpo30/train_examples", 193), None,
     CONFIG + "methods.grpo30.train_examples: 193 training examples, but data.countdown prepares 192"),
    ("unknown-algorithm", _set("methods/grpo8/algorithm", "reinforce"), None,
     CONFIG + "methods.grpo8.algorithm: 'reinforce' is not an algorithm"),
    ("eggroll-rank-zero", lambda d: (_set("methods/egg", {"algorithm": "eggroll", "rank": 0})(d),
                                     _set("train/countdown/methods", ["es", "egg"])(d)), None,
     CONFIG + "methods.egg.rank: 0"),
    ("eggroll-rank-over-vllm", lambda d: (_set("methods/egg", {"algorithm": "eggroll", "rank": 600,
                                                                "backend": "vllm"})(d),
                                          _set("train/countdown/methods", ["es", "egg"])(d)), None,
     CONFIG + "methods.egg.rank: rank 600 exceeds 512"),
    ("unknown-method", _set("train/countdown/methods", ["es", "foo"]), None,
     CONFIG + "train.countdown.methods: 'foo' is not an algorithm"),
    ("misspelt-grpo-key", _set("defaults/grpo/learnig_rate", 1e-4), None,
     CONFIG + "defaults.grpo.learnig_rate: not an option here; did you mean learning_rate?"),
    ("misspelt-top-level-key", _set("seed", [0]), None, CONFIG + "seed: not an option here; did you mean seeds?"),
    ("task-override-for-unlisted-method", _set("train/countdown/grpo99", {"beta": 0.1}), None,
     CONFIG + "train.countdown.grpo99: settings for a method not in train.countdown.methods"),
    ("budget-from-not-es", _set("methods/ppo", {"budget_from": "grpo8"}), None,
     CONFIG + "methods.ppo.budget_from: 'grpo8' is not an ES method"),
    ("grpo-groups", _set("methods/grpo30/per_device_train_batch_size", 100), None,
     CONFIG + "methods.grpo30.per_device_train_batch_size: per_device_train_batch_size x gradient_accumulation_steps "
     "(100) must be a multiple of num_generations (30)"),
    ("dr-grpo-v-wrong-loss", _set("methods/drgrpov/loss_type", "grpo"), None,
     CONFIG + "methods.drgrpov.loss_type: algorithm verl_dr_grpo means loss_type dr_grpo"),
    ("ppo-batches", _set("defaults/ppo/mini_batch_size", 100), None,
     CONFIG + "defaults.ppo.mini_batch_size: prompts_per_step (128) must be a multiple of mini_batch_size "
     "(100)"),
    ("eval-tokens", _set("evaluate/countdown/max_new_tokens", 0), None, CONFIG + "evaluate.countdown.max_new_tokens: 0"),
    ("kl-samples", _set("kl/conciseness/n_samples", 0), None, CONFIG + "kl.conciseness.n_samples: 0"),
    ("eval-train-task", _set("evaluate/gsm8k/train_task", "chess"), None,
     CONFIG + "evaluate.gsm8k.train_task: no train.chess entry"),
    ("unknown-task", _set("data/chess", {"source": {"kind": "generated"}}), None, CONFIG + "data.chess: unknown task"),
    ("sudoku-blanks", _set("data/sudoku/source/max_empty", 13), None, CONFIG + "data.sudoku.source.max_empty: 13"),
    ("duplicate-models", _set("models", ["tiny", "tiny"]), None, CONFIG + "models: entries must be distinct"),
    ("scale", _set("scale", "huge"), None, CONFIG + "scale: 'huge'"),
    ("study-model", _set("studies/conciseness/models", ["gpt-7"]), None,
     CONFIG + "studies.conciseness.models.0: 'gpt-7' is not in the registry"),
    ("study-two-models", _set("studies/conciseness/models", ["tiny", "tiny-v2"]), None,
     CONFIG + "studies.conciseness.models: one model per study (2 given)"),
    ("study-two-sweeps", _set("studies/conciseness/grpo/betas_logspace", {"start": -4, "stop": 0, "num": 10}), None,
     CONFIG + "studies.conciseness.grpo: give exactly one of betas and betas_logspace"),
    ("study-without-kl", _drop("kl/conciseness"), None,
     CONFIG + "studies.conciseness.task: no kl.conciseness entry"),
    ("study-settings-key", _set("studies/conciseness/es/settings/sigma", 0.1), None,
     CONFIG + "studies.conciseness.es.settings.sigma: set by the study"),
    ("table1-task", _set("report/table1/task", "gsm9k"), None, CONFIG + "report.table1.task: 'gsm9k' is not evaluated"),
    ("grid-key", None, _set("tiny/methods/grpo8/grid", {"learnig_rate": [1e-4]}),
     REGISTRY + "models.tiny.methods.grpo8.grid.learnig_rate: not a setting of grpo8"),
    ("grid-on-es", None, _set("tiny/methods/es", {"grid": {"sigma": [0.1, 0.2]}}),
     REGISTRY + "models.tiny.methods.es.grid: grids are for RL methods"),
    ("grid-cell-invalid", None, _set("tiny/methods/grpo8/grid", {"learning_rate": [-1.0]}),
     REGISTRY + "models.tiny.methods.grpo8.grid.learning_rate: -1.0"),
    ("registry-no-source", None, _drop("tiny/build"),
     REGISTRY + "models.tiny: needs exactly one of build (a locally built model), hub_id + revision"),
    ("registry-hub-without-config", None, _drop("qwen2.5-0.5b-instruct/config"),
     REGISTRY + "models.qwen2.5-0.5b-instruct: a hub model needs config"),
    ("registry-no-resources", None, _drop("tiny/resources"), REGISTRY + "models.tiny.resources: required"),
    ("registry-no-default-resources", None, _drop("tiny/resources/default"),
     REGISTRY + "models.tiny: resources needs a default entry"),
    ("registry-hub-without-revision", None, _drop("qwen2.5-0.5b-instruct/revision"),
     REGISTRY + "models.qwen2.5-0.5b-instruct: a hub model needs revision"),
    ("registry-dtype", None, _set("tiny/dtype", "int4"), REGISTRY + "models.tiny.dtype: 'int4'"),
    ("registry-build-arch", None, _set("tiny/build/architecture/num_hidden_layers", 0),
     REGISTRY + "models.tiny.build.architecture.num_hidden_layers: 0"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_configs_are_refused_with_file_and_field(refused, case):
    _, config_edit, registry_edit, expected = case
    lines = refused(config_edit, registry_edit)
    assert any(line.startswith(expected) for line in lines), lines


def _renamed_cases() -> list[tuple[str, str, str]]:
    """(old name, new name, defaults block) for every RENAMED entry and every method block that has the new name."""
    from esrepro.settings.base import RENAMED
    from esrepro.settings.methods import ALGORITHMS

    blocks = {a.defaults: a.settings for a in ALGORITHMS.values()}
    return [(old, new, block) for old, new in RENAMED.items() for block, cls in blocks.items()
            if new in cls.model_fields]


@pytest.mark.parametrize("old, new, block", _renamed_cases())
def test_old_names_are_refused_with_their_new_name(refused, old, new, block):
    lines = refused(_set(f"defaults/{block}/{old}", 1))
    assert CONFIG + f"defaults.{block}.{old}: not an option here; renamed: use {new}" in lines, lines


def test_renames_outside_the_method_blocks_are_refused_with_their_new_name(refused):
    """A sweep study's model (now models, a list) and the warm start's batch_size (now prompts_per_step)."""
    def old_study_model(cfg: dict) -> None:
        study = cfg["studies"]["conciseness"]
        study["model"] = study.pop("models")[0]

    assert CONFIG + "studies.conciseness.model: not an option here; renamed: use models" in refused(old_study_model)

    def old_warm_start(reg: dict) -> None:
        sft = reg["tiny"]["build"]["sft"]
        sft["batch_size"] = sft.pop("prompts_per_step")

    assert REGISTRY + "models.tiny.build.sft.batch_size: not an option here; renamed: use prompts_per_step" in (
        refused(None, old_warm_start))


def test_renamed_is_derived_from_the_former_names():
    from esrepro.settings.base import FORMER_BLOCK_NAMES, FORMER_NAMES, RENAMED

    assert RENAMED == {"max_completion_length": "max_new_tokens", "kl_coef": "beta", "batch_size": "prompts_per_step",
                       "generations": "iterations", "sft_batch_size": "sft_prompts_per_step", "model": "models"}
    assert all(RENAMED[old] == new for names in (*FORMER_NAMES.values(), *FORMER_BLOCK_NAMES.values())
               for new, old in names.items())


def test_an_old_name_is_pointed_at_its_new_name_only_where_that_is_an_option(refused, monkeypatch):
    from esrepro.settings import base

    monkeypatch.setitem(base.RENAMED, "noise_scale", "sigma")
    monkeypatch.setitem(base.RENAMED, "lr", "learning_rate")
    assert CONFIG + "defaults.es.noise_scale: not an option here; renamed: use sigma" in refused(
        _set("defaults/es/noise_scale", 0.1))
    assert CONFIG + "defaults.grpo.noise_scale: not an option here" in refused(  # GRPO has no sigma
        _set("defaults/grpo/noise_scale", 0.1))
    assert REGISTRY + "models.tiny.methods.grpo8.grid.lr: not a setting of grpo8; renamed: use learning_rate" in (
        refused(None, _set("tiny/methods/grpo8/grid", {"lr": [1e-4]})))


def test_at_least_twenty_distinct_malformed_inputs():
    assert len({c[0] for c in MALFORMED}) >= 20


def test_unknown_algorithm_is_one_line(refused):
    lines = refused(_set("methods/grpo8/algorithm", "reinforce"))
    assert len(lines) == 1, lines


def test_registry_without_source_does_not_dump_the_entry(refused):
    lines = refused(None, _drop("tiny/build"))
    assert len(lines) == 1 and len(lines[0]) < 200, lines


def test_yaml_errors_name_file_and_line(refused, tmp_path):
    text = (REPO / "config" / "config.yaml").read_text().replace("seeds: [0]", "seeds: [0", 1)
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("seeds: [0"))
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    found = re.match(rf"{re.escape(str(path))}:(\d+):(\d+): not valid YAML", err.value.problems[0])
    assert found and line <= int(found[1]) <= line + 2, err.value.problems
    registry = (REPO / "config" / "models.yaml").read_text().replace("dtype: float32", "dtype: float32: x", 1)
    lines = refused(registry_text=registry)
    assert lines[0].startswith("config/models.yaml:") or "models.yaml:" in lines[0] and ": not valid YAML" in lines[0]


def test_duplicate_keys_are_refused_with_their_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("scale: tiny\nmodels: [tiny]\nmodels: [x]\n")
    with pytest.raises(ConfigError, match=rf"{path}:3:1: not valid YAML: duplicate key 'models'"):
        load_yaml(path)


def test_merge_keys_may_be_overridden_but_duplicates_are_not(tmp_path):
    """``<<: *anchor`` (config/paper.yaml shares the conciseness GRPO settings so) merges; the mapping's own key wins."""
    path = tmp_path / "merge.yaml"
    path.write_text("a: &s {x: 1, y: 2}\nb: {<<: *s, y: 3}\n")
    assert load_yaml(path) == {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}}
    path.write_text("a: &s {x: 1}\nb: {<<: *s, y: 3, y: 4}\n")
    with pytest.raises(ConfigError, match=rf"{path}:2:19: not valid YAML: duplicate key 'y'"):
        load_yaml(path)


def test_extends_reads_the_base_first_and_names_a_missing_or_cyclic_one(tmp_path, monkeypatch):
    from esrepro.config import config_files, read_config, workflow_config

    monkeypatch.chdir(tmp_path)
    Path("base.yaml").write_text("scale: tiny\nmodels: [tiny]\ndefaults:\n  es: {sigma: 0.1, alpha: 0.2}\n")
    Path("top.yaml").write_text("extends: base.yaml\nmodels: [x, y]\ndefaults:\n  es: {alpha: 0.3}\n")
    assert read_config("top.yaml") == {"scale": "tiny", "models": ["x", "y"],
                                       "defaults": {"es": {"sigma": 0.1, "alpha": 0.3}}}
    assert workflow_config(["top.yaml"], {})[0]["defaults"]["es"] == {"sigma": 0.1, "alpha": 0.3}
    assert config_files(["top.yaml"]) == ["base.yaml", "top.yaml"]  # both recorded for provenance
    Path("top.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"top.yaml: extends: no such config file 'nowhere.yaml'"):
        read_config("top.yaml")
    Path("top.yaml").write_text("extends: base.yaml\n")
    Path("base.yaml").write_text("extends: top.yaml\n")
    with pytest.raises(ConfigError, match=r"extends: top.yaml extends itself \(top.yaml -> base.yaml -> top.yaml\)"):
        read_config("top.yaml")


def test_family_is_informational(refused, tmp_path):
    reg = load_yaml(REPO / "config" / "models.yaml")
    reg["models"]["tiny"]["family"] = "mistral"
    path = with_model_configs(tmp_path) / "models.yaml"
    path.write_text(yaml.safe_dump(reg))
    assert load_registry(path)["tiny"].family == "mistral"


def test_validate_verb_names_the_file(tmp_path):
    bad = load_yaml(REPO / "config" / "config.yaml")
    bad["defaults"]["es"]["sigma"] = -1
    bad["registry"] = str(REPO / "config" / "models.yaml")
    bad["published"] = str(REPO / "config" / "published.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run([sys.executable, "-m", "esrepro.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{path}: defaults.es.sigma: -1" in proc.stderr


def test_workspaces_keep_configs_apart_and_are_not_inherited(tmp_path):
    """Every shipped tiny config but the default writes under its own workspace; `extends` does not pass a
    workspace on (two configs would share it); a workspace must be a folder inside the repository."""
    from esrepro.planning.plan import Plan

    spaces = {name: read_config(REPO / "config" / name, root=REPO).get("workspace")
              for name in ("config.yaml", "paper.yaml", "essa_tiny.yaml")}
    # the default extends the ESSA study's config, and writes into the repository's own data/ and results/
    assert spaces == {"config.yaml": None, "paper.yaml": None, "essa_tiny.yaml": "work/essa_tiny"}
    child = tmp_path / "child.yaml"
    child.write_text("extends: config/essa_tiny.yaml\n")
    assert "workspace" not in read_config(child, root=REPO)
    # nor when the file is read as it is and load_pipeline resolves its `extends`
    assert load_pipeline(load_yaml(child), str(child), root=REPO).cfg.workspace is None
    plan = Plan(load_pipeline(read_config(REPO / "config" / "essa_tiny.yaml", root=REPO), "essa_tiny.yaml", root=REPO))
    assert plan.paths.RUN == "work/essa_tiny/results/runs/{task}/{model}/{method}/seed{seed}"
    assert plan.paths.PREPARED == "work/essa_tiny/data/prepared/{task}" and plan.paths.MANIFEST == "manifest.json"
    assert all(p.startswith("work/essa_tiny/") for p in plan.final_targets() + plan.datasets())
    for bad in ("/abs", "../up", "results/x"):
        cfg = read_config(REPO / "config" / "essa_tiny.yaml", root=REPO) | {"workspace": bad}
        with pytest.raises(ConfigError, match=r"essa_tiny\.yaml: workspace: .*a folder inside the repository"):
            load_pipeline(cfg, "essa_tiny.yaml", root=REPO)


def test_paper_config_plans_arc_as_v2_states():
    """v2 Table 3 / App. A.9: ES on ARC-AGI with Qwen2.5-14B-Instruct, 200 training and 200 evaluation tasks,
    sigma 0.001, alpha 0.0003, N = 50, 1,500 iterations; the published numbers 0.2 -> 29.5."""
    from esrepro.tasks import task_class

    paper = load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "paper.yaml", root=REPO)
    assert paper.train_models("arc") == ["qwen2.5-14b-instruct"]
    entry = paper.registry["qwen2.5-14b-instruct"]
    assert (entry.hub_id, entry.revision, entry.dtype) == ("Qwen/Qwen2.5-14B-Instruct", "main", "bfloat16")
    es = paper.method_settings("qwen2.5-14b-instruct", "arc", "es")
    assert (es.sigma, es.alpha, es.population, es.iterations) == (0.001, 0.0003, 50, 1500)
    source = paper.cfg.data["arc"].source.model_dump(exclude_none=True)
    sizes = task_class("arc").split_sizes(source)
    assert (source["n_train_tasks"], source["n_test_tasks"]) == (200, 200)
    assert es.train_examples == sizes["train"] == 208  # every training example scored each iteration
    published = load_yaml(REPO / "config" / "published.yaml")["tables"]["puzzles_arc"]
    assert published["models"] == {"qwen2.5-14b-instruct": {"base": 0.2, "es": 29.5}}
    assert (published["provenance"]["version"], published["provenance"]["table"]) == ("v2", "Table 3")
