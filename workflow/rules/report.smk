# Tables (csv, md, tex) and figures (png, pdf, and the plotted numbers as csv): Tables 1-3 and their figures, the ESSA study's summary, and
# the extras a config asks for in `report.extras` (Figures 3, 5-9 and the math, puzzle, per-task and stability
# tables; the runs they read are listed by esrepro.planning.plan.ExtrasPlan).

from esrepro.planning.plan import PUZZLES, ExtrasPlan, keys_regex
from esrepro.planning.notes import table1_notes, table2_notes, task_table_notes

T1 = CFG.report.table1
CONCISENESS_KL = PLAN.conciseness_kl()
ESSA = PIPELINE.essa_study()
ESSA_INPUTS = PLAN.essa_inputs()
EXTRAS = ExtrasPlan(PLAN)


rule table1_countdown:
    input:
        metrics=PLAN.table1_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(
            f"{R.TABLE1}.csv",
            caption="../report/table1_countdown.rst",
            category="Tables",
            labels={"table": "Table 1", "format": "csv"},
        ),
        f"{R.TABLE1}.md",
        f"{R.TABLE1}.tex",
        f"{R.TABLE1}.metrics.json",
        f"{R.TABLE1}.manifest.json",
    params:
        models=PIPELINE.models,
        notes=note_args(table1_notes(PIPELINE)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/table1_countdown.log",
    shell:
        "esrepro table1 --metrics {input.metrics:q} --published {input.published} --registry {input.registry} "
        f"--models {{params.models:q}} --task {T1.task} --split {T1.split} "
        "{params.notes} --out {params.out} > {log} 2>&1"


rule countdown_curves:
    input:
        PLAN.curve_logs(T1.task, "es"),
    output:
        report(
            f"{R.CURVES}.png",
            caption="../report/countdown_curves.rst",
            category="Figures",
            labels={"figure": "Countdown training curves", "format": "png"},
        ),
        f"{R.CURVES}.pdf",
        f"{R.CURVES}.csv",
        f"{R.CURVES}.manifest.json",
    params:
        logs=lambda w, input: " ".join(f"--log {shlex.quote(x)}" for x in PLAN.labelled_logs(input)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/countdown_curves.log",
    shell:
        "esrepro curves {params.logs} --out {params.out} > {log} 2>&1"


rule table3_rl_hyperparameters:
    input:
        selections=PLAN.all_selections(),
        registry=CFG.registry,
    output:
        report(f"{R.TABLE3}.csv", caption="../report/table3_rl_hyperparameters.rst", category="Tables",
               labels={"table": "Table 3", "format": "csv"}),
        multiext(R.TABLE3, ".md", ".tex", ".manifest.json"),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/table3_rl_hyperparameters.log",
    shell:
        "esrepro table3 --selection {input.selections:q} --registry {input.registry} --out {params.out} > {log} 2>&1"


# --- the conciseness study (studies.conciseness): Table 2 and its figures; its runs use `train`, their KL `kl` ---
rule table2_conciseness:
    input:
        kl=CONCISENESS_KL,
        samples=[p.replace("kl.json", "samples.jsonl") for p in CONCISENESS_KL],
        registry=CFG.registry,
        published=CFG.published,
    output:
        report(f"{R.TABLE2}.csv", caption="../report/table2_conciseness.rst", category="Tables",
               labels={"table": "Table 2", "format": "csv"}),
        multiext(R.TABLE2, ".md", ".tex", ".manifest.json"),
    params:
        cutoff=lambda w: PIPELINE.studies()["conciseness"].reward_cutoff,
        margin=lambda w: PIPELINE.studies()["conciseness"].hacking_margin,
        notes=lambda w: note_args(table2_notes(PIPELINE)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/table2_conciseness.log",
    shell:
        "esrepro table2 --kl {input.kl:q} --registry {input.registry} --published {input.published} "
        "--reward-cutoff={params.cutoff} --hacking-margin={params.margin} {params.notes} --out {params.out} > {log} 2>&1"


# The ES paper's run-to-run evidence (v2 Sec. 4.2): GRPO's reward std over seeds against ES's, from Table 2's runs
rule conciseness_stability:
    input:
        kl=CONCISENESS_KL,
        samples=[p.replace("kl.json", "samples.jsonl") for p in CONCISENESS_KL],
        published=CFG.published,
    output:
        report(f"{R.CONCISENESS_STABILITY}.csv", caption="../report/conciseness_stability.rst", category="Tables",
               labels={"table": "conciseness stability", "format": "csv"}),
        multiext(R.CONCISENESS_STABILITY, ".md", ".tex", ".manifest.json"),
    params:
        cutoff=lambda w: PIPELINE.studies()["conciseness"].reward_cutoff,
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/conciseness_stability.log",
    shell:
        "esrepro conciseness-stability --kl {input.kl:q} --published {input.published} "
        "--reward-cutoff={params.cutoff} --out {params.out} > {log} 2>&1"


rule conciseness_pareto:
    input:
        CONCISENESS_KL,
    output:
        report(f"{R.PARETO}.png", caption="../report/conciseness_pareto.rst", category="Figures",
               labels={"figure": "Figure 1", "format": "png"}),
        multiext(R.PARETO, ".pdf", ".csv", ".manifest.json"),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/conciseness_pareto.log",
    shell:
        "esrepro pareto --kl {input:q} --out {params.out} > {log} 2>&1"


rule conciseness_distribution:
    input:
        kl=CONCISENESS_KL,
        samples=[p.replace("kl.json", "samples.jsonl") for p in CONCISENESS_KL],
    output:
        report(f"{R.DISTRIBUTION}.png", caption="../report/conciseness_distribution.rst", category="Figures",
               labels={"figure": "conciseness reward distributions", "format": "png"}),
        multiext(R.DISTRIBUTION, ".pdf", ".csv", ".manifest.json"),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/conciseness_distribution.log",
    shell:
        "esrepro reward-distribution --kl {input.kl:q} --out {params.out} > {log} 2>&1"


# --- the ESSA study (studies.essa; ESSA paper, arXiv 2507.04453): summary table and figures --------------------
if ESSA is not None:

    rule essa_report:
        input:
            logs=[f"{r}/{P.TRAIN_LOG}" for r in ESSA_INPUTS["runs"]],
            manifests=[f"{r}/{P.MANIFEST}" for r in ESSA_INPUTS["runs"]],
            metrics=ESSA_INPUTS["metrics"],
            published=CFG.published,
            registry=CFG.registry,
        output:
            report(f"{R.ESSA_TABLE}.csv", caption="../report/essa_summary.rst", category="ESSA",
                   labels={"table": "ESSA summary", "format": "csv"}),
            [f"{R.ESSA_TABLE}.{e}" for e in ("md", "manifest.json")],
            [report(f"{stem}.png", caption="../report/essa_figures.rst", category="ESSA",
                    labels={"figure": os.path.basename(stem), "format": "png"}) for stem in PLAN.essa_figures()],
            [f"{stem}.{e}" for stem in PLAN.essa_figures() for e in ("pdf", "csv", "manifest.json")],
        params:
            runs=ESSA_INPUTS["runs"],
            spec=specs.as_json(specs.essa_report_spec(PIPELINE)),
        localrule: True
        conda:
            ENV
        log:
            f"{R.LOGS}/report/essa_report.log",
        shell:
            "esrepro essa-report --runs {params.runs:q} --metrics {input.metrics:q} --published {input.published} "
            "--registry {input.registry} --spec {params.spec:q} > {log} 2>&1"


# --- Figures 8-10: parameter shifts of every ES run against its random walk -----------------------------------------
rule param_shift_histogram:
    input:
        model=f"{R.RUN}/{P.CHECKPOINT}",
        base=R.BASE_MODEL,
        run=f"{R.RUN}/{P.MANIFEST}",
        log=f"{R.RUN}/{P.TRAIN_LOG}",
    output:
        histogram=f"{R.PARAM_SHIFT}/histogram.json",
        manifest=f"{R.PARAM_SHIFT}/{P.MANIFEST}",
    wildcard_constraints:
        method=EXTRAS.shift_methods_regex(),
    params:
        run=lambda w, input: os.path.dirname(input.run),
        device=CFG.device,
        out=folder_of_manifest,
    threads: threads_of("param_shift")
    resources:
        **timed_resources_of("param_shift", "param_shift_histogram"),
    conda:
        ENV
    log:
        f"{R.LOGS}/param_shift/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        "esrepro param-shift-histogram --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --model-dir {input.model} --base-dir {input.base} --run-dir {params.run} "
        "--out {params.out} --threads {threads} --device {params.device} > {log} 2>&1"


rule param_shift_figure:
    input:
        lambda w: EXTRAS.shift_histograms(w.task),
    output:
        report(
            f"{R.PARAM_SHIFT_FIGURE}.png",
            caption="../report/param_shift.rst",
            category="Figures",
            subcategory="Figures 8-10",
            labels={"figure": "parameter shifts", "task": "{task}"},
        ),
        f"{R.PARAM_SHIFT_FIGURE}.pdf",
        f"{R.PARAM_SHIFT_FIGURE}.csv",
        f"{R.PARAM_SHIFT_FIGURE}.manifest.json",
    wildcard_constraints:
        task=keys_regex(EXTRAS.shift_tasks()),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/param_shift_{{task}}.log",
    shell:
        "esrepro param-shift --histogram {input:q} --task {wildcards.task} --sampled-coords 20000 "
        "--out {params.out} > {log} 2>&1"


# --- Figure 6: improvement over the base model ----------------------------------------------------------------------
rule gains:
    input:
        metrics=lambda w: PLAN.task_metrics([w.task]),
        registry=CFG.registry,
    output:
        report(
            f"{R.GAINS}.png",
            caption="../report/gains.rst",
            category="Figures",
            subcategory="Figure 6",
            labels={"figure": "improvement over the base model", "task": "{task}"},
        ),
        f"{R.GAINS}.pdf",
        f"{R.GAINS}.csv",
        f"{R.GAINS}.manifest.json",
    wildcard_constraints:
        task=keys_regex(EXTRAS.gains_tasks()),
    params:
        models=lambda w: PIPELINE.train_models(w.task),
        split=lambda w: PIPELINE.eval_settings(w.task).split,
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/gains_{{task}}.log",
    shell:
        "esrepro gains --metrics {input.metrics:q} --registry {input.registry} --models {params.models:q} "
        "--task {wildcards.task} --split {params.split} --out {params.out} > {log} 2>&1"


# --- Figure 7: test accuracy against training-sample evaluations (periodic evaluation) ------------------------------
rule sample_curves:
    input:
        runs=lambda w: [f"{d}/{P.MANIFEST}" for d in EXTRAS.periodic_runs(w.task)],
        registry=CFG.registry,
    output:
        report(
            f"{R.SAMPLE_CURVES}.png",
            caption="../report/sample_curves.rst",
            category="Figures",
            subcategory="Figure 7",
            labels={"figure": "test accuracy against training samples", "task": "{task}"},
        ),
        f"{R.SAMPLE_CURVES}.pdf",
        f"{R.SAMPLE_CURVES}.csv",
        f"{R.SAMPLE_CURVES}.manifest.json",
    wildcard_constraints:
        task=keys_regex(EXTRAS.curve_tasks()),
    params:
        periodic=lambda w: " ".join(shlex.quote(f"{d}/{P.PERIODIC_EVAL}") for d in EXTRAS.periodic_runs(w.task)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/sample_curves_{{task}}.log",
    shell:
        "esrepro sample-curves --periodic {params.periodic} --registry {input.registry} --task {wildcards.task} "
        "--out {params.out} > {log} 2>&1"


# --- Figures 4-5 (v2 App. A.4): the conciseness GRPO learning-rate x beta sweep -------------------------------------
rule lr_sweep:
    input:
        EXTRAS.lr_sweep_kl(),
    output:
        report(
            f"{R.LR_SWEEP}.png",
            caption="../report/lr_sweep.rst",
            category="Figures",
            subcategory="Figures 4-5",
            labels={"figure": "GRPO learning-rate sweep"},
        ),
        f"{R.LR_SWEEP}.pdf",
        f"{R.LR_SWEEP}.csv",
        f"{R.LR_SWEEP}.manifest.json",
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/conciseness_lr_sweep.log",
    shell:
        "esrepro lr-sweep --kl {input:q} --out {params.out} > {log} 2>&1"


rule lr_distributions:
    input:
        kl=EXTRAS.lr_sweep_kl(),
        samples=[p.replace("kl.json", "samples.jsonl") for p in EXTRAS.lr_sweep_kl()],
    output:
        report(
            f"{R.LR_DISTRIBUTIONS}.png",
            caption="../report/lr_distributions.rst",
            category="Figures",
            subcategory="Figures 4-5",
            labels={"figure": "reward distributions per learning rate"},
        ),
        f"{R.LR_DISTRIBUTIONS}.pdf",
        f"{R.LR_DISTRIBUTIONS}.csv",
        f"{R.LR_DISTRIBUTIONS}.manifest.json",
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/conciseness_lr_distributions.log",
    shell:
        "esrepro lr-distributions --kl {input.kl:q} --out {params.out} > {log} 2>&1"


# --- tables ----------------------------------------------------------------------------------------------------------
rule train_tasks_table:
    input:
        metrics=EXTRAS.train_task_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(
            f"{R.TRAIN_TASKS}.csv",
            caption="../report/train_tasks.rst",
            category="Tables",
            labels={"table": "accuracy per training task", "format": "csv"},
        ),
        f"{R.TRAIN_TASKS}.md",
        f"{R.TRAIN_TASKS}.tex",
        f"{R.TRAIN_TASKS}.manifest.json",
    params:
        sets=flag_args("--set", [f"{s}={t}" for t in CFG.train for s in PIPELINE.eval_sets_of(t)]
                       + preflight.not_run_sets(NOT_RUN)),
        notes=note_args([table1_notes(PIPELINE)[0], *preflight.not_run_notes(NOT_RUN)]),
        not_run=flag_args("--not-run", preflight.not_run_cells(NOT_RUN)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/train_tasks_table.log",
    shell:
        "esrepro train-tasks-table --metrics {input.metrics:q} --published {input.published} "
        "--registry {input.registry} {params.sets} {params.notes} {params.not_run} --out {params.out} > {log} 2>&1"


rule math_table:
    input:
        metrics=EXTRAS.math_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(
            f"{R.MATH_TABLE}.csv",
            caption="../report/math_table.rst",
            category="Tables",
            labels={"table": "math", "format": "csv"},
        ),
        f"{R.MATH_TABLE}.md",
        f"{R.MATH_TABLE}.tex",
        f"{R.MATH_TABLE}.manifest.json",
    params:
        notes=lambda w: note_args(task_table_notes(PIPELINE, EXTRAS.math_sets())),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/math_table.log",
    shell:
        "esrepro math-table --metrics {input.metrics:q} --published {input.published} --registry {input.registry} "
        "{params.notes} --out {params.out} > {log} 2>&1"


# v2 Figure 2: the base model, the released RL checkpoints (evaluated only) and the ES checkpoints per math benchmark,
# beside the paper's values (config/published.yaml, math_v2.figure); a bar this run does not evaluate is left out.
rule math_figure:
    input:
        metrics=EXTRAS.math_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(
            f"{R.MATH_FIGURE}.png",
            caption="../report/math_figure.rst",
            category="Figures",
            labels={"figure": "math (Fig. 2)", "format": "png"},
        ),
        f"{R.MATH_FIGURE}.pdf",
        f"{R.MATH_FIGURE}.csv",
        f"{R.MATH_FIGURE}.manifest.json",
    params:
        model=EXTRAS.math_figure_model() or "",
        title=f"Math reasoning (v2 Fig. 2), {CFG.scale} scale: bars ours, black marks the paper's",
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/math_figure.log",
    shell:
        "esrepro math-figure --metrics {input.metrics:q} --published {input.published} --registry {input.registry} "
        "--model {params.model} --title {params.title:q} --out {params.out} > {log} 2>&1"


rule puzzle_table:
    input:
        metrics=EXTRAS.puzzle_metrics(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(
            f"{R.PUZZLE_TABLE}.csv",
            caption="../report/puzzle_table.rst",
            category="Tables",
            labels={"table": "puzzles", "format": "csv"},
        ),
        f"{R.PUZZLE_TABLE}.md",
        f"{R.PUZZLE_TABLE}.tex",
        f"{R.PUZZLE_TABLE}.manifest.json",
    params:
        notes=lambda w: note_args([*task_table_notes(PIPELINE, EXTRAS.puzzle_tasks()),
                                   *preflight.not_run_notes(NOT_RUN, PUZZLES)]),
        not_run=flag_args("--not-run", preflight.not_run_cells(NOT_RUN, PUZZLES)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/puzzle_table.log",
    shell:
        "esrepro puzzle-table --metrics {input.metrics:q} --published {input.published} --registry {input.registry} "
        "{params.notes} {params.not_run} --out {params.out} > {log} 2>&1"


rule stability_table:
    input:
        metrics=EXTRAS.stability_metrics(),
        registry=CFG.registry,
    output:
        report(
            f"{R.STABILITY}.csv",
            caption="../report/stability.rst",
            category="Tables",
            labels={"table": "stability", "format": "csv"},
        ),
        f"{R.STABILITY}.md",
        f"{R.STABILITY}.tex",
        f"{R.STABILITY}.manifest.json",
    params:
        notes=lambda w: note_args(task_table_notes(PIPELINE, PIPELINE.eval_sets_of(CFG.stability.task))),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/stability_table.log",
    shell:
        "esrepro stability-table --metrics {input.metrics:q} --registry {input.registry} {params.notes} "
        "--out {params.out} > {log} 2>&1"


# Beyond the papers: low-rank ES (EGGROLL) beside full-rank ES on Table 1's task, at equal sample budgets (written
# when Table 1's task trains a method of algorithm eggroll beside ES).
rule es_variants_table:
    input:
        metrics=EXTRAS.es_variant_metrics(),
        registry=CFG.registry,
    output:
        report(
            f"{R.ES_VARIANTS}.csv",
            caption="../report/es_variants.rst",
            category="Tables",
            labels={"table": "ES variants", "format": "csv"},
        ),
        f"{R.ES_VARIANTS}.md",
        f"{R.ES_VARIANTS}.tex",
        f"{R.ES_VARIANTS}.manifest.json",
    params:
        spec=lambda w: specs.as_json(specs.es_variants_spec(PIPELINE)),
        notes=lambda w: note_args(task_table_notes(PIPELINE, [T1.task])),
        out=stem_of,
    conda:
        ENV
    log:
        f"{R.LOGS}/report/es_variants_table.log",
    shell:
        "esrepro es-variants-table --metrics {input.metrics:q} --registry {input.registry} --spec {params.spec:q} "
        "{params.notes} --out {params.out} > {log} 2>&1"


# --- the papers' claims, tested by this run (the headline of `esrepro audit` and the RO-Crate) -----------------------

rule claims:
    input:
        results=CLAIMS.all_files(),
        published=CFG.published,
        registry=CFG.registry,
    output:
        report(f"{R.CLAIMS}.csv", caption="../report/claims.rst", category="Tables",
               labels={"table": "the papers' claims", "format": "csv"}),
        multiext(R.CLAIMS, ".md", ".tex", ".manifest.json"),
        report(f"{R.CLAIMS_FIGURE}.png", caption="../report/claims_margins.rst", category="Figures",
               labels={"figure": "the claims' margins", "format": "png"}),
        multiext(R.CLAIMS_FIGURE, ".pdf", ".csv", ".manifest.json"),
    params:
        results=lambda w: R.under("results"),
        spec=lambda w: specs.as_json(specs.claims_spec(PIPELINE)),
        out=stem_of,
        figure=lambda w, output: os.path.splitext(output[4])[0],
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/report/claims.log",
    shell:
        "esrepro claims --results {params.results} --published {input.published} --registry {input.registry} "
        "--spec {params.spec:q} --inputs {input.results:q} --out {params.out} --figure {params.figure} > {log} 2>&1"


# One claim's row alone (esrepro claim-costs lists each claim's target): `snakemake results/claims/<row>.csv` runs only
# the jobs that decide it.
rule claim:
    input:
        results=lambda w: CLAIMS.files(w.claim),
        published=CFG.published,
        registry=CFG.registry,
    output:
        multiext(R.CLAIM, ".csv", ".md", ".tex", ".manifest.json"),
    wildcard_constraints:
        claim=keys_regex(CLAIMS.rows()),
    params:
        results=lambda w: R.under("results"),
        spec=lambda w: specs.as_json(specs.claims_spec(PIPELINE, [w.claim])),
        out=stem_of,
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/report/claim_{{claim}}.log",
    shell:
        "esrepro claims --results {params.results} --published {input.published} --registry {input.registry} "
        "--spec {params.spec:q} --inputs {input.results:q} --out {params.out} --only {wildcards.claim} > {log} 2>&1"
