# The conciseness study (studies.conciseness): its runs use the `train` rule (method names
# like es_sigma0.001, grpo_beta0.01), their KL the `kl` rule; here Table 2 and the figures.


rule table2_conciseness:
    input:
        kl=PLAN.conciseness_kl(),
        registry=config["registry"],
    output:
        multiext("results/tables/table2_conciseness", ".csv", ".md", ".tex", ".manifest.json"),
    params:
        cutoff=lambda wildcards: PLAN.study("conciseness")["reward_cutoff"],
        notes=lambda wildcards: PLAN.conciseness_notes(),
    conda:
        ENV
    log:
        "results/logs/report/table2_conciseness.log",
    shell:
        "esrepro table2 --kl {input.kl:q} --registry {input.registry} --reward-cutoff={params.cutoff} "
        "{params.notes} --out results/tables/table2_conciseness > {log} 2>&1"


rule conciseness_pareto:
    input:
        PLAN.conciseness_kl(),
    output:
        multiext("results/figures/conciseness_pareto", ".png", ".pdf", ".manifest.json"),
    conda:
        ENV
    log:
        "results/logs/report/conciseness_pareto.log",
    shell:
        "esrepro pareto --kl {input:q} --out results/figures/conciseness_pareto > {log} 2>&1"


rule conciseness_distribution:
    input:
        kl=PLAN.conciseness_kl(),
        samples=[p.replace("kl.json", "samples.jsonl") for p in PLAN.conciseness_kl()],
    output:
        multiext("results/figures/conciseness_distribution", ".png", ".pdf", ".manifest.json"),
    conda:
        ENV
    log:
        "results/logs/report/conciseness_distribution.log",
    shell:
        "esrepro reward-distribution --kl {input.kl:q} --out results/figures/conciseness_distribution > {log} 2>&1"
