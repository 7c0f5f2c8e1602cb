# Data preparation: data/prepared/{task}/{split}.jsonl (+ manifest.json).


rule prepare_data:
    output:
        directory(R.PREPARED),
    params:
        spec=lambda w: specs.as_json(specs.data_spec(PIPELINE, w.task)),
    conda:
        ENV
    log:
        f"{R.LOGS}/prepare_data/{{task}}.log",
    shell:
        "esrepro prepare-data --task {wildcards.task} --spec {params.spec:q} --out {output} > {log} 2>&1"
