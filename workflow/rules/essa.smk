# The ESSA study (studies.essa; ESSA paper, arXiv 2507.04453). Its ESSA runs (essa_ref,
# essa_pop<N>, essa_rank<r>, essa_eng<k>, essa_<precision>) use the `train` rule and their test
# evaluations the `evaluate` rule; here the GRPO baseline from the reference run's SFT start,
# and the summary table and figures.

from esrepro.pipeline import ESSA_REF

ESSA = PIPELINE.essa_study()
ESSA_INPUTS = PLAN.essa_inputs()


rule essa_grpo:
    input:
        model=P.BASE_MODEL,
        data=P.PREPARED,
        ref=lambda w: f"{PLAN.essa_ref_run(w.model, w.seed)}/{P.MANIFEST}",
    output:
        **RUN_OUTPUTS,
    wildcard_constraints:
        method=PLAN.essa_grpo_regex(),
    params:
        spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, w.method)),
        ref_spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, ESSA_REF)),
        sft=lambda w: f"{PLAN.essa_ref_run(w.model, w.seed)}/sft",
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=folder_of_manifest,
    threads: threads_of("train")
    resources:
        **resources_of("train"),
    conda:
        ENV
    log:
        f"{P.LOGS}/train/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        "esrepro essa-grpo --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
        "--model-dir {input.model} --sft-dir {params.sft} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} --ref-spec {params.ref_spec:q} {params.chat} --seed {wildcards.seed} "
        "--out {params.run} --threads {threads} --device {params.device} > {log} 2>&1"


if ESSA is not None:

    rule essa_report:
        input:
            logs=[f"{r}/{P.TRAIN_LOG}" for r in ESSA_INPUTS["runs"]],
            manifests=[f"{r}/{P.MANIFEST}" for r in ESSA_INPUTS["runs"]],
            metrics=ESSA_INPUTS["metrics"],
            published=CFG.published,
            registry=CFG.registry,
        output:
            [f"{P.ESSA_TABLE}.{e}" for e in ("csv", "md", "manifest.json")],
            [f"{stem}.{e}" for stem in PLAN.essa_figures() for e in ("png", "pdf", "csv", "manifest.json")],
        params:
            runs=ESSA_INPUTS["runs"],
            spec=specs.as_json(specs.essa_report_spec(PIPELINE)),
        localrule: True
        conda:
            ENV
        log:
            f"{P.LOGS}/report/essa_report.log",
        shell:
            "esrepro essa-report --runs {params.runs:q} --metrics {input.metrics:q} --published {input.published} "
            "--registry {input.registry} --spec {params.spec:q} > {log} 2>&1"
