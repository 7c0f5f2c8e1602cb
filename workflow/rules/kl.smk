# KL(fine-tuned || base) of every run of a task with a `kl` entry, and of the base model (all
# zeros, and the base model's sampled-reward distribution): kl.json, samples.jsonl, manifest.json.


rule kl:
    input:
        model=lambda w: PLAN.kl_model_dir(w.task, w.model, w.method, w.seed),
        base=R.BASE_MODEL,
        data=R.PREPARED,
        run=lambda w: [f"{d}/{P.MANIFEST}" for d in [PLAN.kl_run_dir(w.task, w.model, w.method, w.seed)] if d],
    output:
        kl=f"{R.KL}/kl.json",
        samples=f"{R.KL}/samples.jsonl",
        manifest=f"{R.KL}/{P.MANIFEST}",
    params:
        spec=lambda w: specs.as_json(specs.kl_spec(PIPELINE, w.task)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=lambda w: " ".join(f"--run-dir {d}" for d in [PLAN.kl_run_dir(w.task, w.model, w.method, w.seed)] if d),
        out=folder_of_manifest,
    threads: threads_of("kl")
    resources:
        **timed_resources_of("kl", "kl"),
    conda:
        ENV
    log:
        f"{R.LOGS}/kl/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        "esrepro kl --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --model-dir {input.model} --base-dir {input.base} {params.run} "
        "--dtype {params.dtype} --data-dir {input.data} --spec {params.spec:q} {params.chat} "
        "--out {params.out} --threads {threads} --device {params.device} > {log} 2>&1"
