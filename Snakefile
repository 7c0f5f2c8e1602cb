# esrepro: one command regenerates the papers' tables and figures.
#   snakemake --cores 2                                   the embedded tiny default (config/config.yaml)
#   snakemake --profile workflow/profiles/slurm --configfile config/paper.yaml
# Logic lives in src/esrepro (the `esrepro` command); these files only wire paths.

import copy

from esrepro.config import check_config
from esrepro.workflow import Plan

configfile: "config/config.yaml"

report: "workflow/report/workflow.rst"

# A --configfile on the command line replaces config/config.yaml instead of being
# merged into it, so no tiny setting leaks into a paper run (--config still overrides).
if workflow.config_settings.configfiles:
    config.clear()
    config.update(copy.deepcopy(workflow.config_settings.overwrite_config))
    CONFIG_SOURCE = " + ".join(str(p) for p in workflow.config_settings.configfiles)
else:
    CONFIG_SOURCE = "config/config.yaml"

# Validate config and registry against their schemas before any job starts.
REGISTRY = check_config(config, CONFIG_SOURCE)
PLAN = Plan(config, REGISTRY)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/kl.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/conciseness.smk"
include: "workflow/rules/provenance.smk"


rule all:
    default_target: True
    input:
        PLAN.final_targets(),
        "results/reports/analysis.html",
        "results/reports/eval_summary.metrics.json",
        "results/ro-crate/ro-crate-metadata.json",
