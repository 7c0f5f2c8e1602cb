# Shared wildcard constraints and helpers for every rule file.

wildcard_constraints:
    task=r"[a-z0-9_]+",
    model=r"[A-Za-z0-9._-]+",
    method=r"[a-z0-9_.]+",
    seed=r"\d+",
    split=r"[a-z0-9_]+",
    cell=r"[A-Za-z0-9._+-]+",


import os
import shlex

ENV = "../envs/esrepro.yaml"  # relative to this rules folder


def resources_of(rule_name):
    """Snakemake resources of a rule, from each model's registry entry (keys every configured model sets)."""
    keys = [k for k in cluster.RESOURCES
            if all(getattr(PIPELINE.resources(m, rule_name), k) is not None for m in PIPELINE.all_models())]
    return {k: (lambda wildcards, k=k: getattr(PIPELINE.resources(wildcards.model, rule_name), k)) for k in keys}


def timed_resources_of(rule_name, snakemake_rule):
    """:func:`resources_of`, with the runtime of ``snakemake_rule``'s jobs from their estimate (the registry's
    runtime as its ceiling; esrepro.planning.job_time.timed_step)."""
    res = resources_of(rule_name)
    if "runtime" in res:
        res["runtime"] = lambda wildcards: job_time.timed_step(PIPELINE, snakemake_rule, dict(wildcards.items())).runtime
    return res


def threads_of(rule_name):
    """CPU threads of a rule's jobs: the registry resources' cpus_per_task (or cpus_per_gpu x gpu)."""
    return lambda wildcards: PIPELINE.resources(wildcards.model, rule_name).threads()


def rl_settings(wildcards):
    """An RL job's method settings (a grid cell's where the job has one): its per-step batch sets its processes."""
    return specs.method_spec(PIPELINE, wildcards.model, wildcards.task, wildcards.method,
                             getattr(wildcards, "cell", None))


def dtype_of(wildcards):
    return PIPELINE.model(wildcards.model).dtype


def chat_flag(wildcards):
    return "--chat" if PIPELINE.model(wildcards.model).chat_template else ""


def stem_of(wildcards, output):
    """The path stem of a table's or figure's files (its first output without the extension)."""
    return os.path.splitext(output[0])[0]


def folder_of_manifest(wildcards, output):
    """A step's output folder (run, evaluation, KL): where its manifest goes."""
    return os.path.dirname(output.manifest)


def note_args(notes):
    """--note arguments, shell-quoted."""
    return " ".join(f"--note {shlex.quote(n)}" for n in notes)


def flag_args(flag, items):
    """``flag item`` for each item, shell-quoted (a repeated flag, e.g. --set A=B --set C=D)."""
    return " ".join(f"{flag} {shlex.quote(str(i))}" for i in items)


def pinned_arg(model):
    """``--pinned JSON`` of a built model with a pinned build (registry ``pinned``), shell-quoted; else nothing."""
    pinned = specs.pinned_spec(PIPELINE, model)
    return "" if pinned is None else f"--pinned {shlex.quote(specs.as_json(pinned))}"


# Pre-flight (esrepro.planning.preflight): what the jobs will need that the machines lack (hub access offline, a token for
# a gated model, packages an engine or setting needs in the jobs' environment). A dry run prints it as warnings;
# a real run stops at its start (the Snakefile's onstart, in the main process of a real run only), before any job,
# on the problems of the jobs it is about to run. Jobs re-read these files: they check nothing.
import sys

from snakemake.exceptions import WorkflowError

from esrepro.planning import preflight

if workflow.is_main_process and workflow.output_settings.dryrun:
    PREFLIGHT = preflight.problems(PIPELINE, PLAN)
    if PREFLIGHT:
        print(preflight.report(PREFLIGHT, dry_run=True), file=sys.stderr)


def preflight_check():
    """Stop a real run before its first job when a job it is about to run would fail for want of something."""
    executor = workflow.executor_plugin.name if workflow.executor_plugin is not None else None
    jobs = [(j.rule.name, j.wildcards.get("model", j.wildcards.get("task"))) for j in workflow.dag.needrun_jobs()]
    found = preflight.problems(PIPELINE, PLAN, executor=executor, jobs=jobs)
    if found:
        raise WorkflowError(preflight.report(found, dry_run=False))
