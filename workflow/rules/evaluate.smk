# Evaluation: greedy generation on a split; metrics.json + responses.jsonl per run. A kept snapshot evaluated as a
# run of its own (train.<task>.snapshots) waits for its run's manifest and is read from the run's checkpoints/.


rule evaluate:
    input:
        model=lambda w: PLAN.checkpoint_input(w.task, w.model, w.method, w.seed),
        data=R.PREPARED,
    output:
        metrics=f"{R.EVAL}/metrics.json",
        responses=f"{R.EVAL}/responses.jsonl",
        manifest=f"{R.EVAL}/{P.MANIFEST}",
    params:
        model_dir=lambda w: PLAN.checkpoint_of(w.task, w.model, w.method, w.seed),
        spec=lambda w: specs.as_json(specs.eval_spec(PIPELINE, w.task)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        out=folder_of_manifest,
    threads: threads_of("evaluate")
    resources:
        **timed_resources_of("evaluate", "evaluate"),
    conda:
        ENV
    log:
        f"{R.LOGS}/evaluate/{{task}}/{{model}}/{{method}}/seed{{seed}}/{{split}}.log",
    shell:
        "esrepro evaluate --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --model-dir {params.model_dir} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} {params.chat} --out {params.out} --threads {threads} --device {params.device} > {log} 2>&1"
