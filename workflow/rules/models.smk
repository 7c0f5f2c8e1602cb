# Base models: built locally (registry `build`), fetched from the hub (`hub_id`, `revision`) or linked from a folder
# on disk (`path`). fetch_model is a local rule: downloads run on the submitting host, as compute nodes often have no
# internet (docs/scaling.md, "Before the first job"). local_model is one too: it links the folder's files and hashes
# them on the host that validated the folder before any job (docs/models.md). A built model with a pinned build
# (registry `pinned`) is copied from it, each file checked, when the pin was built from the same settings and data;
# verify_models rebuilds it and compares.

from esrepro.planning.plan import keys_regex


rule build_tiny:
    input:
        data=lambda w: PLAN.build_inputs(w.model),
        # its sha256 (in params) decides a rerun, not its folder's modification time (a fresh checkout's is new)
        pinned=lambda w: [ancient(f) for f in PLAN.pinned_inputs(w.model)],
    output:
        directory(R.BASE_MODEL),
    wildcard_constraints:
        model=PLAN.built_models_regex(),
    params:
        spec=lambda w: specs.as_json(specs.model_spec(PIPELINE, w.model)),
        data_spec=lambda w: specs.as_json(specs.build_data_spec(PIPELINE, w.model)),
        exclude=lambda w, input: [f"{d}/{s}.jsonl" for d in input.data for s in ("train", "test")],
        pinned=lambda w: pinned_arg(w.model),
    threads: threads_of("build")
    resources:
        **resources_of("build"),
    conda:
        ENV
    log:
        f"{R.LOGS}/build_tiny/{{model}}.log",
    shell:
        "esrepro build-tiny --model {wildcards.model} --spec {params.spec:q} --data-spec {params.data_spec:q} "
        "--exclude {params.exclude:q} {params.pinned} --out {output} --threads {threads} > {log} 2>&1"


rule verify_build:
    input:
        data=lambda w: PLAN.build_inputs(w.model),
        # its sha256 (in params) decides a rerun, not its folder's modification time (a fresh checkout's is new)
        pinned=lambda w: [ancient(f) for f in PLAN.pinned_inputs(w.model)],
    output:
        R.REBUILD,
    wildcard_constraints:
        model=PLAN.built_models_regex(),
    params:
        spec=lambda w: specs.as_json(specs.model_spec(PIPELINE, w.model)),
        data_spec=lambda w: specs.as_json(specs.build_data_spec(PIPELINE, w.model)),
        exclude=lambda w, input: [f"{d}/{s}.jsonl" for d in input.data for s in ("train", "test")],
        pinned=lambda w: specs.as_json(specs.pinned_spec(PIPELINE, w.model)),
    threads: threads_of("build")
    resources:
        **resources_of("build"),
    conda:
        ENV
    log:
        f"{R.LOGS}/verify_build/{{model}}.log",
    shell:
        "esrepro verify-build --model {wildcards.model} --spec {params.spec:q} --data-spec {params.data_spec:q} "
        "--exclude {params.exclude:q} --pinned {params.pinned:q} --out {output} --threads {threads} > {log} 2>&1"


# Not part of `all`: rebuilds every pinned model of the config from scratch and compares it with its pin.
rule verify_models:
    input:
        PLAN.rebuilds(),


rule fetch_model:
    output:
        directory(R.BASE_MODEL),
    wildcard_constraints:
        model=PLAN.hub_models_regex(),
    params:
        spec=lambda w: specs.as_json(specs.model_spec(PIPELINE, w.model)),
    localrule: True
    resources:
        **timed_resources_of("fetch", "fetch_model"),
    conda:
        ENV
    log:
        f"{R.LOGS}/fetch_model/{{model}}.log",
    shell:
        "esrepro fetch-model --model {wildcards.model} --spec {params.spec:q} --out {output} > {log} 2>&1"


rule local_model:
    output:
        directory(R.BASE_MODEL),
    wildcard_constraints:
        model=keys_regex(PIPELINE.local_models()),
    params:
        spec=lambda w: specs.as_json(specs.model_spec(PIPELINE, w.model)),
    localrule: True
    resources:
        **resources_of("fetch"),
    conda:
        ENV
    log:
        f"{R.LOGS}/local_model/{{model}}.log",
    shell:
        "esrepro local-model --model {wildcards.model} --spec {params.spec:q} --out {output} > {log} 2>&1"
