# esrepro: one command regenerates the papers' tables and figures.
#   snakemake --profile workflow/profiles/default             the embedded tiny default (config/config.yaml)
#   snakemake --profile workflow/profiles/slurm --configfile config/paper.yaml
# Logic lives in src/esrepro (the `esrepro` command); these files only wire paths.

import sys

from esrepro.planning import cluster, job_time, preflight, specs
from esrepro import paths as P
from esrepro.planning.claim_plan import ClaimPlan
from esrepro.config import config_files, workflow_config
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import Plan

report: "workflow/report/workflow.rst"

# config/config.yaml, or the --configfile files instead of it (replacing, not merging, so no
# tiny setting leaks into a paper run), read strictly; --config key=value still overrides.
RAW_CONFIG, CONFIG_SOURCE = workflow_config(workflow.config_settings.configfiles, workflow.config_settings.config)
config.clear()
config.update(RAW_CONFIG)

# Everything a job will read (config, registry, published numbers, data sizes) is checked
# here, before any job starts.
PIPELINE = load_pipeline(config, CONFIG_SOURCE)
PLAN = Plan(PIPELINE)
# Tiny scale on a machine where a task's grader cannot run (ARC's program sandbox): that task's training and
# evaluations are left out, every other table is written, its cells say "not run" and the run starts and ends
# with a warning naming the fix. A paper-scale run leaves nothing out: its pre-flight stops it instead.
NOT_RUN = preflight.unrunnable_tasks(PIPELINE, PLAN)
if NOT_RUN:
    PIPELINE = preflight.without_tasks(PIPELINE, NOT_RUN)
    PLAN = Plan(PIPELINE)
    if workflow.is_main_process and workflow.output_settings.dryrun:
        print(preflight.not_run_warning(NOT_RUN), file=sys.stderr)
CLAIMS = ClaimPlan(PLAN)  # each claim's rows, the files they read and their targets
CFG = PIPELINE.cfg
R = PLAN.paths  # this config's data and results templates (under its workspace, if it has one)
# Tiny scale: every job pins its CPU kernels to ones every x86-64 CPU has (esrepro.runtime.numerics).
from esrepro.runtime import numerics
numerics.set_scale(CFG.scale)
config.update(CFG.model_dump(mode="json"))  # the report's captions see every setting, defaults included


# A local tiny run forks its jobs from one interpreter that has torch and transformers loaded, instead
# of each job loading them (esrepro.runtime.forkserver: about 5 s of CPU per job); cluster jobs start their own.
from esrepro.runtime import forkserver
from snakemake.logging import logger


onstart:
    # what the jobs will need that the machines lack stops the run here, before any job (workflow/rules/common.smk)
    preflight_check()
    if NOT_RUN:
        logger.warning(preflight.not_run_warning(NOT_RUN))
    if workflow.local_exec and CFG.scale == "tiny":
        forkserver.start(f"{R.LOGS}/forkserver.log")


# the server's counts end its log; Snakemake's log names them when more than a few jobs were declined
onsuccess:
    forkserver.stop(warn=logger.warning)
    if NOT_RUN:
        logger.warning(preflight.not_run_warning(NOT_RUN))


onerror:
    forkserver.stop(warn=logger.warning)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/kl.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/provenance.smk"


rule all:
    default_target: True
    input:
        PLAN.final_targets(),
        f"{R.ANALYSIS}.html",
        R.EVAL_SUMMARY,
        f"{R.CRATE}/ro-crate-metadata.json",
        # Every step's own outputs too, not only the final products: Snakemake does not redo a missing
        # intermediate once what depends on it is up to date, so a forced rerun killed after it deleted a
        # step's outputs is redone by the next plain run only because they are targets here.
        PLAN.datasets(),
        PLAN.model_dirs(),
        [m for m in PLAN.manifests() if not m.startswith((R.under("data/prepared/"), R.under("results/models/")))],
