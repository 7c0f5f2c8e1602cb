# Base models: built locally (registry `build`) or fetched from the hub (`hub_id`, `revision`).


rule build_tiny:
    input:
        data=lambda wildcards: PLAN.build_inputs(wildcards.model),
    output:
        directory("results/models/{model}/base"),
    wildcard_constraints:
        model=PLAN.built_models_regex(),
    params:
        spec=lambda wildcards: PLAN.model_spec_json(wildcards.model),
        data_spec=lambda wildcards: PLAN.build_data_spec_json(wildcards.model),
        exclude=lambda wildcards, input: [f"{d}/{s}.jsonl" for d in input.data for s in ("train", "test")],
    threads: config["threads"]
    resources:
        **resources_of("build"),
    conda:
        ENV
    log:
        "results/logs/build_tiny/{model}.log",
    shell:
        "esrepro build-tiny --model {wildcards.model} --spec {params.spec:q} --data-spec {params.data_spec:q} "
        "--exclude {params.exclude:q} --out {output} --threads {threads} > {log} 2>&1"


rule fetch_model:
    output:
        directory("results/models/{model}/base"),
    wildcard_constraints:
        model=PLAN.hub_models_regex(),
    params:
        spec=lambda wildcards: PLAN.model_spec_json(wildcards.model),
    resources:
        **resources_of("fetch"),
    conda:
        ENV
    log:
        "results/logs/fetch_model/{model}.log",
    shell:
        "esrepro fetch-model --model {wildcards.model} --spec {params.spec:q} --out {output} > {log} 2>&1"
