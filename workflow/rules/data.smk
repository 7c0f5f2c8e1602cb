# Data preparation: data/prepared/{task}/{split}.jsonl (+ manifest.json). A source that downloads (hub, url, the
# authors' file by url) is prepared by download_data, a local rule: on the submitting host, as compute nodes often
# have no internet (docs/scaling.md, "Before the first job"); generated and local sources by prepare_data.

PREPARE_SHELL = "esrepro prepare-data --task {wildcards.task} --spec {params.spec:q} --out {output} > {log} 2>&1"


rule prepare_data:
    output:
        directory(R.PREPARED),
    wildcard_constraints:
        task=PLAN.prepared_tasks_regex(downloaded=False),
    params:
        spec=lambda w: specs.as_json(specs.data_spec(PIPELINE, w.task)),
    conda:
        ENV
    log:
        f"{R.LOGS}/prepare_data/{{task}}.log",
    shell:
        PREPARE_SHELL


rule download_data:
    output:
        directory(R.PREPARED),
    wildcard_constraints:
        task=PLAN.prepared_tasks_regex(downloaded=True),
    params:
        spec=lambda w: specs.as_json(specs.data_spec(PIPELINE, w.task)),
    localrule: True
    conda:
        ENV
    log:
        f"{R.LOGS}/prepare_data/{{task}}.log",
    shell:
        PREPARE_SHELL
