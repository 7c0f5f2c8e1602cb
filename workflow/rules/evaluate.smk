# Evaluation: greedy generation on a split; metrics.json + responses.jsonl per run.


rule evaluate:
    input:
        model=lambda wildcards: PLAN.checkpoint_of(wildcards.task, wildcards.model, wildcards.method, wildcards.seed),
        data="data/prepared/{task}",
    output:
        metrics="results/eval/{task}/{model}/{method}/seed{seed}/{split}/metrics.json",
        responses="results/eval/{task}/{model}/{method}/seed{seed}/{split}/responses.jsonl",
        manifest="results/eval/{task}/{model}/{method}/seed{seed}/{split}/manifest.json",
    params:
        spec=lambda wildcards: PLAN.eval_spec_json(wildcards.task, wildcards.split),
        dtype=lambda wildcards: REGISTRY[wildcards.model]["dtype"],
        chat=lambda wildcards: "--chat" if PLAN.uses_chat(wildcards.model) else "",
        out="results/eval/{task}/{model}/{method}/seed{seed}/{split}",
    threads: config["threads"]
    resources:
        **resources_of("evaluate"),
    conda:
        ENV
    log:
        "results/logs/evaluate/{task}/{model}/{method}/seed{seed}/{split}.log",
    shell:
        "esrepro evaluate --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --model-dir {input.model} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} {params.chat} --out {params.out} --threads {threads} > {log} 2>&1"
