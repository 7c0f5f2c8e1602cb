# KL(fine-tuned || base) of every run of a task with a `kl` entry, and of the base model
# (all zeros, and the base model's sampled-reward distribution): kl.json, samples.jsonl, manifest.json.


rule kl:
    input:
        model=lambda wildcards: PLAN.kl_model_dir(wildcards.task, wildcards.model, wildcards.method, wildcards.seed),
        base="results/models/{model}/base",
        data="data/prepared/{task}",
        run=lambda wildcards: PLAN.kl_run_inputs(wildcards.task, wildcards.model, wildcards.method, wildcards.seed),
    output:
        kl="results/kl/{task}/{model}/{method}/seed{seed}/kl.json",
        samples="results/kl/{task}/{model}/{method}/seed{seed}/samples.jsonl",
        manifest="results/kl/{task}/{model}/{method}/seed{seed}/manifest.json",
    params:
        spec=lambda wildcards: PLAN.kl_spec_json(wildcards.task),
        dtype=lambda wildcards: REGISTRY[wildcards.model]["dtype"],
        chat=lambda wildcards: "--chat" if PLAN.uses_chat(wildcards.model) else "",
        run=lambda wildcards: PLAN.kl_run_arg(wildcards.task, wildcards.model, wildcards.method, wildcards.seed),
        out="results/kl/{task}/{model}/{method}/seed{seed}",
    threads: lambda wildcards: PLAN.threads(wildcards.task, wildcards.method, "kl")
    resources:
        **resources_of("kl"),
    conda:
        ENV
    log:
        "results/logs/kl/{task}/{model}/{method}/seed{seed}.log",
    shell:
        "esrepro kl --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --model-dir {input.model} --base-dir {input.base} {params.run} "
        "--dtype {params.dtype} --data-dir {input.data} --spec {params.spec:q} {params.chat} "
        "--out {params.out} --threads {threads} > {log} 2>&1"
