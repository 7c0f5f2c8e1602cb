# Tables (csv, md, tex) and figures (png, pdf).


rule table1_countdown:
    input:
        metrics=PLAN.table1_metrics(),
        published=config["published"],
        registry=config["registry"],
    output:
        report(
            "results/tables/table1_countdown.csv",
            caption="../report/table1_countdown.rst",
            category="Tables",
            labels={"table": "Table 1", "format": "csv"},
        ),
        "results/tables/table1_countdown.md",
        "results/tables/table1_countdown.tex",
        "results/tables/table1_countdown.metrics.json",
        "results/tables/table1_countdown.manifest.json",
    params:
        models=config["models"],
        task=config["report"]["table1"]["task"],
        split=config["report"]["table1"]["split"],
        notes=PLAN.table1_notes(),
    conda:
        ENV
    log:
        "results/logs/report/table1_countdown.log",
    shell:
        "esrepro table1 --metrics {input.metrics:q} --published {input.published} --registry {input.registry} "
        "--models {params.models:q} --task {params.task} --split {params.split} "
        "{params.notes} --out results/tables/table1_countdown > {log} 2>&1"


rule countdown_curves:
    input:
        PLAN.curve_logs("countdown", "es"),
    output:
        report(
            "results/figures/countdown_curves.png",
            caption="../report/countdown_curves.rst",
            category="Figures",
            labels={"figure": "Countdown training curves", "format": "png"},
        ),
        "results/figures/countdown_curves.pdf",
        "results/figures/countdown_curves.csv",
        "results/figures/countdown_curves.manifest.json",
    params:
        logs=lambda wildcards, input: PLAN.labelled(input, "countdown", "es"),
    conda:
        ENV
    log:
        "results/logs/report/countdown_curves.log",
    shell:
        "esrepro curves {params.logs} --out results/figures/countdown_curves > {log} 2>&1"


rule table3_rl_hyperparameters:
    input:
        selections=PLAN.selections(config["report"]["table1"]["task"]),
        registry=config["registry"],
    output:
        multiext("results/tables/table3_rl_hyperparameters", ".csv", ".md", ".tex", ".manifest.json"),
    conda:
        ENV
    log:
        "results/logs/report/table3_rl_hyperparameters.log",
    shell:
        "esrepro table3 --selection {input.selections:q} --registry {input.registry} "
        "--out results/tables/table3_rl_hyperparameters > {log} 2>&1"
