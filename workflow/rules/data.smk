# Data preparation: data/prepared/{task}/{split}.jsonl (+ manifest.json).


rule prepare_data:
    output:
        directory("data/prepared/{task}"),
    params:
        spec=lambda wildcards: PLAN.data_spec_json(wildcards.task),
    conda:
        ENV
    log:
        "results/logs/prepare_data/{task}.log",
    shell:
        "esrepro prepare-data --task {wildcards.task} --spec {params.spec:q} --out {output} > {log} 2>&1"
