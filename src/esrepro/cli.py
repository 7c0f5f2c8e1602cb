"""The ``esrepro`` command: every Snakemake rule calls exactly one verb of it.

Settings reach a verb as a JSON ``--spec`` (the config slice that matters), so the
rule's params are what Snakemake tracks for reruns and what the manifest records.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    torch.use_deterministic_algorithms(True, warn_only=True)


def cmd_validate(args: argparse.Namespace) -> None:
    """Validate pipeline configs (and the registry they name)."""
    from esrepro.config import check_config, load_yaml

    for path in args.configs:
        check_config(load_yaml(path), path)
        print(f"{path}: ok")


def cmd_prepare_data(args: argparse.Namespace) -> None:
    """Write data/prepared/{task}/{split}.jsonl and its manifest."""
    from esrepro.io import write_json
    from esrepro.provenance import build_manifest, now
    from esrepro.tasks import prepare_task

    started = now()
    spec = args.spec
    prepared = prepare_task(args.task, args.out, spec["source"], spec["seed"])
    splits = prepared["splits"]
    out = Path(args.out)
    write_json(
        out / "manifest.json",
        build_manifest(
            "prepare_data",
            inputs={},
            settings={"task": args.task, **spec},
            started=started,
            outputs={f"{s}.jsonl": out / f"{s}.jsonl" for s in splits},
            extra={"splits": splits, "provenance": prepared["provenance"]},
        ),
    )


def cmd_build_tiny(args: argparse.Namespace) -> None:
    """Build the tiny model of a registry entry (tokenizer, Qwen2 LM, warm-start SFT)."""
    from esrepro.io import read_jsonl, write_json
    from esrepro.models.tiny import build_tiny
    from esrepro.provenance import build_manifest, now

    _set_threads(args.threads)
    started = now()
    exclude = [row for p in args.exclude for row in read_jsonl(p)]
    summary = build_tiny(args.spec["build"], exclude, args.out, data_source=args.data_spec["source"])
    write_json(
        Path(args.out) / "manifest.json",
        build_manifest(
            "build_tiny",
            inputs={f"excluded_{Path(p).stem}": p for p in args.exclude},
            settings={"model": args.model, **args.spec, "data": args.data_spec},
            started=started,
            outputs={"model": args.out},
            extra={"summary": summary},
        ),
    )
    print(json.dumps(summary, indent=2))


def cmd_fetch_model(args: argparse.Namespace) -> None:
    """Download a hub model at its registry revision into results/models/{model}/base."""
    from huggingface_hub import snapshot_download

    from esrepro.io import atomic_path, write_json
    from esrepro.provenance import build_manifest, now

    spec = args.spec
    if "hub_id" not in spec:
        raise SystemExit(f"model {args.model!r}: registry entry has no hub_id to fetch")
    started = now()
    with atomic_path(args.out, is_dir=True) as tmp:
        try:
            snapshot_download(spec["hub_id"], revision=spec["revision"], local_dir=tmp)
        except Exception as exc:  # hub errors come in many types; name the model
            raise SystemExit(f"model {args.model!r}: could not fetch {spec['hub_id']}@{spec['revision']}: {exc}")
    write_json(
        Path(args.out) / "manifest.json",
        build_manifest("fetch_model", {}, {"model": args.model, **spec}, started, outputs={"model": args.out}),
    )


def _load_examples(task, data_dir: str, split: str, limit: int | None) -> list[dict]:
    examples = task.load(split, data_dir)
    return examples[:limit] if limit else examples


def _named_paths(items: Sequence[str], flag: str, form: str) -> dict[str, str]:
    """``{name: path}`` from repeated ``NAME=PATH`` arguments; a malformed one names the flag."""
    out = {}
    for item in items:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"{flag} expects {form}, got {item!r}")
        out[name] = path
    return out


def cmd_train(args: argparse.Namespace) -> None:
    """Train one run (method x task x model x seed) into a run directory; dispatches on the settings' algorithm."""
    from esrepro.config import algorithm_of
    from esrepro.rl import RL_ALGORITHMS

    _set_threads(args.threads)
    algorithm = algorithm_of(args.method, args.spec)
    if algorithm == "es":
        _train_es(args)
    elif algorithm in RL_ALGORITHMS:
        _train_rl(args, algorithm)
    else:
        raise SystemExit(f"method {args.method!r}: unknown algorithm {algorithm!r} (es, grpo, dr_grpo, ppo)")


