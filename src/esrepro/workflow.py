"""The plan of a pipeline run: which files exist for a config, and each rule's settings.

The Snakefiles call this to wire paths; keeping it here makes the DAG's shape unit-testable
without Snakemake. Method ``base`` is the untrained model: its "checkpoint" is the base
model directory, and it is evaluated once (tag seed0), as greedy decoding makes the
seed irrelevant.
"""

from __future__ import annotations

import json
import itertools
import re
import shlex
from typing import Any

from esrepro.config import algorithm_of, method_settings, rule_resources, study_method, study_methods
from esrepro.rl.budget import Budget, es_sample_budget, rl_budget, samples_per_step

BASE = "base"
CPU_ONLY_RULES = {"fetch"}
FETCH_MEM_MB = 8000  # a download needs no more, whatever the model's GPU jobs ask for

#: Short names of grid keys in cell directory names.
CELL_KEY_NAMES = {"learning_rate": "lr", "actor_learning_rate": "alr", "critic_learning_rate": "clr",
                  "kl_coef": "kl", "beta": "beta"}
DEFAULT_CELL = "default"


def cell_name(cell: dict) -> str:
    """A grid cell's directory name, e.g. ``lr0.0001_beta0`` (``default`` for the empty cell)."""
    if not cell:
        return DEFAULT_CELL
    return "_".join(f"{CELL_KEY_NAMES.get(k, k)}{v:g}" if isinstance(v, float) else f"{CELL_KEY_NAMES.get(k, k)}{v}"
                    for k, v in cell.items())


