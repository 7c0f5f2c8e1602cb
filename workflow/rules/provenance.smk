# Provenance: the analysis notebook (papermill -> ipynb + html), a Workflow Run RO-Crate of
# the run, the headline metrics for `dvc metrics show`, and the DVC record of the data and
# checkpoints (not in `all`: `snakemake --cores 1 dvc_record`, then `git add *.dvc` + `dvc push`).

import os
from pathlib import Path

from esrepro.provenance.dvc import DEFAULT_PATHS as DVC_PATHS
from esrepro.report.notebook import folder_of

# What the crate calls the workflow: the main Snakefile first, then everything it reads.
WORKFLOW_FILES = [
    "Snakefile",
    *sorted(str(p) for p in Path("workflow/rules").glob("*.smk")),
    *sorted(str(p) for p in Path("workflow/schemas").glob("*.*")),
    "workflow/envs/esrepro.yaml",
    "workflow/profiles/default/config.yaml",
    "workflow/notebooks/analysis.ipynb",
    *sorted(str(p) for p in Path("workflow/report").glob("*.rst")),
    "dvc.yaml",
    "pyproject.toml",
]
CONFIG_FILES = [*config_files(workflow.config_settings.configfiles), CFG.registry, CFG.published]
# Each training run as the train rule declares it: checkpoint folder and per-iteration log.
RUN_FILES = [f"{run}/{name}" for run in PLAN.run_dirs() for name in (P.CHECKPOINT, P.TRAIN_LOG)]
REPORT_FILES = [f"{R.ANALYSIS}.ipynb", f"{R.ANALYSIS}.html"]
EVAL_SUMMARY = R.EVAL_SUMMARY


rule eval_summary:
    input:
        PLAN.eval_metrics(),
    output:
        EVAL_SUMMARY,
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/provenance/eval_summary.log",
    shell:
        "esrepro eval-summary --metrics {input:q} --out {output} > {log} 2>&1"


rule report_notebook:
    input:
        notebook="workflow/notebooks/analysis.ipynb",
        tables=[p for p in PLAN.report_files() if p.startswith(R.TABLES)],
        figures=[p for p in PLAN.report_files() if p.startswith(R.FIGURES)],
        metrics=PLAN.eval_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        ipynb=REPORT_FILES[0],
        html=report(REPORT_FILES[1], caption="../report/analysis.rst", category="Report"),
    params:
        tables=folder_of("tables", R.TABLES),
        figures=folder_of("figures", R.FIGURES),
        eval=folder_of("metrics", R.under("results/eval")),
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/provenance/report_notebook.log",
    shell:
        "esrepro report-notebook --notebook {input.notebook} --tables-dir {params.tables} "
        "--figures-dir {params.figures} --eval-dir {params.eval} --published {input.published} "
        "--registry {input.registry} --out-ipynb {output.ipynb} --out-html {output.html} > {log} 2>&1"


rule ro_crate:
    input:
        workflow=WORKFLOW_FILES,
        config_files=CONFIG_FILES,
        datasets=PLAN.datasets(),
        models=PLAN.model_dirs(),
        runs=RUN_FILES,
        results=[*PLAN.report_files(), *PLAN.eval_metrics(), EVAL_SUMMARY, *REPORT_FILES],
        # Manifests that are declared outputs (tables', figures', runs', evaluations');
        # those inside data and model folders come with their folder.
        manifests=[m for m in PLAN.manifests()
                   if not m.startswith((R.under("data/prepared/"), R.under("results/models/")))],
    output:
        f"{R.CRATE}/ro-crate-metadata.json",
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
        manifests=PLAN.manifests(),
        headline=lambda w: f"{R.CLAIMS}.csv",
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/provenance/ro_crate.log",
    shell:
        "esrepro ro-crate --out {params.out} --workflow {input.workflow:q} --config-files {input.config_files:q} "
        "--inputs {input.datasets:q} {input.models:q} --outputs {input.runs:q} {input.results:q} "
        "--manifests {params.manifests:q} --headline {params.headline} > {log} 2>&1"


rule dvc_record:
    input:
        rules.ro_crate.output,
        PLAN.datasets(),
        PLAN.model_dirs(),
        RUN_FILES,
        PLAN.eval_metrics(),
    output:
        R.under("results/dvc_record.json"),  # beside the .dvc pointers it summarises
    params:
        paths=[R.under(path) for path in DVC_PATHS],
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/provenance/dvc_record.log",
    shell:
        "esrepro dvc-record --paths {params.paths:q} --out {output} > {log} 2>&1"