def _train_manifest(args: argparse.Namespace, run: Path, started: str, n_examples: int, extra: dict | None = None) -> None:
    from esrepro.io import write_json
    from esrepro.kl import snapshot_dirs
    from esrepro.provenance import build_manifest

    write_json(
        run / "manifest.json",
        build_manifest(
            "train",
            inputs={"base_model": args.model_dir, "train_data": Path(args.data_dir) / "train.jsonl"},
            settings={"method": args.method, "task": args.task, "model": args.model, "dtype": args.dtype,
                      "chat": args.chat, **args.spec},
            started=started,
            outputs={"checkpoint": run / "checkpoint", "log": run / "log.jsonl",
                     **{f"snapshot_{d.name}": d for _, d in snapshot_dirs(run)}},
            extra={"seed": args.seed, "train_examples": n_examples, **(extra or {})},
        ),
    )


def _train_es(args: argparse.Namespace) -> None:
    from esrepro.backends.hf import HFBackend
    from esrepro.es.loop import ESConfig, clear_state, run_es
    from esrepro.io import atomic_path, write_jsonl
    from esrepro.kl import SNAPSHOT_DIR, snapshot_dirs
    from esrepro.provenance import now
    from esrepro.rl.budget import es_sample_budget
    from esrepro.tasks import get_task

    spec = args.spec
    started = now()
    task = get_task(args.task, **spec.get("task_options", {}))
    examples = _load_examples(task, args.data_dir, "train", spec["train_examples"])
    backend = HFBackend(
        args.model_dir, dtype=args.dtype, batch_size=spec["batch_size"], chat=args.chat
    )
    cfg = ESConfig.from_settings(spec, seed=args.seed)
    run = Path(args.out)
    prompts = [task.prompt(e) for e in examples]

    def score(responses: list[str]) -> list[float]:
        return [task.score(r, e).reward for r, e in zip(responses, examples, strict=True)]

    save_every = spec.get("save_every")
    if not (run / "resume" / "state.json").exists():
        shutil.rmtree(run / SNAPSHOT_DIR, ignore_errors=True)  # a fresh start keeps no stale snapshots

    def keep_snapshot(row: dict) -> None:
        # weights after iteration row["iteration"]; the final weights go to checkpoint/ instead
        done = row["iteration"] + 1
        if save_every and done % save_every == 0 and done < cfg.iterations:
            with atomic_path(run / SNAPSHOT_DIR / f"iter{done:06d}", is_dir=True) as tmp:
                backend.save(tmp)

    log = run_es(backend, prompts, score, cfg, run / "resume", on_iteration=keep_snapshot)
    with atomic_path(run / "checkpoint", is_dir=True) as tmp:
        backend.save(tmp)
    write_jsonl(run / "log.jsonl", log)
    _train_manifest(args, run, started, len(examples), {"budget": {"sample_budget": es_sample_budget(spec)}})
    clear_state(run / "resume")


def _train_rl(args: argparse.Namespace, algorithm: str) -> None:
    """GRPO / Dr.GRPO (TRL) or PPO for as many steps as the ES sample budget allows."""
    from esrepro.io import atomic_path, write_jsonl
    from esrepro.kl import SNAPSHOT_DIR
    from esrepro.models.loading import save_checkpoint
    from esrepro.provenance import now
    from esrepro.rl.run import train_rl
    from esrepro.tasks import get_task

    started = now()
    spec = {**args.spec, "algorithm": algorithm}
    task = get_task(args.task, **spec.get("task_options", {}))
    examples = _load_examples(task, args.data_dir, "train", spec["train_examples"])
    run = Path(args.out)
    shutil.rmtree(run / SNAPSHOT_DIR, ignore_errors=True)  # RL runs do not resume: no stale snapshots
    model, tok, log, budget = train_rl(args.model_dir, task, examples, spec, seed=args.seed, dtype=args.dtype,
                                       chat=args.chat,
                                       snapshot_dir=run / SNAPSHOT_DIR if spec.get("save_every") else None)
    with atomic_path(run / "checkpoint", is_dir=True) as tmp:
        save_checkpoint(model, tok, tmp)
    write_jsonl(run / "log.jsonl", log)
    extra: dict = {"budget": budget.as_dict()}
    if algorithm in ("grpo", "dr_grpo"):
        import torch

        from esrepro.rl.grpo import cpu_overrides

        if not torch.cuda.is_available():
            extra["cpu_overrides"] = cpu_overrides(spec)
    _train_manifest(args, run, started, len(examples), extra)
    print(json.dumps({"method": args.method, **budget.as_dict(),
                      "final_reward_mean": log[-1]["reward_mean"] if log else None}))