class Plan:
    """Paths and per-rule settings derived from a validated config and registry."""

    def __init__(self, config: dict, registry: dict[str, dict]) -> None:
        self.config = config
        self.registry = registry
        self.models: list[str] = list(config["models"])

    # --- paths --------------------------------------------------------------
    @staticmethod
    def base_dir(model: str) -> str:
        return f"results/models/{model}/base"

    @staticmethod
    def run_dir(task: str, model: str, method: str, seed: int | str) -> str:
        return f"results/runs/{task}/{model}/{method}/seed{seed}"

    @staticmethod
    def eval_dir(task: str, model: str, method: str, seed: int | str, split: str) -> str:
        return f"results/eval/{task}/{model}/{method}/seed{seed}/{split}"

    @staticmethod
    def cell_dir(task: str, model: str, method: str, cell: str, seed: int | str) -> str:
        """One grid cell's run (RL methods): the selected cell's files become ``run_dir``."""
        return f"results/runs/{task}/{model}/{method}/grid/{cell}/seed{seed}"

    def train_task_of(self, task: str) -> str:
        """The training task whose runs are evaluated on ``task`` (itself unless configured)."""
        return self.config["evaluate"].get(task, {}).get("train_task", task)

    def checkpoint_of(self, task: str, model: str, method: str, seed: int | str) -> str:
        """The weights evaluated on ``task`` for (model, method, seed): base model or run checkpoint."""
        if method == BASE:
            return self.base_dir(model)
        return f"{self.run_dir(self.train_task_of(task), model, method, seed)}/checkpoint"

    def runs(self, task: str) -> list[tuple[str, str, int]]:
        """(model, method, seed) of every run evaluated on ``task``, base models included."""
        methods = self.config["train"].get(self.train_task_of(task), {}).get("methods", [])
        out = [(m, BASE, 0) for m in self.models]
        out += [(m, meth, s) for m in self.models for meth in methods for s in self.config["seeds"]]
        return out

    # --- settings as JSON for rules -----------------------------------------
    def data_spec_json(self, task: str) -> str:
        if task not in self.config["data"]:
            raise KeyError(f"no data.{task} entry in the config")
        return json.dumps(self.config["data"][task], sort_keys=True)

    def model_spec_json(self, model: str) -> str:
        """The registry entry a model is built or fetched from; its per-method settings and grids are left
        out, so tuning a method never rebuilds the base model."""
        entry = {k: v for k, v in self.registry[model].items() if k != "methods"}
        return json.dumps(entry, sort_keys=True)

    def task_options(self, task: str) -> dict:
        return dict(self.config.get("task_options", {}).get(task, {}))

    def method_spec(self, model: str, task: str, method: str) -> dict:
        """A method's settings for ``model``; RL methods get ``sample_budget``, the ES run's sample count."""
        spec = method_settings(self.config, self.registry, model, task, method)
        spec["task_options"] = self.task_options(task)
        if self.is_rl(task, method) and not self.is_study_method(task, method):
            ref = spec["budget_from"]
            spec["sample_budget"] = es_sample_budget(method_settings(self.config, self.registry, model, task, ref))
        return spec

    def method_spec_json(self, model: str, task: str, method: str) -> str:
        return json.dumps(self.method_spec(model, task, method), sort_keys=True)

    # --- RL: algorithms, budgets, grids ----------------------------------------
    def study_method_names(self) -> list[str]:
        """Every study's method names (trained directly by the train rule, never through a grid)."""
        return [m for study in self.config.get("studies", {}).values() for m in study_methods(study)]

    def is_study_method(self, task: str, method: str) -> bool:
        return study_method(self.config, task, method) is not None

    def algorithm(self, task: str, method: str) -> str:
        found = study_method(self.config, task, method)
        if found is not None:
            return found[1]["algorithm"]
        return algorithm_of(method, self.config["train"][task][method])

    def is_rl(self, task: str, method: str) -> bool:
        return self.algorithm(task, method) != "es"

    def _methods(self, rl: bool) -> list[str]:
        """Methods trained through a grid (``rl``), or directly: ES methods and every study method."""
        grid = {m for task, spec in self.config["train"].items() for m in spec["methods"] if self.is_rl(task, m)}
        if rl:
            return sorted(grid)
        direct = {m for task, spec in self.config["train"].items() for m in spec["methods"] if m not in grid}
        return sorted(direct | set(self.study_method_names()))

    def methods_regex(self, rl: bool) -> str:
        """Wildcard regex of the methods trained directly (``rl=False``) or through a grid (``rl=True``)."""
        return self._regex(self._methods(rl))

    def rl_budget(self, model: str, task: str, method: str) -> Budget:
        spec = self.method_spec(model, task, method)
        return rl_budget(spec["sample_budget"], samples_per_step(spec))

    def grid(self, model: str, method: str) -> dict[str, list]:
        """The registry's hyperparameter grid of ``method`` for ``model`` (empty: the config's settings only)."""
        return dict(self.registry[model].get("methods", {}).get(method, {}).get("grid", {}))

    def grid_cells(self, model: str, method: str) -> dict[str, dict]:
        """``{cell name: overrides}``, the product of the grid's value lists, in grid order."""
        grid = self.grid(model, method)
        keys = list(grid)
        cells = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
        return {cell_name(c): c for c in cells}

    def cell_spec_json(self, model: str, task: str, method: str, cell: str) -> str:
        cells = self.grid_cells(model, method)
        if cell not in cells:
            raise KeyError(f"{model}/{method}: no grid cell {cell!r}; cells: {', '.join(cells)}")
        return json.dumps({**self.method_spec(model, task, method), **cells[cell]}, sort_keys=True)

    def cell_runs(self, task: str, model: str, method: str, seed: int | str) -> list[str]:
        return [self.cell_dir(task, model, method, c, seed) for c in self.grid_cells(model, method)]

    def selections(self, task: str) -> list[str]:
        """selection.json of every RL run trained on ``task`` (Table 3's inputs)."""
        return [f"{self.run_dir(task, m, meth, s)}/selection.json"
                for m in self.models for meth in self.config["train"].get(task, {}).get("methods", [])
                if self.is_rl(task, meth) for s in self.config["seeds"]]

    def eval_spec_json(self, task: str, split: str) -> str:
        spec = dict(self.config["evaluate"][task])
        spec["split"] = split
        spec["task_options"] = self.task_options(task)
        return json.dumps(spec, sort_keys=True)

    def uses_chat(self, model: str) -> bool:
        return bool(self.registry[model]["chat_template"])

    # --- models ---------------------------------------------------------------
    def _regex(self, keys: list[str]) -> str:
        return "|".join(re.escape(k) for k in keys) if keys else "(?!x)x"

    def built_models_regex(self) -> str:
        return self._regex([k for k, e in self.registry.items() if "build" in e])

    def hub_models_regex(self) -> str:
        return self._regex([k for k, e in self.registry.items() if "hub_id" in e])

    def build_inputs(self, model: str) -> list[str]:
        """Prepared data a built model's warm start must stay disjoint from."""
        task = self.registry[model]["build"]["sft"]["task"]
        return [f"data/prepared/{task}"] if task in self.config["data"] else []

    def build_data_spec_json(self, model: str) -> str:
        """The config's data block of the task a built model is warm-started on."""
        task = self.registry[model]["build"]["sft"]["task"]
        return json.dumps(self.config["data"].get(task, {"source": {}}), sort_keys=True)

    # --- resources ------------------------------------------------------------
    def resources(self, model: str, rule: str) -> dict[str, Any]:
        """A rule's resources for ``model``; downloads never hold a GPU."""
        res = rule_resources(self.registry[model], rule)
        if rule in CPU_ONLY_RULES:
            res = {k: v for k, v in res.items() if k not in ("gpu_model", "cpus_per_gpu")}
            res.update(gpu=0, cpus_per_task=1)
            res["mem_mb"] = min(res.get("mem_mb", FETCH_MEM_MB), FETCH_MEM_MB)
        return res

    def resource_keys(self, rule: str) -> list[str]:
        """Resource names every configured model defines for ``rule``."""
        keys = [set(self.resources(m, rule)) for m in self.models]
        return sorted(set.intersection(*keys)) if keys else []

    # --- report ---------------------------------------------------------------
    def table1_metrics(self) -> list[str]:
        t = self.config["report"]["table1"]
        return [f"{self.eval_dir(t['task'], m, meth, s, t['split'])}/metrics.json" for m, meth, s in self.runs(t["task"])]

    def table1_notes(self) -> str:
        """``--note`` arguments for Table 1: data provenance and the ES settings."""
        t = self.config["report"]["table1"]
        task = t["task"]
        src = self.config["data"][task]["source"]
        notes = [f"Scale: {self.config['scale']}; {task} data source: {src['kind']}"
                 + (" (not the paper's data)" if src["kind"] == "generated" else "")]
        for meth in self.config["train"].get(task, {}).get("methods", []):
            s = self.config["train"][task][meth]
            if not self.is_rl(task, meth):
                notes.append(
                    f"ES: N={s['population']}, sigma={s['sigma']}, alpha={s['alpha']}, {s['iterations']} iterations, "
                    f"{s['train_examples']} training examples, greedy, noise={s['noise']}, restore={s['restore']}; "
                    f"sample budget {s['iterations']} x {s['population']} x {s['train_examples']} = "
                    f"{es_sample_budget(s):,} scored training samples"
                )
        rl = [m for m in self.config["train"].get(task, {}).get("methods", []) if self.is_rl(task, m)]
        if rl:
            parts = []
            for meth in rl:
                budgets = {self.rl_budget(m, task, meth) for m in self.models}
                b = sorted(budgets, key=lambda x: x.steps)[0]
                per_model = "" if len(budgets) == 1 else " (first model; see manifests)"
                parts.append(f"{meth} ({self.algorithm(task, meth)}): {b.steps:,} steps x {b.samples_per_step} = "
                             f"{b.samples_used:,}{per_model}")
            notes.append("Equal sample budgets: each RL method runs floor(ES budget / samples per step) steps; "
                         + "; ".join(parts) + ". RL hyperparameters: best cell of each model's grid by training "
                         "reward (Table 3).")
        notes.append(f"Seeds: {self.config['seeds']} (mean over seeds; base model evaluated once)")
        return " ".join(f"--note {shlex.quote(n)}" for n in notes)

    def curve_logs(self, task: str, method: str) -> list[str]:
        return [f"{self.run_dir(task, m, meth, s)}/log.jsonl" for m, meth, s in self.runs(task) if meth == method]

    def labelled(self, paths: Any, task: str, method: str) -> str:
        """``--log LABEL=PATH`` arguments, one per training log."""
        args = []
        for path in paths:
            model, meth, seed = str(path).split("/")[3:6]
            label = f"{self.registry[model]['display']} / {meth.upper()} / {seed}"
            args.append(f"--log {shlex.quote(f'{label}={path}')}")
        return " ".join(args)

    def eval_metrics(self) -> list[str]:
        """metrics.json of every configured evaluation (each task, model, method, seed)."""
        return [
            f"{self.eval_dir(task, m, meth, s, spec['split'])}/metrics.json"
            for task, spec in self.config["evaluate"].items()
            for m, meth, s in self.runs(task)
        ]

    # --- KL to the base model ---------------------------------------------------
    @staticmethod
    def kl_dir(task: str, model: str, method: str, seed: int | str) -> str:
        return f"results/kl/{task}/{model}/{method}/seed{seed}"

    def study(self, name: str) -> dict | None:
        return self.config.get("studies", {}).get(name)

    def study_runs(self, name: str) -> list[tuple[str, str, int]]:
        """(model, method, seed) of a study's training runs (method names like es_sigma0.001)."""
        study = self.study(name)
        if not study:
            return []
        return [(study["model"], meth, s) for meth in study_methods(study) for s in study["seeds"]]

    def kl_runs(self) -> list[tuple[str, str, str, int]]:
        """(task, model, method, seed) of every KL measurement: each run of a task with a ``kl`` entry
        (the task's training runs and their base models, every study run and the study's base model)."""
        out: list[tuple[str, str, str, int]] = []
        for task in self.config.get("kl", {}):
            methods = self.config["train"].get(task, {}).get("methods", [])
            if methods:
                out += [(task, m, BASE, 0) for m in self.models]
            out += [(task, m, meth, s) for m in self.models for meth in methods for s in self.config["seeds"]]
        for name, study in self.config.get("studies", {}).items():
            out += [(study["task"], study["model"], BASE, 0)]
            out += [(study["task"], m, meth, s) for m, meth, s in self.study_runs(name)]
        return list(dict.fromkeys(out))

    def kl_targets(self) -> list[str]:
        return [f"{self.kl_dir(*r)}/kl.json" for r in self.kl_runs()]

    def kl_model_dir(self, task: str, model: str, method: str, seed: int | str) -> str:
        """The weights KL is measured for: the base model (method base) or the run's final checkpoint."""
        return self.base_dir(model) if method == BASE else f"{self.run_dir(task, model, method, seed)}/checkpoint"

    def kl_run_inputs(self, task: str, model: str, method: str, seed: int | str) -> list[str]:
        """The run's manifest (which lists its kept snapshots); nothing for the base model."""
        return [] if method == BASE else [f"{self.run_dir(task, model, method, seed)}/manifest.json"]

    def kl_run_arg(self, task: str, model: str, method: str, seed: int | str) -> str:
        return "" if method == BASE else f"--run-dir {shlex.quote(self.run_dir(task, model, method, seed))}"

    def threads(self, task: str, method: str, rule: str = "train") -> int:
        """CPU threads of a train or kl job: a study's or the kl entry's ``threads``, else the config's.

        The tiny model gains nothing from a second intra-op thread, and on a loaded
        2-core machine two spinning threads per job were measured 16x slower than one.
        """
        if rule == "kl" and "threads" in self.config.get("kl", {}).get(task, {}):
            return int(self.config["kl"][task]["threads"])
        found = study_method(self.config, task, method) if rule == "train" else None
        if found is not None:
            return int(found[0].get("threads", self.config["threads"]))
        return int(self.config["threads"])

    def kl_spec_json(self, task: str) -> str:
        spec = dict(self.config["kl"][task])
        spec["task_options"] = self.task_options(task)
        return json.dumps(spec, sort_keys=True)

    # --- the conciseness study (Table 2, Figures 1, 3-4) ------------------------
    def conciseness_kl(self) -> list[str]:
        """kl.json of the conciseness study: the base model and every run."""
        study = self.study("conciseness")
        if not study:
            return []
        runs = [(study["model"], BASE, 0), *self.study_runs("conciseness")]
        return [f"{self.kl_dir(study['task'], *r)}/kl.json" for r in runs]

    def conciseness_notes(self) -> str:
        """``--note`` arguments for Table 2: scale, model, seeds, sweeps and how KL was measured."""
        study = self.study("conciseness")
        kl = self.config["kl"][study["task"]]
        notes = [f"Scale: {self.config['scale']}; model: {self.registry[study['model']]['display']}; "
                 f"seeds: {study['seeds']}; weights kept every {study['checkpoint_every']} iterations."]
        if study.get("es"):
            es = study["es"]["settings"]
            notes.append(f"ES: N={es['population']}, alpha={es['alpha']}, {es['iterations']} iterations, "
                         f"{es['max_new_tokens']} new tokens, greedy.")
        if study.get("grpo"):
            g = study["grpo"]["settings"]
            notes.append("GRPO: " + ", ".join(f"{k}={g[k]}" for k in sorted(g) if not isinstance(g[k], (dict, list))) + ".")
        notes.append(f"KL(fine-tuned || base): {kl['n_samples']} responses sampled per {kl['split']} prompt "
                     f"(temperature {kl.get('temperature', 1.0)}, up to {kl['max_new_tokens']} tokens), "
                     "per-sequence sums of per-token estimates, mean over responses and prompts.")
        return " ".join(f"--note {shlex.quote(n)}" for n in notes)

    def conciseness_targets(self) -> list[str]:
        if not self.study("conciseness"):
            return []
        return ([f"results/tables/table2_conciseness.{e}" for e in ("csv", "md", "tex")]
                + [f"results/figures/conciseness_{f}.{e}" for f in ("pareto", "distribution") for e in ("png", "pdf")])

    def final_targets(self) -> list[str]:
        out = [f"results/tables/table1_countdown.{e}" for e in ("csv", "md", "tex", "metrics.json")]
        out += self.eval_metrics()
        if self.selections(self.config["report"]["table1"]["task"]):
            out += [f"results/tables/table3_rl_hyperparameters.{e}" for e in ("csv", "md", "tex")]
        if self.curve_logs(self.config["report"]["table1"]["task"], "es"):
            out += [f"results/figures/countdown_curves.{e}" for e in ("png", "pdf", "csv")]
        return out + self.kl_targets() + self.conciseness_targets()

    # --- provenance -------------------------------------------------------------
    def datasets(self) -> list[str]:
        """data/prepared/{task} of every task the run reads: evaluated, trained on, warm-started on."""
        dirs: list[str] = []
        for task in self.config["evaluate"]:
            dirs.append(f"data/prepared/{task}")
            if any(meth != BASE for _, meth, _ in self.runs(task)):
                dirs.append(f"data/prepared/{self.train_task_of(task)}")
        for model in self.models:
            if "build" in self.registry[model]:
                dirs += self.build_inputs(model)
        return list(dict.fromkeys(dirs))

    def model_dirs(self) -> list[str]:
        """results/models/{model}/base of every configured model."""
        return [self.base_dir(m) for m in self.models]

    def run_dirs(self) -> list[str]:
        """Every training run directory the evaluations read (checkpoint, log, manifest)."""
        dirs = [self.run_dir(self.train_task_of(task), m, meth, s)
                for task in self.config["evaluate"] for m, meth, s in self.runs(task) if meth != BASE]
        return list(dict.fromkeys(dirs))

    def report_files(self) -> list[str]:
        """Every table and figure file of the run (their manifests excluded)."""
        return [p for p in self.final_targets() if p.startswith(("results/tables/", "results/figures/"))]

    def manifests(self) -> list[str]:
        """Every step manifest of the run: data, models, runs, evaluations, tables and figures."""
        out = [f"{d}/manifest.json" for d in self.datasets() + self.model_dirs() + self.run_dirs()]
        out += [f"{p.rsplit('/', 1)[0]}/manifest.json" for p in self.eval_metrics()]
        stems = dict.fromkeys(p.split(".", 1)[0] for p in self.report_files())
        return out + [f"{stem}.manifest.json" for stem in stems]
