# Tables (csv, md, tex) and figures (png, pdf).

from esrepro.report.notes import table1_notes

T1 = CFG.report.table1


rule table1_countdown:
    input:
        metrics=PLAN.table1_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(
            f"{P.TABLE1}.csv",
            caption="../report/table1_countdown.rst",
            category="Tables",
            labels={"table": "Table 1", "format": "csv"},
        ),
        f"{P.TABLE1}.md",
        f"{P.TABLE1}.tex",
        f"{P.TABLE1}.metrics.json",
        f"{P.TABLE1}.manifest.json",
    params:
        models=PIPELINE.models,
        notes=note_args(table1_notes(PIPELINE)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{P.LOGS}/report/table1_countdown.log",
    shell:
        "esrepro table1 --metrics {input.metrics:q} --published {input.published} --registry {input.registry} "
        f"--models {{params.models:q}} --task {T1.task} --split {T1.split} "
        "{params.notes} --out {params.out} > {log} 2>&1"


rule countdown_curves:
    input:
        PLAN.curve_logs(T1.task, "es"),
    output:
        report(
            f"{P.CURVES}.png",
            caption="../report/countdown_curves.rst",
            category="Figures",
            labels={"figure": "Countdown training curves", "format": "png"},
        ),
        f"{P.CURVES}.pdf",
        f"{P.CURVES}.csv",
        f"{P.CURVES}.manifest.json",
    params:
        logs=lambda w, input: " ".join(f"--log {shlex.quote(x)}" for x in PLAN.labelled_logs(input)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{P.LOGS}/report/countdown_curves.log",
    shell:
        "esrepro curves {params.logs} --out {params.out} > {log} 2>&1"


rule table3_rl_hyperparameters:
    input:
        selections=PLAN.all_selections(),
        registry=CFG.registry,
    output:
        multiext(P.TABLE3, ".csv", ".md", ".tex", ".manifest.json"),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{P.LOGS}/report/table3_rl_hyperparameters.log",
    shell:
        "esrepro table3 --selection {input.selections:q} --registry {input.registry} --out {params.out} > {log} 2>&1"