def cmd_select(args: argparse.Namespace) -> None:
    """Keep the grid cell with the best training reward as the method's run (checkpoint, log, manifest)."""
    from esrepro.io import write_json
    from esrepro.provenance import build_manifest, now
    from esrepro.rl.select import select_run

    started = now()
    cells = _named_paths(args.cell, "--cell", "NAME=RUN_DIR")
    out = Path(args.out)
    record = select_run(cells, args.grid, out)
    inputs = {f"{c}_log": Path(d) / "log.jsonl" for c, d in cells.items()}
    inputs["winner_checkpoint"] = Path(cells[record["winner"]]) / "checkpoint"
    write_json(
        out / "manifest.json",
        build_manifest(
            "select", inputs=inputs,
            settings={"method": args.method, "task": args.task, "model": args.model, "grid": args.grid,
                      **record["settings"]},
            started=started,
            outputs={"checkpoint": out / "checkpoint", "log": out / "log.jsonl", "selection": out / "selection.json"},
            extra={"seed": args.seed, "winner": record["winner"], "train_reward": record["train_reward"],
                   "budget": record["budget"]},
        ),
    )
    print(json.dumps({k: record[k] for k in ("winner", "train_reward")}))


def cmd_table3(args: argparse.Namespace) -> None:
    """Write Table 3 (RL hyperparameter grid and the selected cell per model and method) as csv, md and tex."""
    from esrepro.config import load_registry
    from esrepro.provenance import now
    from esrepro.report.tables import build_table3

    started = now()
    registry = load_registry(args.registry)
    build_table3(args.selection, registry, args.out)
    _write_report_manifest("table3", args.out, (".csv", ".md", ".tex"), started,
                           inputs={p: p for p in args.selection} | {"registry": args.registry}, settings={})


def cmd_evaluate(args: argparse.Namespace) -> None:
    """Greedy evaluation of a checkpoint on a task split: metrics.json and responses.jsonl."""
    from esrepro.backends.hf import HFBackend
    from esrepro.evaluate import evaluate
    from esrepro.io import write_json, write_jsonl
    from esrepro.provenance import build_manifest, now
    from esrepro.tasks import get_task

    _set_threads(args.threads)
    started = now()
    spec = args.spec
    task = get_task(args.task, **spec.get("task_options", {}))
    examples = _load_examples(task, args.data_dir, spec["split"], spec["limit"])
    backend = HFBackend(args.model_dir, dtype=args.dtype, batch_size=spec["batch_size"], chat=args.chat,
                        max_prompt_tokens=spec.get("max_prompt_tokens"))
    result = evaluate(backend, task, examples, spec["max_new_tokens"], spec["batch_size"])
    result.metrics["truncated_prompts"] = backend.truncated
    out = Path(args.out)
    labels = {"task": args.task, "split": spec["split"], "model": args.model, "method": args.method, "seed": args.seed}
    write_jsonl(out / "responses.jsonl", result.responses)
    write_json(out / "metrics.json", {**labels, **result.metrics})
    write_json(
        out / "manifest.json",
        build_manifest(
            "evaluate",
            inputs={"model": args.model_dir, "data": Path(args.data_dir) / f"{spec['split']}.jsonl"},
            settings={**labels, **spec, "dtype": args.dtype, "chat": args.chat},
            started=started,
            outputs={"metrics": out / "metrics.json", "responses": out / "responses.jsonl"},
        ),
    )
    print(json.dumps({**labels, **result.metrics}))


