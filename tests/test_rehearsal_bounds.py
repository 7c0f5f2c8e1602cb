"""The rehearsal bounds every job of the paper's DAG, whatever layer set its size: config/paper.yaml's own settings
(ARC-AGI's ES run among them), the registry's, the code's defaults, and a setting added to the paper config that
config/rehearsal.yaml never restates."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import REPO
from esrepro.config import read_config
from esrepro.pipeline import Pipeline
from esrepro.planning.jobs import plan_jobs
from esrepro.planning.load import load_pipeline
from esrepro.planning.rehearsal_bounds import BOUNDS, NULL_IS_ALL, TRAIN_RULES, rl_steps
from esrepro.planning.specs import eval_spec, kl_spec, method_spec
from esrepro.rl.budget import samples_per_step

#: An RL run's problems are raised to one rollout's (planning.rehearsal_bounds.rl_thinned): its bound is its steps.
RL_UNBOUNDED = ("train_examples",)


def _load(path: Path | str) -> Pipeline:
    return load_pipeline(read_config(path, REPO), str(path), REPO)


def _over(spec: dict, skip: tuple[str, ...] = ()) -> dict:
    """The fields of a job's spec above the rehearsal's bounds (or null where null means all)."""
    out = {}
    for key, bound in BOUNDS.items():
        if key not in spec or key in skip:
            continue
        value = spec[key]
        if key == "eval_limit" and spec.get("eval_every", 0) is None:
            continue
        if (value is None and key in NULL_IS_ALL) or (isinstance(value, int) and value > bound):
            out[key] = value
    return out


def unbounded_jobs(p: Pipeline) -> dict[str, dict]:
    """Every job of ``p``'s DAG whose spec is over a bound, with the fields over it (an RL run: also more than
    RL_STEPS optimiser steps, in whole rollouts)."""
    out = {}
    for job in plan_jobs(p):
        w = job.wildcards
        if job.rule in TRAIN_RULES:
            spec = method_spec(p, w["model"], w["task"], w["method"], w.get("cell"))
            rl = p.is_rl(w["task"], w["method"])
            essa = spec["algorithm"] == "essa"  # its train_examples: the sum of its bounded parts
            over = _over(spec, RL_UNBOUNDED if rl or essa else ())
            if rl and spec["sample_budget"] // samples_per_step(spec) > rl_steps(spec.get("updates_per_generation") or 1):
                over["steps"] = spec["sample_budget"] // samples_per_step(spec)
        elif job.rule == "evaluate":
            over = _over(eval_spec(p, w["task"]))
        elif job.rule == "kl":
            over = _over(kl_spec(p, w["task"]))
        else:
            continue
        if over:
            out[f"{job.rule} {job.label}"] = over
    return out


def test_every_job_of_the_rehearsal_is_within_its_bounds():
    p = _load("config/rehearsal.yaml")
    assert unbounded_jobs(p) == {}
    # ARC-AGI's ES run: the paper's population 50, 1,500 iterations and 208 training problems, bounded
    arc = method_spec(p, "qwen2.5-7b-instruct", "arc", "es") if "qwen2.5-7b-instruct" in p.train_models("arc") \
        else method_spec(p, p.train_models("arc")[0], "arc", "es")
    assert arc["population"] <= BOUNDS["population"] and arc["iterations"] <= BOUNDS["iterations"]
    assert arc["train_examples"] <= BOUNDS["train_examples"]
    paper = _load("config/paper.yaml")
    model = p.train_models("arc")[0]
    big = paper.method_settings(model, "arc", "es")
    assert (big.population, big.iterations, big.train_examples) == (50, 1500, 208)  # what the bounds shrink


def test_a_setting_added_to_the_paper_config_is_bounded_without_touching_the_rehearsals(tmp_path):
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    # settings config/rehearsal.yaml does not restate, each in a layer above the rehearsal's own
    paper.setdefault("methods", {}).setdefault("es", {}).update({"population": 200, "iterations": 4000})
    paper["train"]["sudoku"].setdefault("es", {}).update({"train_examples": 500, "max_new_tokens": 4096})
    paper.setdefault("kl", {})["countdown"] = {**(paper["kl"].get("countdown") or {}), "n_samples": 64}
    paper.setdefault("evaluate", {})["math500"] = {**(paper["evaluate"].get("math500") or {}), "limit": None,
                                                   "batch_size": 512}
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(paper, sort_keys=False))
    rehearsal = (REPO / "config" / "rehearsal.yaml").read_text()
    assert "extends: config/paper.yaml" in rehearsal
    (tmp_path / "rehearsal.yaml").write_text(rehearsal.replace("extends: config/paper.yaml",
                                                               f"extends: {tmp_path / 'paper.yaml'}"))
    # unrehearsed, the added settings are what the jobs would run
    raw = _load(tmp_path / "paper.yaml")
    model = raw.train_models("sudoku")[0]
    assert raw.method_settings(model, "sudoku", "es").train_examples == 500
    p = _load(tmp_path / "rehearsal.yaml")
    assert unbounded_jobs(p) == {}
    s = p.method_settings(model, "sudoku", "es")
    assert (s.population, s.iterations, s.train_examples, s.max_new_tokens) == (4, 2, 4, 8)  # rehearsal.yaml's
    es = p.method_settings(p.train_models("countdown")[0], "countdown", "es")
    assert es.population <= BOUNDS["population"] and es.iterations <= BOUNDS["iterations"]
    assert kl_spec(p, "countdown")["n_samples"] == BOUNDS["n_samples"]
    assert eval_spec(p, "math500")["limit"] == BOUNDS["limit"] and eval_spec(p, "math500")["batch_size"] == 8
