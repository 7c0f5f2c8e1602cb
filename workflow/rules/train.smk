# Training: one run directory per (task, model, method, seed), the same shape for every method.


rule train:
    input:
        model="results/models/{model}/base",
        data="data/prepared/{task}",
    output:
        checkpoint=directory("results/runs/{task}/{model}/{method}/seed{seed}/checkpoint"),
        log="results/runs/{task}/{model}/{method}/seed{seed}/log.jsonl",
        manifest="results/runs/{task}/{model}/{method}/seed{seed}/manifest.json",
    params:
        spec=lambda wildcards: PLAN.method_spec_json(wildcards.model, wildcards.task, wildcards.method),
        dtype=lambda wildcards: REGISTRY[wildcards.model]["dtype"],
        chat=lambda wildcards: "--chat" if PLAN.uses_chat(wildcards.model) else "",
        run="results/runs/{task}/{model}/{method}/seed{seed}",
    threads: lambda wildcards: PLAN.threads(wildcards.task, wildcards.method)
    resources:
        **resources_of("train"),
    conda:
        ENV
    log:
        "results/logs/train/{task}/{model}/{method}/seed{seed}.log",
    shell:
        "esrepro train --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
        "--model-dir {input.model} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} {params.chat} --seed {wildcards.seed} --out {params.run} --threads {threads} > {log} 2>&1"