def cmd_kl(args: argparse.Namespace) -> None:
    """KL(fine-tuned || base) of a run's final weights and kept snapshots, with their greedy reward."""
    from esrepro.io import read_json, read_jsonl, write_json, write_jsonl
    from esrepro.kl import ESTIMATORS, KLSettings, measure_checkpoint, snapshot_dirs
    from esrepro.models.loading import load_model
    from esrepro.provenance import build_manifest, now
    from esrepro.tasks import get_task

    _set_threads(args.threads)
    started = now()
    spec = args.spec
    task = get_task(args.task, **spec.get("task_options", {}))
    examples = _load_examples(task, args.data_dir, spec["split"], spec.get("limit"))
    settings = KLSettings.from_settings(spec)
    base = load_model(args.base_dir, dtype=args.dtype)
    run = Path(args.run_dir) if args.run_dir else None
    run_settings = read_json(run / "manifest.json")["settings"] if run else {}
    algorithm = run_settings.get("algorithm", args.method) if run else "base"
    final_iteration = len(read_jsonl(run / "log.jsonl")) if run and (run / "log.jsonl").exists() else 0
    points = [(it, d) for it, d in (snapshot_dirs(run) if run else []) if it < final_iteration]
    points.append((final_iteration, Path(args.model_dir)))

    checkpoints, final = [], None
    for it, path in points:
        res = measure_checkpoint(path, base, task, examples, settings, dtype=args.dtype, chat=args.chat,
                                 eval_max_new_tokens=spec.get("eval_max_new_tokens"), progress=True)
        keep = ("reward", "accuracy", "reward_sampled", "mean_tokens",
                *ESTIMATORS, *(f"{k}_se" for k in ESTIMATORS), *(f"{k}_per_token" for k in ESTIMATORS))
        checkpoints.append({"iteration": it, **{k: res["summary"][k] for k in keep}})
        print(json.dumps(checkpoints[-1]), flush=True)
        final = res
    assert final is not None
    labels = {"task": args.task, "split": spec["split"], "model": args.model, "method": args.method,
              "seed": args.seed}
    hyper = {k: run_settings[k] for k in ("sigma", "alpha", "beta", "learning_rate") if k in run_settings}
    out = Path(args.out)
    write_jsonl(out / "samples.jsonl", final["responses"])
    write_json(out / "kl.json", {
        **labels, "algorithm": algorithm, "hyper": hyper, "iteration": final_iteration,
        **{k: v for k, v in final["summary"].items() if k != "settings"},
        "settings": final["summary"]["settings"],
        "estimator_note": "per-sequence sums over response tokens (EOS included), mean over responses, "
                          "then over prompts; *_se: standard error over all responses",
        "prompts": final["prompts"], "greedy": final["eval"], "checkpoints": checkpoints,
    })
    inputs = {"model": args.model_dir, "base_model": args.base_dir,
              "data": Path(args.data_dir) / f"{spec['split']}.jsonl"}
    if run:
        inputs["run_manifest"] = run / "manifest.json"
        inputs.update({f"snapshot_iter{it}": p for it, p in points[:-1]})
    write_json(out / "manifest.json", build_manifest(
        "kl", inputs=inputs, settings={**labels, **spec, "dtype": args.dtype, "chat": args.chat},
        started=started, outputs={"kl": out / "kl.json", "samples": out / "samples.jsonl"},
    ))


def cmd_table1(args: argparse.Namespace) -> None:
    """Write Table 1 (Countdown accuracy, ours beside the paper's) as csv, md and tex."""
    from esrepro.config import load_registry
    from esrepro.provenance import now
    from esrepro.report.tables import build_table1

    started = now()
    registry = load_registry(args.registry)
    models = {k: registry[k] for k in args.models}
    build_table1(args.metrics, args.published, models, args.out, notes=args.note, task=args.task, split=args.split,
                 include=args.models)
    _write_report_manifest(
        "table1", args.out, (".csv", ".md", ".tex", ".metrics.json"), started,
        inputs={**{m: m for m in args.metrics}, "published": args.published, "registry": args.registry},
        settings={"task": args.task, "split": args.split, "models": args.models, "notes": args.note},
    )


def cmd_curves(args: argparse.Namespace) -> None:
    """Plot training reward per iteration for each labelled log.jsonl (png and pdf)."""
    from esrepro.provenance import now
    from esrepro.report.figures import build_countdown_curves

    started = now()
    logs = _named_paths(args.log, "--log", "LABEL=PATH")
    build_countdown_curves(logs, args.out)
    _write_report_manifest("curves", args.out, (".png", ".pdf", ".csv"), started, inputs={p: p for p in logs.values()},
                           settings={"labels": list(logs)})


