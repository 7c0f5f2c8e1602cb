"""The ``esrepro`` command: every Snakemake rule calls one verb, and every verb is one function in :mod:`esrepro.steps`.

Options are defined once here, with their help text, and each verb lists the ones its
function takes (by parameter name). Settings reach a verb as a JSON ``--spec`` (the
resolved config slice that matters), so a rule's params are what Snakemake tracks for
reruns and what the manifest records; ``esrepro options`` documents every setting.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc


def _cutoff(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "") else float(text)


SPEC_HELP = "resolved settings as JSON (what the rule's params hold; see `esrepro options`)"
OUT_STEM = "output path without extension"

#: Every option of every verb: parameter name -> (flag, argparse keywords). Written once.
OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "task": ("--task", dict(required=True, help="task name (esrepro.tasks: countdown, gsm8k, math500, ...)")),
    "model": ("--model", dict(required=True, help="registry key of the model (a label in outputs)")),
    "method": ("--method", dict(required=True, help="method name (base for the untrained model)")),
    "seed": ("--seed", dict(type=int, default=0, help="run seed")),
    "model_dir": ("--model-dir", dict(required=True, help="checkpoint directory (HF safetensors + tokenizer)")),
    "base_dir": ("--base-dir", dict(required=True, help="the base model KL is measured against")),
    "run_dir": ("--run-dir", dict(default=None, help="the run directory: its manifest, log and kept snapshots")),
    "data_dir": ("--data-dir", dict(required=True, help="prepared data folder (data/prepared/<task>)")),
    "dtype": ("--dtype", dict(default="float32", choices=["float32", "bfloat16", "float16"],
                              help="dtype the weights are loaded in (the registry's)")),
    "chat": ("--chat", dict(action="store_true", help="wrap prompts in the tokenizer's chat template")),
    "threads": ("--threads", dict(type=int, default=1, help="CPU threads (torch intra-op)")),
    "device": ("--device", dict(default="auto", help="auto (CUDA when there is a GPU), cpu, cuda or cuda:N")),
    "spec": ("--spec", dict(type=_json, required=True, help=SPEC_HELP)),
    "data_spec": ("--data-spec", dict(type=_json, default={}, help="the config's data.<sft task> block as JSON")),
    "exclude": ("--exclude", dict(nargs="*", default=[], help="prepared jsonl files whose problems SFT must not see")),
    "pinned": ("--pinned", dict(type=_json, default=None, help="the registry entry's pinned build as JSON "
                                "({path, sha256}); omitted: the model is built")),
    "out": ("--out", dict(required=True, help="output directory (or path stem for tables and figures)")),
    "grid": ("--grid", dict(type=_json, required=True, help="the registry grid as JSON ({} for none)")),
    "cell": ("--cell", dict(action="append", required=True, help="NAME=RUN_DIR of one grid cell's run (repeat)")),
    "metrics": ("--metrics", dict(nargs="+", required=True, help="metrics.json files of evaluations")),
    "published": ("--published", dict(required=True, help="the papers' numbers (config/published.yaml)")),
    "registry": ("--registry", dict(required=True, help="the model registry (config/models.yaml)")),
    "models": ("--models", dict(nargs="+", required=True, help="registry keys, in table order")),
    "split": ("--split", dict(default="test", help="split the table reports")),
    "slice_only": ("--slice", dict(action="store_true", help="only the slice CI runs: one Qwen2 and one Llama "
                                   "replica, ES and GRPO on Countdown, their evaluation and KL, and one base-model "
                                   "evaluation of every other task")),
    "targets": ("--targets", dict(nargs="+", default=[], metavar="TARGET", help="only these Snakemake targets of "
                            "config/rehearsal.yaml and the jobs they need (e.g. a run's manifest.json)")),
    "jobs": ("--jobs", dict(type=int, default=4, help="jobs submitted at once (the cluster runs as many as its "
                            "CPUs hold)")),
    "local": ("--local", dict(action="store_true", help="run the jobs with Snakemake's local executor instead of "
                              "the SLURM profile")),
    "note": ("--note", dict(action="append", default=[], help="a note printed under the table (repeat)")),
    "not_run": ("--not-run", dict(action="append", default=[], metavar="TEST_SET:MODEL:METHOD=TEXT",
                                  help="a run this machine could not do: its cells say TEXT (repeat)")),
    "selection": ("--selection", dict(nargs="+", required=True, help="selection.json of each RL run")),
    "log": ("--log", dict(action="append", required=True, help="LABEL=PATH of a training log.jsonl (repeat)")),
    "kl": ("--kl", dict(nargs="+", required=True, help="kl.json files (samples.jsonl beside each)")),
    "reward_cutoff": ("--reward-cutoff", dict(type=_cutoff, default=None,
                                              help="keep configurations whose mean normalised reward is above this "
                                              "(null: all)")),
    "hacking_margin": ("--hacking-margin", dict(type=float, default=0.2,
                                                help="a run hacks the reward when its share of non-word responses "
                                                "exceeds the base model's by more than this")),
    "estimator": ("--estimator", dict(default="k3", choices=["exact", "k1", "k3"],
                                      help="KL estimator on the x axis (k3: the ES paper's)")),
    "configs": ("configs", dict(nargs="+", help="pipeline config files (each names its registry)")),
    "config": ("config", dict(help="the pipeline config file (e.g. config/paper.yaml)")),
    "csv_out": ("--csv", dict(default=None, metavar="PATH", help="also write the rows as CSV to PATH")),
    "block": ("block", dict(nargs="?", default=None, help="options block to print (none: list the blocks)")),
    "markdown_out": ("--markdown", dict(action="store_true", help="print every block as Markdown (config/README.md)")),
    "schema_dir": ("--schema-dir", dict(default=None, help="write the JSON schemas into this folder instead")),
    "notebook": ("--notebook", dict(required=True, help="the papermill notebook (workflow/notebooks/analysis.ipynb)")),
    "tables_dir": ("--tables-dir", dict(required=True, help="folder of the tables")),
    "figures_dir": ("--figures-dir", dict(required=True, help="folder of the figures")),
    "eval_dir": ("--eval-dir", dict(required=True, help="folder of the evaluations")),
    "out_ipynb": ("--out-ipynb", dict(required=True, help="executed notebook to write")),
    "out_html": ("--out-html", dict(required=True, help="its HTML rendering to write")),
    "timeout": ("--timeout", dict(type=int, default=600, help="seconds per notebook cell")),
    "show_code": ("--show-code", dict(action="store_true", help="keep the code cells in the HTML")),
    "workflow": ("--workflow", dict(nargs="+", required=True, help="the main Snakefile first, then the files it reads")),
    "config_files": ("--config-files", dict(nargs="*", default=[], help="config files of the run")),
    "inputs": ("--inputs", dict(nargs="*", default=[], help="datasets and base models (the run's objects)")),
    "outputs": ("--outputs", dict(nargs="*", default=[], help="checkpoints, metrics, tables, figures, reports")),
    "manifests": ("--manifests", dict(nargs="*", default=[], help="step manifests of the run")),
    "copy_max_bytes": ("--copy-max-bytes", dict(type=int, default=20_000_000,
                                                help="larger files are referenced, not copied")),
    "paths": ("--paths", dict(nargs="+", required=True, help="folders to track (one .dvc file each)")),
    "push": ("--push", dict(action="store_true", help="dvc push to the default remote afterwards")),
    "remote": ("--remote", dict(default=None, help="dvc push to this remote afterwards")),
    "target": ("target", dict(help="a table, figure or any recorded output")),
    "figure": ("--figure", dict(default=None, help="also draw the margins figure at this path stem (png, pdf, csv)")),
    "only": ("--only", dict(nargs="*", default=None, help="build only these rows (claim ids, esrepro claim-costs)")),
    "headline": ("--headline", dict(default=None, help="the run's headline result, one of --outputs (the claims "
                                                   "table)")),
    "results": ("--results", dict(default="results",
                                  help="the results folder the table reads (eval/, kl/, runs/, figures/)")),
    "root": ("--root", dict(default=".", help="the pipeline's working directory")),
    "golden": ("golden", dict(help="the golden tree (a checkout's data/ and results/ with their manifests)")),
    # ESSA
    "sft_dir": ("--sft-dir", dict(required=True, help="the reference ESSA run's sft/ folder (the SFT adapter)")),
    "ref_spec": ("--ref-spec", dict(type=_json, required=True, help="the reference ESSA run's settings as JSON")),
    "trains": ("--trains", dict(default="adapter", choices=["adapter", "all"],
                                help="what the GRPO baseline trains: adapter (the SFT LoRA adapter, as the ESSA paper) "
                                "or all (every weight of the SFT start, the adapter merged in)")),
    "runs": ("--runs", dict(nargs="+", required=True, help="run directories (log.jsonl and manifest.json in each)")),
    "histogram": ("--histogram", dict(nargs="+", required=True, help="histogram.json of each ES run (param shift)")),
    "periodic": ("--periodic", dict(nargs="+", required=True, help="periodic_eval.jsonl of each run")),
    "sets": ("--set", dict(action="append", required=True, help="TEST_SET=TRAIN_TASK: a test set and the "
                                                                "training task whose runs it evaluates (repeat)")),
    "sampled_coords": ("--sampled-coords", dict(type=int, default=0, help="also simulate each run's random walk on "
                                                "this many coordinates (0: closed form only)")),
    # the rehearsal's mirror
    "mirror_root": ("mirror_root", dict(metavar="ROOT", help="the mirror's folder")),
    "mirror_config": ("--run-config", dict(default="config/paper.yaml", help="the run's config (its models and data sources)")),
    "shared_data": ("--shared-data", dict(default=None, help="folder of the authors' files (countdown.json, "
                                          "datasets/): real copies where they match, else stand-ins")),
    "port": ("--port", dict(type=int, default=0, help="port to listen on (0: any free port)")),
    "url_file": ("--url-file", dict(default=None, help="write the mirror's URL to this file")),
    "request_log": ("--request-log", dict(default=None, help="append one line per request here (default: stderr)")),
    "packages": ("packages", dict(nargs="+", help="modules to import (e.g. vllm ray bitsandbytes)")),
    "title": ("--title", dict(default="", help="a figure's title")),
    "kind": ("--kind", dict(default="points", choices=["points", "relative"],
                            help="improvement in percentage points (the paper's bars) or relative to the base")),
    # adding a model to the registry
    "key": ("key", dict(metavar="KEY", help="registry key of the new entry (letters, digits, '.', '_', '-')")),
    "hub_id": ("--hub-id", dict(default=None, metavar="ID", help="a hub model: its repository id (org/name); its "
                                "config.json is read through the hub API")),
    "revision": ("--revision", dict(default=None, metavar="REV", help="with --hub-id: the commit (or a branch, "
                                    "resolved when the model is fetched) the entry pins")),
    "from_dir": ("--from-dir", dict(default=None, metavar="DIR", help="a transformers model folder on disk (offline): "
                                    "the entry's path")),
    "display": ("--display", dict(default=None, help="the name printed in tables (default: the repository's or the "
                                  "folder's name)")),
    "gated": ("--gated", dict(action="store_true", help="the hub repository is gated (fetching it needs a token)")),
    "force": ("--force", dict(action="store_true", help="replace an entry of the same key")),
}
#: Options whose help differs by verb.
OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    ("table1", "out"): dict(help=OUT_STEM), ("table2", "out"): dict(help=OUT_STEM),
    ("conciseness-stability", "out"): dict(help=OUT_STEM),
    ("table3", "out"): dict(help=OUT_STEM), ("curves", "out"): dict(help=OUT_STEM),
    ("pareto", "out"): dict(help=OUT_STEM), ("reward-distribution", "out"): dict(help=OUT_STEM),
    ("table1", "task"): dict(required=False, default="countdown", help="task the table reports"),
    ("cost", "markdown_out"): dict(action="store", default=None, metavar="PATH",
                                   help="also write the table as Markdown to PATH"),
    ("plan-check", "markdown_out"): dict(action="store", default=None, metavar="PATH",
                                         help="also write the table of predicted peaks as Markdown to PATH"),
    ("eval-summary", "out"): dict(help="the summary JSON to write"),
    ("claims", "out"): dict(help=OUT_STEM),
    ("claims", "spec"): dict(help="the config's scale, the rules' settings and each row's selectors, jobs and "
                             "target as JSON (esrepro.planning.specs.claims_spec)"),
    ("claims", "inputs"): dict(help="the files the rows may read (the rule's declared inputs; recorded in its "
                               "manifest)"),
    ("claim-costs", "markdown_out"): dict(action="store", default=None, metavar="PATH",
                                          help="also write the table as Markdown to PATH"),
    ("audit", "target"): dict(nargs="?", default="results/tables/claims.csv",
                              help="a table, figure or any recorded output (default: the claims table, the run's "
                              "headline)"),
    ("ro-crate", "out"): dict(help="crate folder (replaced)"),
    ("dvc-record", "out"): dict(help="JSON summary of what was recorded"),
    **{(v, "out"): dict(help=OUT_STEM) for v in ("gains", "sample-curves", "param-shift", "lr-sweep",
                                                 "lr-distributions", "train-tasks-table", "math-table",
                                                 "math-figure", "puzzle-table", "stability-table",
                                                 "es-variants-table")},
    ("math-figure", "model"): dict(help="registry key of the math runs' model (the bars without a model of their own)"),
    ("math-figure", "title"): dict(default="", help="the figure's title"),
    **{(v, "task"): dict(required=False, default="countdown", help="task the figure shows")
       for v in ("gains", "sample-curves", "param-shift")},
    ("param-shift-histogram", "out"): dict(help="output folder (histogram.json, manifest.json)"),
    ("param-shift-histogram", "model_dir"): dict(required=True, help="the ES run's final checkpoint"),
    ("param-shift-histogram", "run_dir"): dict(required=True, help="the ES run (manifest: alpha, N; log: rewards)"),
    ("eval-summary", "metrics"): dict(help="metrics.json of every evaluation"),
    ("essa-report", "spec"): dict(help="target_accuracy, sweeps and output stems as JSON"),
    ("es-variants-table", "spec"): dict(help="Table 1's task and split and each ES and low-rank ES run's settings "
                                        "as JSON (esrepro.planning.specs.es_variants_spec)"),
    ("essa-report", "metrics"): dict(nargs="*", default=[], required=False, help="metrics.json of the runs' evaluations"),
    ("prepare-data", "spec"): dict(help="the config's data.<task> block as JSON (source and seed)"),
    ("build-tiny", "spec"): dict(help="the registry entry as JSON"),
    ("fetch-model", "spec"): dict(help="the registry entry as JSON"),
    ("build-tiny", "model"): dict(help="registry key of the model to build"),
    ("verify-build", "spec"): dict(help="the registry entry as JSON"),
    ("verify-build", "model"): dict(help="registry key of the model to rebuild"),
    ("verify-build", "pinned"): dict(required=True, help="the registry entry's pinned build as JSON ({path, sha256})"),
    ("verify-build", "out"): dict(help="the comparison to write (JSON)"),
    ("pin-model", "model"): dict(help="registry key of the model"),
    ("pin-model", "model_dir"): dict(help="the model a build step wrote (results/models/<model>/base)"),
    ("pin-model", "out"): dict(help="the pin folder to write (replaced), e.g. data/pinned/<model>"),
    ("fetch-model", "model"): dict(help="registry key of the model to fetch"),
    ("local-model", "model"): dict(help="registry key of the model on disk"),
    ("local-model", "spec"): dict(help="the registry entry as JSON"),
    ("local-model", "out"): dict(help="the base model folder to write (links to the folder's files)"),
    ("add-model", "registry"): dict(required=False, default="config/models.yaml",
                                    help="the registry to add the entry to"),
    ("add-model", "root"): dict(default=".", help="the repository the entry's paths are relative to (its config "
                                "facts go to config/model_configs/KEY.json under it)"),
}


@dataclass(frozen=True)
class Verb:
    """A verb: the library function it calls ("module:function") and its one-line help."""

    target: str
    help: str
    hidden: bool = False  # left out of `esrepro --help` (called by the pipeline, not by hand)

    def function(self):
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)


VERBS: dict[str, Verb] = {
    "validate": Verb("esrepro.steps.config:validate_files", "check config files, their registry and published numbers"),
    "options": Verb("esrepro.steps.config:print_options", "document every setting (or write the JSON schemas)"),
    "cost": Verb("esrepro.planning.cost:cost", "jobs, GPU-hours requested and estimated, and disk of a config's run"),
    "claim-costs": Verb("esrepro.planning.claim_cost:main", "the jobs and GPU-hours that decide each claim, cheapest first, "
                        "with each claim's target"),
    "plan-check": Verb("esrepro.planning.plan_check:plan_check", "build every GPU job's arguments and count its memory per GPU"),
    "prepare-data": Verb("esrepro.steps.data:prepare_data", "write data/prepared/<task>/<split>.jsonl"),
    "build-tiny": Verb("esrepro.steps.models:build_tiny", "build the tiny model of a registry entry (or copy its "
                       "pinned build)"),
    "verify-build": Verb("esrepro.steps.models:verify_build", "rebuild a tiny model from scratch and compare it with "
                         "its pinned build"),
    "pin-model": Verb("esrepro.steps.models:pin_model", "make a built tiny model the registry's pinned build"),
    "fetch-model": Verb("esrepro.steps.models:fetch_model", "download a hub model at its registry revision"),
    "local-model": Verb("esrepro.steps.models:local_model", "link a model folder on disk as a registry model's base, "
                        "every file's sha256 recorded"),
    "add-model": Verb("esrepro.steps.models:add_model", "add a hub model or a model folder to the registry, with "
                      "its config, size and resources"),
    "train": Verb("esrepro.steps.train:train", "train one run (es, grpo, dr_grpo, verl_grpo, verl_dr_grpo, ppo, essa) into a run directory"),
    "select": Verb("esrepro.steps.train:select", "keep the best grid cell of an RL method as its run"),
    "evaluate": Verb("esrepro.steps.evaluate:evaluate", "greedy evaluation of a checkpoint on a task split"),
    "kl": Verb("esrepro.steps.kl:kl", "KL(fine-tuned || base) of a run's weights and kept snapshots"),
    "table1": Verb("esrepro.steps.report:table1", "Table 1: accuracy per model and method, beside the paper's"),
    "table2": Verb("esrepro.steps.report:table2", "Table 2: conciseness reward and KL per configuration"),
    "conciseness-stability": Verb("esrepro.steps.report:conciseness_stability",
                                  "the conciseness runs' reward std over seeds, GRPO against ES, beside the paper's"),
    "table3": Verb("esrepro.steps.report:table3", "Table 3: RL hyperparameter grids and the cells kept"),
    "curves": Verb("esrepro.steps.report:curves", "training reward per iteration (figure)"),
    "pareto": Verb("esrepro.steps.report:pareto", "reward against KL with Pareto fronts (figure)"),
    "reward-distribution": Verb("esrepro.steps.report:reward_distribution", "reward distributions (figure)"),
    "eval-summary": Verb("esrepro.steps.report:main_eval_summary", "every evaluation's accuracy, for dvc metrics"),
    "report-notebook": Verb("esrepro.steps.report:main_report_notebook", "execute the analysis notebook"),
    "ro-crate": Verb("esrepro.steps.provenance:main_ro_crate", "write a Workflow Run RO-Crate of the run"),
    "dvc-record": Verb("esrepro.steps.provenance:main_dvc_record", "dvc add data and checkpoints (optionally push)"),
    "claims": Verb("esrepro.steps.report:claims", "the papers' claims tested by the run: evidence, interval, verdict"),
    "audit": Verb("esrepro.steps.provenance:main_audit", "walk a result back to its data, model, config and code"),
    "golden": Verb("esrepro.steps.provenance:main_golden",
                   "write this tree's manifests and small outputs as a golden tree (for esrepro compare)"),
    "compare": Verb("esrepro.steps.provenance:main_compare",
                    "which outputs differ from a golden tree, and where each arose"),
    "essa-grpo": Verb("esrepro.steps.essa:essa_grpo", "GRPO baseline from a reference ESSA run's SFT start"),
    "essa-report": Verb("esrepro.steps.report:essa_report", "the ESSA study's summary table and figures"),
    "gains": Verb("esrepro.steps.report:gains", "Figure 6: accuracy improvement over the base model"),
    "sample-curves": Verb("esrepro.steps.report:sample_curves", "Figure 7: test accuracy against training samples"),
    "param-shift-histogram": Verb("esrepro.steps.report:param_shift_histogram",
                                  "count |theta_final - theta_base| of one ES run against its random walk"),
    "param-shift": Verb("esrepro.steps.report:param_shift", "Figures 8-10: parameter shifts against the random walk"),
    "lr-sweep": Verb("esrepro.steps.report:lr_sweep", "Figure 4: the conciseness GRPO learning-rate x beta sweep"),
    "lr-distributions": Verb("esrepro.steps.report:lr_distributions", "Figure 5: reward distributions per learning rate"),
    "train-tasks-table": Verb("esrepro.steps.report:train_tasks_table", "accuracy per training task and test set"),
    "math-table": Verb("esrepro.steps.report:math_table", "the math table beside the published RL baselines"),
    "math-figure": Verb("esrepro.steps.report:math_figure", "v2 Figure 2: math pass@1 of the base, RL and ES "
                        "checkpoints per benchmark, beside the paper's"),
    "puzzle-table": Verb("esrepro.steps.report:puzzle_table", "the puzzle table (Sudoku, ARC-AGI)"),
    "rehearse": Verb("esrepro.steps.rehearsal:rehearse",
                     "rehearse the paper's run on this machine at toy size (config/rehearsal.yaml) and report"),
    "stability-table": Verb("esrepro.steps.report:stability_table", "accuracy mean and std over seeds per method"),
    "es-variants-table": Verb("esrepro.steps.report:es_variants_table",
                              "low-rank ES (EGGROLL) beside full-rank ES at equal budgets (beyond the papers)"),
    "mirror-build": Verb("esrepro.steps.mirror:mirror_build",
                         "build a local hub/URL mirror of a config's models (random-weight replicas) and data"),
    "mirror-serve": Verb("esrepro.steps.mirror:mirror_serve",
                         "serve a mirror for HF_ENDPOINT and ESREPRO_URL_MIRROR until killed"),
    "check-packages": Verb("esrepro.planning.preflight:check_packages", "import modules in this environment and print which "
                           "fail (the pre-flight check of a run)", hidden=True),
}


#: Set this environment variable to see the traceback of an unexpected error.
TRACEBACK_ENV = "ESREPRO_TRACEBACK"
#: Verbs that may start helper processes (grading workers, Ray, vLLM engines).
HELPER_VERBS = frozenset({"train", "evaluate", "kl", "essa-grpo"})


def parameters(func) -> list[str]:
    """A verb function's parameter names (each is an entry of :data:`OPTIONS`)."""
    return [n for n, p in inspect.signature(func).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> list[str]:
    """Add ``verb``'s options to ``parser`` (from its function's parameters); returns the parameter names."""
    target = VERBS[verb]
    params = parameters(target.function())
    for param in params:
        if param not in OPTIONS:
            raise KeyError(f"verb {verb}: parameter {param!r} of {target.target} has no entry in esrepro.cli.OPTIONS")
        flag, kw = OPTIONS[param]
        kw = {**kw, **OVERRIDES.get((verb, param), {})}
        if flag.startswith("--"):
            parser.add_argument(flag, dest=param, **kw)
        else:
            parser.add_argument(param, **{k: v for k, v in kw.items() if k != "required"})
    return params


def build_parser(verb: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, list[str]]]:
    """The parser; only ``verb``'s (or, with None, every verb's) options are added, so a call imports one module."""
    parser = argparse.ArgumentParser(prog="esrepro", description=__doc__.splitlines()[0])
    shown = "{" + ",".join(n for n, v in VERBS.items() if not v.hidden) + "}"
    sub = parser.add_subparsers(dest="verb", required=True, metavar=shown)
    params: dict[str, list[str]] = {}
    for name, target in VERBS.items():
        p = sub.add_parser(name, description=target.help, **({} if target.hidden else {"help": target.help}))
        if verb is None or verb == name:
            params[name] = add_arguments(p, name)
    return parser, params


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``esrepro`` console script."""
    if argv is None:  # a local Snakemake job: run in the preloaded interpreter when there is one
        from esrepro.runtime import forkserver

        status = forkserver.delegate(sys.argv[1:])
        if status is not None:
            return status
    from esrepro.runtime import numerics
    from esrepro.settings.layers import ConfigError

    numerics.apply(reexec=argv is None)  # $ESREPRO_NUMERICS=portable: pin CPU kernels before torch loads
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser, params = build_parser(chosen if chosen in VERBS else None)
    args = parser.parse_args(argv)
    func = VERBS[args.verb].function()
    if args.verb in HELPER_VERBS:  # grading pools, Ray and vLLM processes end with this one, even killed
        from esrepro.runtime.lifeline import reap_on_exit

        reap_on_exit()
    try:
        status = func(**{name: getattr(args, name) for name in params[args.verb]})
    except (ConfigError, FileNotFoundError, KeyError, ValueError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"esrepro {args.verb}: error: {message}", file=sys.stderr)
        return 2
    except Exception as exc:  # anything else: one line too; the traceback when asked for
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"esrepro {args.verb}: error: {type(exc).__name__}: {exc} (set {TRACEBACK_ENV}=1 for the traceback)",
              file=sys.stderr)
        return 1
    return int(status) if isinstance(status, int) and not isinstance(status, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
