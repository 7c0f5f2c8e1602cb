"""The notes printed under tables: what the config says of their runs (data provenance, settings, sample budgets),
in words.

Above the pricing room (a run's settings as its job runs them: :func:`esrepro.planning.resume_cost.job_settings`);
the report's rules read it."""

from __future__ import annotations

from esrepro.pipeline import Pipeline
from esrepro.planning.resume_cost import job_settings
from esrepro.rl.budget import es_sample_budget, rl_budget, samples_per_step
from esrepro.settings.methods import with_former_names


def table1_notes(p: Pipeline) -> list[str]:
    """Table 1's notes: scale and data source, the ES settings, the RL budgets and the seeds."""
    task = p.cfg.report.table1.task
    source = p.cfg.data[task].source.kind
    notes = [f"Scale: {p.cfg.scale}; {task} data source: {source}"
             + (" (not the paper's data)" if source == "generated" else "")]
    model = p.models[0]
    rl = []
    for method in p.train_methods(task):
        if p.is_es_variant(task, method):  # beside ES in its own table (es_variants), not Table 1's
            continue
        s = p.method_settings(model, task, method).as_dict()
        if not p.is_rl(task, method):
            notes.append(
                f"{method.upper()}: N={s['population']}, sigma={s['sigma']}, alpha={s['alpha']}, {s['iterations']} "
                f"iterations, {s['train_examples']} training examples, greedy, noise={s['noise']}, "
                f"restore={s['restore']}; sample budget {s['iterations']} x {s['population']} x {s['train_examples']} "
                f"= {es_sample_budget(s):,} scored training samples")
            continue
        budgets = {rl_budget(p.method_settings(m, task, method).sample_budget,
                             samples_per_step(p.method_settings(m, task, method).as_dict())) for m in p.models}
        b = min(budgets, key=lambda x: x.steps)
        per_model = "" if len(budgets) == 1 else " (first model; see manifests)"
        rl.append(f"{method} ({p.algorithm_of(task, method).name}): {b.steps:,} steps x {b.samples_per_step} = "
                  f"{b.samples_used:,}{per_model}")
    if rl:
        notes.append("Equal sample budgets: each RL method runs floor(ES budget / samples per step) steps; "
                     + "; ".join(rl) + ". RL hyperparameters: best cell of each model's grid by training reward "
                     "(Table 3).")
    extra = {x for m in p.train_models(task) for meth in p.train_methods(task) for x in p.claims_seeds(task, m, meth)}
    notes.append(f"Seeds: {sorted(set(p.seeds) | extra)} (mean over seeds; base model evaluated once)")
    return notes


def table2_notes(p: Pipeline) -> list[str]:
    """Table 2's notes: scale, model, seeds, the sweeps' settings and how KL was measured."""
    study = p.studies()["conciseness"]
    model = study.models[0]  # a study has one model (settings.pipeline.Study)
    kl = p.kl_settings(study.task)
    notes = [f"Scale: {p.cfg.scale}; model: {p.model(model).display}; seeds: {study.seeds}; weights kept "
             f"every {study.keep_every} iterations."]
    methods = p.study_methods("conciseness")
    first = {algo: next((m for m, s in methods.items() if s.algorithm == algo), None) for algo in ("es", "grpo")}
    if first["es"]:
        es = p.method_settings(model, study.task, first["es"]).as_dict()
        alphas = ", ".join(f"{p.method_settings(model, study.task, m).alpha:g} at sigma {s.swept['sigma']:g}"
                           for m, s in methods.items() if s.algorithm == "es")
        ratio = study.es.alpha_over_sigma if study.es is not None else None
        notes.append(f"ES: N={es['population']}, alpha " + (f"= {ratio:g} x sigma " if ratio is not None else "")
                     + f"({alphas}), {es['iterations']} iterations, {es['max_new_tokens']} new tokens, greedy.")
    if first["grpo"]:
        g = job_settings(p, model, study.task, first["grpo"]).as_dict()  # as the job runs: resume_every priced
        shown = {k: v for k, v in with_former_names(g["algorithm"], g).items()  # the names this note has shown
                 if k not in ("beta", "keep_every", "algorithm") and v is not None and not isinstance(v, (dict, list))}
        notes.append("GRPO: " + ", ".join(f"{k}={shown[k]}" for k in sorted(shown)) + ".")
    notes.append(f"KL(fine-tuned || base): {kl.n_samples} responses sampled per {kl.split} prompt (temperature "
                 f"{kl.temperature}, up to {kl.max_new_tokens} tokens), per-sequence sums of per-token estimates, "
                 "mean over responses and prompts.")
    return notes


def task_table_notes(p: Pipeline, eval_tasks: list[str]) -> list[str]:
    """Notes of a per-task table (math, puzzles, stability): scale, each test set's data source, how each training task's
    runs were trained (ES settings, RL budgets) and the seeds."""
    notes = [f"Scale: {p.cfg.scale}" + (" (tiny numbers: a 1M-parameter model on generated data, not the paper's)"
                                         if p.cfg.scale == "tiny" else "")]
    sources = []
    for task in eval_tasks:
        kind = p.cfg.data[task].source.kind if task in p.cfg.data else "?"
        sources.append(f"{task}: {kind}" + (" (embedded, not the paper's data)" if kind == "generated" else ""))
    if sources:
        notes.append("Test data: " + "; ".join(sources))
    for train_task in dict.fromkeys(p.train_task_of(t) for t in eval_tasks):
        if train_task not in p.cfg.train:
            continue
        model = p.train_models(train_task)[0]
        parts = []
        for method in p.train_methods(train_task):
            s = p.method_settings(model, train_task, method).as_dict()
            if not p.is_rl(train_task, method):
                per = s.get("prompts_per_iteration") or s["train_examples"]
                name = method.upper() if s["algorithm"] == "es" else f"{method} ({s['algorithm']}, rank {s['rank']})"
                parts.append(f"{name} N={s['population']}, sigma={s['sigma']}, alpha={s['alpha']}, "
                             f"{s['iterations']} iterations x {per} prompts of {s['train_examples']}, "
                             f"{s['max_new_tokens']} new tokens ({es_sample_budget(s):,} samples)")
            else:
                b = rl_budget(s["sample_budget"], samples_per_step(s))
                parts.append(f"{method} ({p.algorithm_of(train_task, method).name}): {b.steps:,} steps x "
                             f"{b.samples_per_step} = {b.samples_used:,} samples")
        notes.append(f"Trained on {train_task} ({p.model(model).display}"
                     + (" and others" if len(p.train_models(train_task)) > 1 else "") + "): " + "; ".join(parts))
    st = p.cfg.stability
    seeds = sorted(set(p.seeds) | {x for m in (st.methods if st is not None else []) for x in st.seeds_of_method(m)})
    notes.append(f"Seeds: {seeds} (mean over seeds; base models evaluated once)")
    return notes