def cmd_report_notebook(args: argparse.Namespace) -> None:
    """Execute the analysis notebook (papermill) and render it to HTML."""
    from esrepro.report.notebook import main_report_notebook

    main_report_notebook(args.notebook, args.out_ipynb, args.out_html, args.tables_dir, args.figures_dir,
                         args.eval_dir, args.published, args.registry, timeout=args.timeout, show_code=args.show_code)


def cmd_eval_summary(args: argparse.Namespace) -> None:
    """Write {task: {model: {method: accuracy_percent}}} of evaluation metrics (for dvc metrics)."""
    from esrepro.report.notebook import main_eval_summary

    main_eval_summary(args.metrics, args.out)


def cmd_ro_crate(args: argparse.Namespace) -> None:
    """Write a Workflow Run RO-Crate of the run."""
    from esrepro.rocrate_export import main_ro_crate

    main_ro_crate(args.out, args.workflow, args.configs, args.inputs, args.outputs, args.manifests,
                  copy_max_bytes=args.copy_max_bytes)


def cmd_dvc_record(args: argparse.Namespace) -> None:
    """Record data and checkpoint folders with DVC (dvc add); optionally dvc push."""
    from esrepro.dvc_record import main_dvc_record

    main_dvc_record(args.paths, args.out, push_to=args.remote, do_push=args.push)


def _cutoff(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "") else float(text)


def cmd_table2(args: argparse.Namespace) -> None:
    """Write Table 2 (conciseness: reward and KL per configuration, mean ± std over seeds)."""
    from esrepro.config import load_registry
    from esrepro.provenance import now
    from esrepro.report.conciseness import build_table2, load_kl

    started = now()
    registry = load_registry(args.registry)
    models = sorted(set(load_kl(args.kl)["model"]))
    display = ", ".join(registry.get(m, {}).get("display", m) for m in models)
    build_table2(args.kl, args.out, args.reward_cutoff, notes=args.note, model_display=display)
    _write_report_manifest(
        "table2", args.out, (".csv", ".md", ".tex"), started,
        inputs={**{p: p for p in args.kl}, "registry": args.registry},
        settings={"reward_cutoff": args.reward_cutoff, "notes": args.note},
    )


def cmd_pareto(args: argparse.Namespace) -> None:
    """Plot reward against KL to the base model with each method's Pareto front (png and pdf)."""
    from esrepro.provenance import now
    from esrepro.report.figures import pareto_figure

    started = now()
    pareto_figure(args.kl, args.out, kl=args.estimator)
    _write_report_manifest("pareto", args.out, (".png", ".pdf"), started, inputs={p: p for p in args.kl},
                           settings={"estimator": args.estimator})


def cmd_reward_distribution(args: argparse.Namespace) -> None:
    """Plot the per-response reward distributions of base, ES and GRPO models (png and pdf)."""
    from esrepro.provenance import now
    from esrepro.report.figures import reward_distribution_figure

    started = now()
    reward_distribution_figure(args.kl, args.out)
    samples = [str(Path(p).with_name("samples.jsonl")) for p in args.kl]
    _write_report_manifest("reward_distribution", args.out, (".png", ".pdf"), started,
                           inputs={p: p for p in [*args.kl, *samples]}, settings={})


def _write_report_manifest(kind: str, stem: str, exts: tuple[str, ...], started: str, inputs: dict, settings: dict) -> None:
    """``{stem}.manifest.json`` beside a table's or figure's files: what they were made from."""
    from esrepro.io import write_json
    from esrepro.provenance import build_manifest

    outputs = {f"{Path(stem).name}{e}": f"{stem}{e}" for e in exts}
    write_json(f"{stem}.manifest.json", build_manifest(kind, inputs, settings, started, outputs=outputs))


