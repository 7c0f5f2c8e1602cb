# The conciseness study (studies.conciseness): its runs use the `train` rule (method names like
# es_sigma0.001, grpo_beta0.01), their KL the `kl` rule; here Table 2 and the figures.

from esrepro.report.notes import table2_notes

CONCISENESS_KL = PLAN.conciseness_kl()


rule table2_conciseness:
    input:
        kl=CONCISENESS_KL,
        registry=CFG.registry,
    output:
        multiext(P.TABLE2, ".csv", ".md", ".tex", ".manifest.json"),
    params:
        cutoff=lambda w: PIPELINE.studies()["conciseness"].reward_cutoff,
        notes=lambda w: note_args(table2_notes(PIPELINE)),
        out=stem_of,
    conda:
        ENV
    log:
        f"{P.LOGS}/report/table2_conciseness.log",
    shell:
        "esrepro table2 --kl {input.kl:q} --registry {input.registry} --reward-cutoff={params.cutoff} "
        "{params.notes} --out {params.out} > {log} 2>&1"


rule conciseness_pareto:
    input:
        CONCISENESS_KL,
    output:
        multiext(P.PARETO, ".png", ".pdf", ".manifest.json"),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{P.LOGS}/report/conciseness_pareto.log",
    shell:
        "esrepro pareto --kl {input:q} --out {params.out} > {log} 2>&1"


rule conciseness_distribution:
    input:
        kl=CONCISENESS_KL,
        samples=[p.replace("kl.json", "samples.jsonl") for p in CONCISENESS_KL],
    output:
        multiext(P.DISTRIBUTION, ".png", ".pdf", ".manifest.json"),
    params:
        out=stem_of,
    conda:
        ENV
    log:
        f"{P.LOGS}/report/conciseness_distribution.log",
    shell:
        "esrepro reward-distribution --kl {input.kl:q} --out {params.out} > {log} 2>&1"
