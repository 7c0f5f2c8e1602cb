# Evaluation: greedy generation on a split; metrics.json + responses.jsonl per run.


rule evaluate:
    input:
        model=lambda w: PLAN.checkpoint_of(w.task, w.model, w.method, w.seed),
        data=R.PREPARED,
    output:
        metrics=f"{R.EVAL}/metrics.json",
        responses=f"{R.EVAL}/responses.jsonl",
        manifest=f"{R.EVAL}/{P.MANIFEST}",
    params:
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
        "--seed {wildcards.seed} --model-dir {input.model} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} {params.chat} --out {params.out} --threads {threads} --device {params.device} > {log} 2>&1"