def cmd_audit(args: argparse.Namespace) -> int:
    """Walk back from a result to its data, model, config and code, re-hashing every file."""
    from esrepro.audit import main_audit

    return main_audit(args.target, root=args.root)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    p = argparse.ArgumentParser(prog="esrepro", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)

    v = sub.add_parser("validate", help=cmd_validate.__doc__)
    v.add_argument("configs", nargs="+")
    v.set_defaults(func=cmd_validate)

    d = sub.add_parser("prepare-data", help=cmd_prepare_data.__doc__)
    d.add_argument("--task", required=True)
    d.add_argument("--spec", type=_json, required=True, help="the config's data.<task> block as JSON")
    d.add_argument("--out", required=True)
    d.set_defaults(func=cmd_prepare_data)

    b = sub.add_parser("build-tiny", help=cmd_build_tiny.__doc__)
    b.add_argument("--model", required=True)
    b.add_argument("--spec", type=_json, required=True, help="the registry entry as JSON")
    b.add_argument("--data-spec", type=_json, default={"source": {}}, help="the config's data.<sft task> block as JSON")
    b.add_argument("--exclude", nargs="*", default=[], help="prepared jsonl files whose problems SFT must not see")
    b.add_argument("--out", required=True)
    b.add_argument("--threads", type=int, default=1)
    b.set_defaults(func=cmd_build_tiny)

    f = sub.add_parser("fetch-model", help=cmd_fetch_model.__doc__)
    f.add_argument("--model", required=True)
    f.add_argument("--spec", type=_json, required=True, help="the registry entry as JSON")
    f.add_argument("--out", required=True)
    f.set_defaults(func=cmd_fetch_model)

    for name, func in (("train", cmd_train), ("evaluate", cmd_evaluate)):
        t = sub.add_parser(name, help=func.__doc__)
        t.add_argument("--task", required=True)
        t.add_argument("--model", required=True, help="registry key (a label in outputs)")
        t.add_argument("--model-dir", required=True)
        t.add_argument("--dtype", default="float32")
        t.add_argument("--data-dir", required=True)
        t.add_argument("--spec", type=_json, required=True)
        t.add_argument("--method", required=True)
        t.add_argument("--seed", type=int, default=0)
        t.add_argument("--out", required=True)
        t.add_argument("--threads", type=int, default=1)
        t.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
        t.set_defaults(func=func)

    k = sub.add_parser("kl", help=cmd_kl.__doc__)
    k.add_argument("--task", required=True)
    k.add_argument("--model", required=True, help="registry key (a label in outputs)")
    k.add_argument("--method", required=True, help="method name (a label; base for the base model)")
    k.add_argument("--seed", type=int, default=0, help="the run's seed (a label)")
    k.add_argument("--model-dir", required=True, help="the fine-tuned weights (the base model for method base)")
    k.add_argument("--base-dir", required=True, help="the base model KL is measured against")
    k.add_argument("--run-dir", default=None, help="the run directory: its manifest, log and kept snapshots")
    k.add_argument("--dtype", default="float32")
    k.add_argument("--data-dir", required=True)
    k.add_argument("--spec", type=_json, required=True, help="the config's kl.<task> block as JSON")
    k.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    k.add_argument("--out", required=True)
    k.add_argument("--threads", type=int, default=1)
    k.set_defaults(func=cmd_kl)

    r = sub.add_parser("table1", help=cmd_table1.__doc__)
    r.add_argument("--metrics", nargs="+", required=True)
    r.add_argument("--published", required=True)
    r.add_argument("--registry", required=True)
    r.add_argument("--models", nargs="+", required=True)
    r.add_argument("--task", default="countdown")
    r.add_argument("--split", default="test")
    r.add_argument("--note", action="append", default=[])
    r.add_argument("--out", required=True, help="output path without extension")
    r.set_defaults(func=cmd_table1)

    sel = sub.add_parser("select", help=cmd_select.__doc__)
    sel.add_argument("--task", required=True)
    sel.add_argument("--model", required=True)
    sel.add_argument("--method", required=True)
    sel.add_argument("--seed", type=int, default=0)
    sel.add_argument("--grid", type=_json, required=True, help="the registry grid as JSON ({} for none)")
    sel.add_argument("--cell", action="append", required=True, help="NAME=RUN_DIR of one grid cell's run")
    sel.add_argument("--out", required=True)
    sel.set_defaults(func=cmd_select)

    t3 = sub.add_parser("table3", help=cmd_table3.__doc__)
    t3.add_argument("--selection", nargs="+", required=True, help="selection.json of each RL run")
    t3.add_argument("--registry", required=True)
    t3.add_argument("--out", required=True, help="output path without extension")
    t3.set_defaults(func=cmd_table3)

    c = sub.add_parser("curves", help=cmd_curves.__doc__)
    c.add_argument("--log", action="append", required=True, help="LABEL=PATH of a log.jsonl")
    c.add_argument("--out", required=True, help="output path without extension")
    c.set_defaults(func=cmd_curves)

    t2 = sub.add_parser("table2", help=cmd_table2.__doc__)
    t2.add_argument("--kl", nargs="+", required=True, help="kl.json of the base model and every run")
    t2.add_argument("--registry", required=True)
    t2.add_argument("--reward-cutoff", type=_cutoff, default=None, help="keep configurations with mean reward >= this")
    t2.add_argument("--note", action="append", default=[])
    t2.add_argument("--out", required=True, help="output path without extension")
    t2.set_defaults(func=cmd_table2)

    pf = sub.add_parser("pareto", help=cmd_pareto.__doc__)
    pf.add_argument("--kl", nargs="+", required=True)
    pf.add_argument("--estimator", default="exact", choices=["exact", "k1", "k3"])
    pf.add_argument("--out", required=True, help="output path without extension")
    pf.set_defaults(func=cmd_pareto)

    rd = sub.add_parser("reward-distribution", help=cmd_reward_distribution.__doc__)
    rd.add_argument("--kl", nargs="+", required=True, help="kl.json files (samples.jsonl beside each)")
    rd.add_argument("--out", required=True, help="output path without extension")
    rd.set_defaults(func=cmd_reward_distribution)

    a = sub.add_parser("audit", help=cmd_audit.__doc__)
    a.add_argument("target", help="a table, figure or any recorded output")
    a.add_argument("--root", default=".", help="the pipeline's working directory")
    a.set_defaults(func=cmd_audit)
    n = sub.add_parser("report-notebook", help=cmd_report_notebook.__doc__)
    n.add_argument("--notebook", required=True, help="the papermill notebook (workflow/notebooks/analysis.ipynb)")
    n.add_argument("--tables-dir", required=True)
    n.add_argument("--figures-dir", required=True)
    n.add_argument("--eval-dir", required=True)
    n.add_argument("--published", required=True)
    n.add_argument("--registry", required=True)
    n.add_argument("--out-ipynb", required=True)
    n.add_argument("--out-html", required=True)
    n.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    n.add_argument("--show-code", action="store_true", help="keep the code cells in the HTML")
    n.set_defaults(func=cmd_report_notebook)

    e = sub.add_parser("eval-summary", help=cmd_eval_summary.__doc__)
    e.add_argument("--metrics", nargs="+", required=True)
    e.add_argument("--out", required=True)
    e.set_defaults(func=cmd_eval_summary)

    o = sub.add_parser("ro-crate", help=cmd_ro_crate.__doc__)
    o.add_argument("--out", required=True, help="crate folder (replaced)")
    o.add_argument("--workflow", nargs="+", required=True, help="the main Snakefile first, then the files it reads")
    o.add_argument("--configs", nargs="*", default=[])
    o.add_argument("--inputs", nargs="*", default=[], help="datasets and base models (the run's object)")
    o.add_argument("--outputs", nargs="*", default=[], help="checkpoints, metrics, tables, figures, reports (result)")
    o.add_argument("--manifests", nargs="*", default=[])
    o.add_argument("--copy-max-bytes", type=int, default=20_000_000, help="larger files are referenced, not copied")
    o.set_defaults(func=cmd_ro_crate)

    k = sub.add_parser("dvc-record", help=cmd_dvc_record.__doc__)
    k.add_argument("--paths", nargs="+", required=True, help="folders to track (one .dvc file each)")
    k.add_argument("--out", required=True, help="JSON summary of what was recorded")
    k.add_argument("--push", action="store_true", help="dvc push to the default remote afterwards")
    k.add_argument("--remote", default=None, help="dvc push to this remote afterwards")
    k.set_defaults(func=cmd_dvc_record)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``esrepro`` console script."""
    from esrepro.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except (ConfigError, FileNotFoundError, KeyError, ValueError) as exc:
        print(f"esrepro {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
